/*
 * gemv-affine.cu — decode GEMV over MLX affine-quantized weights (4 and 8
 * bits) inside the dense GEMV's machinery (gemv.cuh): one launch for q/k/v or
 * gate/up with the GLU, the rmsnorm prologue, the residual add. Other widths
 * and shapes go through affine.cu.
 */
#include "backend/cuda/gemv.cuh"

/* ---------------------------------------------------- MLX affine weights, 4 and 8 bits */

/* A warp streams AFF_RW weight rows side by side (gate/up: one of each), so every activation read
 * serves both; each lane takes whole 16-byte pieces of codes (32 4-bit or 16 8-bit codes, always
 * inside one group: groups are multiples of 32), one scale and bias each, and loads AFF_U pieces of
 * every row before computing any (a 4-bit row of 4096 codes is one such round: the loads of a
 * whole row in flight at once). The activations sit in shared memory (the rmsnorm prologue's
 * output, or a copy), padded so that lanes reading pieces apart hit different banks; a launch
 * takes as many tokens as fit in AFF_XS_MAX floats (more are further launches). Per piece, the
 * association of the other affine kernels: s * sum x*q + b * sum x, in f32, for every token.
 * Measured on the H200 (8B shape, 4-bit, ncu): 4 rows a warp, one piece a lane at a time and the
 * activations read through generic loads stalled on the long scoreboard at every piece (16-31%
 * of issue slots used, 0.6-1.0 TB/s). */
#define AFF_RW 2
#define AFF_U 4

/* byte i of w (a code, 0..255) as a float: the byte under 2^23's exponent, minus 2^23 (exact: a
 * byte permute and an add instead of a quarter-rate integer-to-float conversion) */
__device__ __forceinline__ float aff_byte(uint32_t w, int i) {
    return __uint_as_float(__byte_perm(w, 0x4B000000u, 0x7440u | (unsigned)i)) - 8388608.0f;
}

/* the 32 / BITS codes of one 32-bit word of a packed row, in order */
template <int BITS> __device__ __forceinline__ void aff_word(uint32_t w, float *c) {
    if (BITS == 4) {
        uint32_t lo = w & 0x0F0F0F0Fu, hi = (w >> 4) & 0x0F0F0F0Fu;
#pragma unroll
        for (int i = 0; i < 4; i++) c[2 * i] = aff_byte(lo, i), c[2 * i + 1] = aff_byte(hi, i);
    } else {
#pragma unroll
        for (int i = 0; i < 4; i++) c[i] = aff_byte(w, i);
    }
}

__device__ __forceinline__ uint32_t u4_word(uint4 q, int u) { return u == 0 ? q.x : u == 1 ? q.y : u == 2 ? q.z : q.w; }

/* the codes (16 bytes), scale and bias of piece j of each stream's row (one dtype branch around all
 * the scale loads, so that they issue together) */
template <int S>
__device__ __forceinline__ void aff_load(const uint4 *const *wr, const void *const *scp, const void *const *bip, const size_t *so, int sdt,
                                         int g, int j, uint4 *q, float *sc, float *bi) {
#pragma unroll
    for (int s = 0; s < S; s++) q[s] = ld_stream(wr[s] + j);
    if (sdt == BE_F32) {
#pragma unroll
        for (int s = 0; s < S; s++) sc[s] = ((const float *)scp[s])[so[s] + g], bi[s] = ((const float *)bip[s])[so[s] + g];
    } else {
        unsigned short hs[S], hb[S];
#pragma unroll
        for (int s = 0; s < S; s++) hs[s] = ((const unsigned short *)scp[s])[so[s] + g], hb[s] = ((const unsigned short *)bip[s])[so[s] + g];
#pragma unroll
        for (int s = 0; s < S; s++) {
            if (sdt == BE_BF16) sc[s] = __uint_as_float((uint32_t)hs[s] << 16), bi[s] = __uint_as_float((uint32_t)hb[s] << 16);
            else sc[s] = __half2float(__ushort_as_half(hs[s])), bi[s] = __half2float(__ushort_as_half(hb[s]));
        }
    }
}

/* acc[s][t] += sc[s] * sum x[t]*q + bi[s] * sum x[t] over piece j's codes (x: shared memory, rows xrow apart, xs_index's layout) */
template <int BITS, int N, int S>
__device__ __forceinline__ void aff_piece(const uint4 *q, const float *sc, const float *bi, const float *x, int xrow, int j, float (*acc)[N]) {
    constexpr int V = 128 / BITS, C = 32 / BITS;
    float xsum[N];
#pragma unroll
    for (int t = 0; t < N; t++) xsum[t] = 0.0f;
#pragma unroll
    for (int u = 0; u < 4; u++) {
        float cf[S][C];
#pragma unroll
        for (int s = 0; s < S; s++) aff_word<BITS>(u4_word(q[s], u), cf[s]);
#pragma unroll
        for (int t = 0; t < N; t++) {
            const float4 *xp = (const float4 *)(x + (size_t)t * xrow + xs_index(j * V + u * C, 1));
            float xv[C];
#pragma unroll
            for (int i = 0; i < C / 4; i++) {
                float4 v = xp[i];
                xv[4 * i] = v.x, xv[4 * i + 1] = v.y, xv[4 * i + 2] = v.z, xv[4 * i + 3] = v.w;
            }
            float sx = 0.0f;
#pragma unroll
            for (int i = 0; i < C; i++) sx += xv[i];
            xsum[t] += sx;
#pragma unroll
            for (int s = 0; s < S; s++) {
                float d0 = 0.0f, d1 = 0.0f;   /* two chains */
#pragma unroll
                for (int i = 0; i < C; i += 2) d0 += cf[s][i] * xv[i], d1 += cf[s][i + 1] * xv[i + 1];
                acc[s][t] += sc[s] * (d0 + d1);
            }
        }
    }
#pragma unroll
    for (int s = 0; s < S; s++)
#pragma unroll
        for (int t = 0; t < N; t++) acc[s][t] += bi[s] * xsum[t];
}

template <int BITS, int N, int GLU>
__global__ void __launch_bounds__(GEMV_WARPS * 32, GEMV_BLOCKS_PER_SM) k_gemv_aff(gemv_set st, const float *x, int k) {
    constexpr int V = 128 / BITS, S = AFF_RW, RW = GLU ? 1 : S;   /* codes a piece; streams; rows */
    __shared__ float red[GEMV_WARPS];
    extern __shared__ float xs[];   /* [N][xs_row(k, 1)]: the normed or copied activations */
    int warp = threadIdx.x / 32, lane = threadIdx.x & 31;
    PDL_ENTRY();
    if (st.norm) {
        gemv_norm_prologue<N>(st, x, k, xs, red, 1);
    } else {
        for (int e = threadIdx.x * 4; e < N * k; e += GEMV_WARPS * 32 * 4)
            *(float4 *)(xs + (size_t)(e / k) * xs_row(k, 1) + xs_index(e % k, 1)) = *(const float4 *)(x + e);
        __syncthreads();
    }
    const int nu = k / V, ng = k / st.group, xrow = xs_row(k, 1), rpg = GEMV_WARPS * RW, gsh = st.gshift;
    const size_t rb = (size_t)k * BITS / 8;
    for (int grp = blockIdx.x; grp < st.gend[2]; grp += gridDim.x) {
        int row0, mi = gemv_group(st, grp, rpg, &row0), m = st.m[mi];
        row0 += warp * RW;
        const uint4 *wr[S];
        const void *scp[S], *bip[S];
        size_t so[S];
#pragma unroll
        for (int s = 0; s < S; s++) {   /* a row past the end reads row 0 and is never stored */
            int wi = GLU ? s : mi, r = row0 + s % RW < m ? row0 + s % RW : 0;
            wr[s] = (const uint4 *)((const char *)st.w[wi] + (size_t)r * rb);
            scp[s] = st.sc[wi];
            bip[s] = st.bi[wi];
            so[s] = (size_t)r * ng;
        }
        float acc[S][N];
#pragma unroll
        for (int s = 0; s < S; s++)
#pragma unroll
            for (int t = 0; t < N; t++) acc[s][t] = 0.0f;
        for (int j0 = lane; j0 < nu; j0 += 32 * AFF_U) {
            uint4 q[AFF_U][S];
            float sc[AFF_U][S], bi[AFF_U][S];
#pragma unroll
            for (int p = 0; p < AFF_U; p++) {
                int j = j0 + 32 * p;
                if (j < nu) aff_load<S>(wr, scp, bip, so, st.sdt, (j * V) >> gsh, j, q[p], sc[p], bi[p]);
            }
#pragma unroll
            for (int p = 0; p < AFF_U; p++) {
                int j = j0 + 32 * p;
                if (j < nu) aff_piece<BITS, N, S>(q[p], sc[p], bi[p], xs, xrow, j, acc);
            }
        }
#pragma unroll
        for (int s = 0; s < S; s++) warp_sum<N>(acc[s]);
#pragma unroll
        for (int r = 0; r < RW; r++)
            if (lane == r && row0 + r < m) {
                float a2[2][N];
#pragma unroll
                for (int t = 0; t < N; t++) a2[0][t] = acc[r][t], a2[1][t] = GLU ? acc[1][t] : 0.0f;
                gemv_store<N>(st, mi, row0 + r, m, a2);
            }
    }
}

/* the affine GEMV over the set's matrices (BITS 4 or 8) */
template <int BITS, int N, int GLU>
static void aff_launch(be_ctx *c, dim3 grid, size_t smem, const gemv_set &st, const float *x, int k) {
    if (smem > 48 * 1024 &&
        cu_check(c, cudaFuncSetAttribute(k_gemv_aff<BITS, N, GLU>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem), "gemv smem"))
        return;
    cu_launch(c, k_gemv_aff<BITS, N, GLU>, grid, dim3(GEMV_WARPS * 32), smem, st, x, k);
}

template <int BITS>
static void gemv_aff_n(be_ctx *c, int n, gemv_set st, int count, const float *x, int k) {
    unsigned groups = gemv_groups(&st, count, GEMV_WARPS * (st.glu ? 1 : AFF_RW));
    if (!groups || n <= 0) return;
    unsigned most = (unsigned)c->n_sm * GEMV_BLOCKS_PER_SM;
    dim3 grid(groups < most ? groups : most);
    /* tokens a launch takes: their activations fit in shared memory (the norm prologue's always do) */
    int nc = AFF_XS_MAX / k < n ? AFF_XS_MAX / k : n;
    for (int r0 = 0; r0 < n; r0 += nc) {
        int nt = n - r0 < nc ? n - r0 : nc;
        gemv_set sc = st;
        for (int i = 0; i < 3; i++)
            if (sc.y[i]) sc.y[i] += (size_t)r0 * sc.m[i];
        size_t smem = sizeof(float) * (size_t)nt * xs_row(k, 1);
        const float *xc = x + (size_t)r0 * k;
        switch (nt) {
#define CASE(N)                                                                \
    case N:                                                                    \
        if (sc.glu) aff_launch<BITS, N, 1>(c, grid, smem, sc, xc, k);          \
        else aff_launch<BITS, N, 0>(c, grid, smem, sc, xc, k);                 \
        break;
            CASE(1) CASE(2) CASE(3) CASE(4) CASE(5) CASE(6) CASE(7) CASE(8)
#undef CASE
        }
    }
}

/* ---------------------------------------------------- on the tensor cores (groups of 64 and 128) */

/* The CUDA-core kernel above spends ~4 instructions a code (the code to a float, its product, the
 * x sums) and at 4 bits cannot read faster than ~1.6 TB/s. Here the codes become exact f16 values
 * two at a time (a mask into 1024's exponent, one packed subtract: ~1.1 instructions a code) and
 * an mma.sync m16n8k16 forms the products: A = 16 weight rows x 16 codes, B = 16 activations x 8
 * columns, two columns a token: x' = x / 2^e (e per token, so that max |x'| is in [2^14, 2^15))
 * split into f16 x'_hi and x'_lo = x' - x'_hi (22 significant bits), products exact, f32 sums.
 * Each MMA's 16 codes lie in one group (k order inside a group is free: a lane's run of group/4
 * codes feeds the k slots the lane owns, and the B fragments, built once a block in shared
 * memory, follow the same order), so a group's MMAs sum into a fresh accumulator and the group's
 * scale and bias apply after: per group s * sum x'q + b * sum x', times 2^e at the end. A block
 * takes 16 rows (gate/up: 16 of each) at a time, its 8 warps each a slice of the groups, the
 * slices summed in shared memory. Up to AFT_TOK tokens a launch (8 columns); more are further
 * launches. */
#define AFT_TOK 4
#define AFT_SMEM_MAX (100 * 1024)  /* shared memory a launch may take (2 blocks a multiprocessor) */

/* the index in a lane's run (group/4 codes) of the first code of f16 pair p; the second is 4 (4-bit) or 2 (8-bit) further */
template <int BITS> __host__ __device__ constexpr int aft_i0(int p) { return BITS == 4 ? 8 * (p / 4) + p % 4 : 4 * (p / 2) + p % 2; }

__device__ __forceinline__ uint32_t h2_bits(__half2 h) { return *(const uint32_t *)&h; }
__device__ __forceinline__ __half2 bits_h2(uint32_t u) { return *(const __half2 *)&u; }

/* pair p of a lane's run (words w) as two exact f16 values: the codes under 1024's exponent, minus 1024
 * (a code 4 bits up: 1024 + 16c, times 1/16 minus 64) */
template <int BITS> __device__ __forceinline__ uint32_t aft_pair(const uint32_t *w, int p) {
    if (BITS == 4) {
        uint32_t v = w[p / 4] >> (p % 4 >= 2 ? 8 : 0);
        if (p % 2)
            return h2_bits(__hfma2(bits_h2((v & 0x00F000F0u) | 0x64006400u), __floats2half2_rn(0.0625f, 0.0625f), __floats2half2_rn(-64.f, -64.f)));
        return h2_bits(__hsub2(bits_h2((v & 0x000F000Fu) | 0x64006400u), __floats2half2_rn(1024.f, 1024.f)));
    }
    uint32_t v = w[p / 2] >> (p % 2 ? 8 : 0);
    return h2_bits(__hsub2(bits_h2((v & 0x00FF00FFu) | 0x64006400u), __floats2half2_rn(1024.f, 1024.f)));
}

/* RW 32-bit words at p (RW * 4-byte aligned), streamed past L1 */
template <int RW> __device__ __forceinline__ void aft_ld(const uint32_t *p, uint32_t *w) {
    if (RW == 2) {
        asm("ld.global.nc.L1::no_allocate.v2.u32 {%0,%1}, [%2];" : "=r"(w[0]), "=r"(w[1]) : "l"(p));
    } else {
#pragma unroll
        for (int i = 0; i < RW; i += 4) {
            uint4 v = ld_stream((const uint4 *)(p + i));
            w[i] = v.x, w[i + 1] = v.y, w[i + 2] = v.z, w[i + 3] = v.w;
        }
    }
}

__device__ __forceinline__ void aft_mma(float *c, uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint2 b) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b.x), "r"(b.y));
}

/* shared memory of a launch: [N][xs_row(k, 1)] normed activations (with a norm), the B fragments
 * [k/16][2N][4] (8 bytes each), the scaled group sums [N][k/GSZ] */
static size_t aft_smem(int n, int k, int gsz, int norm) {
    return (norm ? sizeof(float) * (size_t)n * xs_row(k, 1) : 0) + (size_t)k * n * 4 + sizeof(float) * (size_t)n * (k / gsz);
}

template <int BITS, int GSZ, int N, int GLU>
__global__ void __launch_bounds__(GEMV_WARPS * 32, GEMV_BLOCKS_PER_SM) k_gemv_aft(gemv_set st, const float *x, int k) {
    constexpr int T = GLU ? 2 : 1;             /* 16-row tiles a block computes at a time: the rows, or gate's and up's */
    constexpr int RW = GSZ * BITS / 128;       /* 32-bit words of a lane's run of GSZ/4 codes */
    constexpr int TPG = GSZ / 16;              /* MMAs (k16 steps) a group */
    constexpr int CH = 32 / (T * 2 * RW) > 4 ? 4 : 32 / (T * 2 * RW);   /* groups whose codes a lane loads at once (32 words) */
    extern __shared__ __align__(16) unsigned char sm[];
    __shared__ float red[GEMV_WARPS], scl[N];
    __shared__ float part[GEMV_WARPS][T][16][N];
    const int warp = threadIdx.x / 32, lane = threadIdx.x & 31, g = lane / 4, q = lane % 4, ng = k / GSZ;
    float *xs = (float *)sm;
    uint2 *bs = (uint2 *)(sm + (st.norm ? sizeof(float) * N * xs_row(k, 1) : 0));
    float *xsum = (float *)(bs + (size_t)k * N / 2);
    PDL_ENTRY();
    const float *src = x;
    int pad = 0;
    if (st.norm) {
        gemv_norm_prologue<N>(st, x, k, xs, red, 1);
        src = xs;
        pad = 1;
    }
    const int xr = xs_row(k, pad);
    for (int t = 0; t < N; t++) {   /* scl[t] = 2^e: max |x_t| / 2^e in [2^14, 2^15) */
        float mx = 0.0f;
        for (int i = threadIdx.x * 4; i < k; i += GEMV_WARPS * 32 * 4) {
            float4 v = *(const float4 *)(src + (size_t)t * xr + xs_index(i, pad));
            mx = fmaxf(mx, fmaxf(fmaxf(fabsf(v.x), fabsf(v.y)), fmaxf(fabsf(v.z), fabsf(v.w))));
        }
#pragma unroll
        for (int o = 16; o; o >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
        if (lane == 0) red[warp] = mx;
        __syncthreads();
        if (threadIdx.x == 0) {
            for (int w = 1; w < GEMV_WARPS; w++) mx = fmaxf(mx, red[w]);
            scl[t] = mx > 0.0f && isfinite(mx) ? ldexpf(1.0f, ilogbf(mx) - 14) : 1.0f;
        }
        __syncthreads();
    }
    for (int e = threadIdx.x; e < k * N / 2; e += GEMV_WARPS * 32) {   /* B fragments: [k/16][2N][4] */
        int qq = e % 4, col = (e / 4) % (2 * N), step = e / (8 * N), G = step / TPG, tau = step % TPG, t = col / 2;
        const float *xt = src + (size_t)t * xr;
        float inv = 1.0f / scl[t];
        int base = G * GSZ + qq * (GSZ / 4), d = BITS == 4 ? 4 : 2, i0 = aft_i0<BITS>(2 * tau), i1 = aft_i0<BITS>(2 * tau + 1);
        float v[4] = {xt[xs_index(base + i0, pad)], xt[xs_index(base + i0 + d, pad)], xt[xs_index(base + i1, pad)],
                      xt[xs_index(base + i1 + d, pad)]};
        __half h[4];
#pragma unroll
        for (int j = 0; j < 4; j++) {
            float xv = v[j] * inv;
            __half hi = __float2half_rn(xv);
            h[j] = col % 2 ? __float2half_rn(xv - __half2float(hi)) : hi;
        }
        bs[e] = make_uint2(h2_bits(__halves2half2(h[0], h[1])), h2_bits(__halves2half2(h[2], h[3])));
    }
    for (int e = threadIdx.x; e < N * ng; e += GEMV_WARPS * 32) {   /* the groups' sums of x', [N][ng] */
        int t = e / ng, G = e % ng;
        const float *xt = src + (size_t)t * xr;
        float sum = 0.0f;
        for (int i = 0; i < GSZ; i += 4) {
            float4 v = *(const float4 *)(xt + xs_index(G * GSZ + i, pad));
            sum += (v.x + v.y) + (v.z + v.w);
        }
        xsum[e] = sum / scl[t];
    }
    __syncthreads();
    const int gpw = ng / GEMV_WARPS, g0 = warp * gpw;   /* this warp's slice of the groups */
    const size_t rb = (size_t)k * BITS / 8;
    for (int tile = blockIdx.x; tile < st.gend[2]; tile += gridDim.x) {
        int row0, mi = gemv_group(st, tile, 16, &row0), m = st.m[mi];
        const uint32_t *wr[T][2];
        const void *scp[T], *bip[T];
        size_t so[T][2];
#pragma unroll
        for (int tt = 0; tt < T; tt++) {
            int wi = GLU ? tt : mi;
            scp[tt] = st.sc[wi];
            bip[tt] = st.bi[wi];
#pragma unroll
            for (int h = 0; h < 2; h++) {   /* rows g and g + 8 of the tile; one past the end reads row 0, never stored */
                int r = row0 + g + 8 * h < m ? row0 + g + 8 * h : 0;
                wr[tt][h] = (const uint32_t *)((const char *)st.w[wi] + (size_t)r * rb) + q * RW;
                so[tt][h] = (size_t)r * ng;
            }
        }
        float acc[T][2];
#pragma unroll
        for (int tt = 0; tt < T; tt++) acc[tt][0] = acc[tt][1] = 0.0f;
        for (int c0 = 0; c0 < gpw; c0 += CH) {
            uint32_t wv[CH][T][2][RW];
            float sc[CH][T][2], bi[CH][T][2];
#pragma unroll
            for (int c = 0; c < CH; c++) {
                if (c0 + c >= gpw) break;
                int G = g0 + c0 + c;
#pragma unroll
                for (int tt = 0; tt < T; tt++)
#pragma unroll
                    for (int h = 0; h < 2; h++) {
                        aft_ld<RW>(wr[tt][h] + (size_t)G * 4 * RW, wv[c][tt][h]);
                        sc[c][tt][h] = cu_mat_get(scp[tt], st.sdt, so[tt][h] + G);
                        bi[c][tt][h] = cu_mat_get(bip[tt], st.sdt, so[tt][h] + G);
                    }
            }
#pragma unroll
            for (int c = 0; c < CH; c++) {
                if (c0 + c >= gpw) break;
                int G = g0 + c0 + c;
                float xg = q < N ? xsum[q * ng + G] : 0.0f;
                float cc[T][4];
#pragma unroll
                for (int tt = 0; tt < T; tt++) cc[tt][0] = cc[tt][1] = cc[tt][2] = cc[tt][3] = 0.0f;
#pragma unroll
                for (int tau = 0; tau < TPG; tau++) {
                    uint2 b = g < 2 * N ? bs[((size_t)(G * TPG + tau) * 2 * N + g) * 4 + q] : make_uint2(0u, 0u);
#pragma unroll
                    for (int tt = 0; tt < T; tt++)
                        aft_mma(cc[tt], aft_pair<BITS>(wv[c][tt][0], 2 * tau), aft_pair<BITS>(wv[c][tt][1], 2 * tau),
                                aft_pair<BITS>(wv[c][tt][0], 2 * tau + 1), aft_pair<BITS>(wv[c][tt][1], 2 * tau + 1), b);
                }
#pragma unroll
                for (int tt = 0; tt < T; tt++) {   /* token q: its high and low columns */
                    acc[tt][0] += sc[c][tt][0] * (cc[tt][0] + cc[tt][1]) + bi[c][tt][0] * xg;
                    acc[tt][1] += sc[c][tt][1] * (cc[tt][2] + cc[tt][3]) + bi[c][tt][1] * xg;
                }
            }
        }
        if (q < N)
#pragma unroll
            for (int tt = 0; tt < T; tt++) part[warp][tt][g][q] = acc[tt][0], part[warp][tt][g + 8][q] = acc[tt][1];
        __syncthreads();
        if (threadIdx.x < 16 && row0 + (int)threadIdx.x < m) {
            float a2[2][N];
#pragma unroll
            for (int t = 0; t < N; t++) {
                float v[2] = {0.0f, 0.0f};
#pragma unroll
                for (int tt = 0; tt < T; tt++)
                    for (int w = 0; w < GEMV_WARPS; w++) v[tt] += part[w][tt][threadIdx.x][t];
                a2[0][t] = v[0] * scl[t], a2[1][t] = v[1] * scl[t];
            }
            gemv_store<N>(st, mi, row0 + threadIdx.x, m, a2);
        }
        __syncthreads();
    }
}

template <int BITS, int GSZ, int N, int GLU>
static void aft_launch(be_ctx *c, dim3 grid, size_t smem, const gemv_set &st, const float *x, int k) {
    if (smem > 48 * 1024 &&
        cu_check(c, cudaFuncSetAttribute(k_gemv_aft<BITS, GSZ, N, GLU>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem), "gemv smem"))
        return;
    cu_launch(c, k_gemv_aft<BITS, GSZ, N, GLU>, grid, dim3(GEMV_WARPS * 32), smem, st, x, k);
}

/* the tensor-core GEMV over the set, in launches of at most AFT_TOK tokens that fit AFT_SMEM_MAX; 0 when it
 * does not take these matrices (group size, a group count that does not split over the warps, too many columns) */
template <int BITS, int GSZ>
static int gemv_aft_n(be_ctx *c, int n, gemv_set st, int count, const float *x, int k) {
    int nc = AFT_TOK;
    while (nc > 1 && aft_smem(nc, k, GSZ, st.norm != NULL) > AFT_SMEM_MAX) nc--;
    if (k % (GSZ * GEMV_WARPS) || aft_smem(1, k, GSZ, st.norm != NULL) > AFT_SMEM_MAX) return 0;
    unsigned tiles = gemv_groups(&st, count, 16);
    if (!tiles || n <= 0) return 1;
    unsigned most = (unsigned)c->n_sm * GEMV_BLOCKS_PER_SM;
    dim3 grid(tiles < most ? tiles : most);
    for (int r0 = 0; r0 < n; r0 += nc) {
        int nt = n - r0 < nc ? n - r0 : nc;
        gemv_set sc = st;
        for (int i = 0; i < 3; i++)
            if (sc.y[i]) sc.y[i] += (size_t)r0 * sc.m[i];
        size_t smem = aft_smem(nt, k, GSZ, st.norm != NULL);
        const float *xc = x + (size_t)r0 * k;
        switch (nt) {
#define CASE(N)                                                                \
    case N:                                                                    \
        if (sc.glu) aft_launch<BITS, GSZ, N, 1>(c, grid, smem, sc, xc, k);     \
        else aft_launch<BITS, GSZ, N, 0>(c, grid, smem, sc, xc, k);            \
        break;
            CASE(1) CASE(2) CASE(3) CASE(4)
#undef CASE
        }
    }
    return 1;
}

void cu_gemv_affine(be_ctx *c, int n, int dt, gemv_set st, int count, const float *x, int k) {
    if (c->aff_gemv != 2 && n <= GEMV_MAX_N) {   /* CINFER_CUDA_AFF_GEMV=2: the CUDA-core kernel (A/B) */
        int done = dt == BE_Q4 ? (st.group == 64 ? gemv_aft_n<4, 64>(c, n, st, count, x, k) : st.group == 128 ? gemv_aft_n<4, 128>(c, n, st, count, x, k) : 0)
                               : (st.group == 64 ? gemv_aft_n<8, 64>(c, n, st, count, x, k) : st.group == 128 ? gemv_aft_n<8, 128>(c, n, st, count, x, k) : 0);
        if (done) return;
    }
    if (dt == BE_Q4) gemv_aff_n<4>(c, n, st, count, x, k);
    else gemv_aff_n<8>(c, n, st, count, x, k);
}
