/*
 * gemv-affine.cu — decode GEMV over MLX affine-quantized weights (4 and 8
 * bits) inside the dense GEMV's machinery (gemv.cuh): one launch for q/k/v or
 * gate/up with the GLU, the rmsnorm prologue, the residual add. Other widths
 * and shapes go through affine.cu.
 */
#include "backend/cuda/gemv.cuh"
#include "backend/cuda/mma.cuh"

/* ---------------------------------------------------- MLX affine weights, 4 and 8 bits */

/* A warp streams AFF_RW weight rows side by side (gate/up: one of each), so every activation read
 * serves both; each lane takes whole 16-byte pieces of codes (32 4-bit or 16 8-bit codes, always
 * inside one group: groups are multiples of 32), one scale and bias each, and loads AFF_U pieces of
 * every row before computing any (a 4-bit row of 4096 codes is one such round: the loads of a
 * whole row in flight at once). The activations sit in shared memory (the rmsnorm prologue's
 * output, or a copy), padded so that lanes reading pieces apart hit different banks, beside each
 * piece's sum of x (computed once a block, not once a row); a launch
 * takes as many tokens as fit in AFF_XS_MAX floats (more are further launches). Per piece, the
 * association of the other affine kernels: s * sum x*q + b * sum x, in f32, for every token.
 * Measured on the H200 (8B shape, 4-bit, ncu): 4 rows a warp, one piece a lane at a time and the
 * activations read through generic loads stalled on the long scoreboard at every piece (16-31%
 * of issue slots used, 0.6-1.0 TB/s). A tensor-core form (commit c7575e5: codes to exact f16
 * pairs, x split into f16 high and low halves, mma.sync per 16 codes of a group, 16-row tiles with
 * the groups split over the block's warps and summed in shared memory) was correct and slower:
 * 8B 4-bit step 4.78 ms against this kernel's 3.27 (its per-tile barriers and B-fragment prologue
 * left it latency-bound, 13-24% of DRAM bandwidth); removed. */
#define AFF_RW 2
#define AFF_U 4   /* 2 pieces with 3 blocks an SM (80 registers): 8B steps 3% faster, 1B 7-10% slower (H200 A/B); not kept */

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

/* acc[s][t] += sc[s] * sum x[t]*q + bi[s] * sum x[t] over piece j's codes (x: shared memory, rows xrow apart,
 * xs_index's layout; xp: the pieces' sums of x, rows nu apart) */
template <int BITS, int N, int S>
__device__ __forceinline__ void aff_piece(const uint4 *q, const float *sc, const float *bi, const float *x, int xrow, const float *xp, int nu,
                                          int j, float (*acc)[N]) {
    constexpr int V = 128 / BITS, C = 32 / BITS;
#pragma unroll
    for (int u = 0; u < 4; u++) {
        float cf[S][C];
#pragma unroll
        for (int s = 0; s < S; s++) aff_word<BITS>(u4_word(q[s], u), cf[s]);
#pragma unroll
        for (int t = 0; t < N; t++) {
            const float4 *xv4 = (const float4 *)(x + (size_t)t * xrow + xs_index(j * V + u * C, 1));
            float xv[C];
#pragma unroll
            for (int i = 0; i < C / 4; i++) {
                float4 v = xv4[i];
                xv[4 * i] = v.x, xv[4 * i + 1] = v.y, xv[4 * i + 2] = v.z, xv[4 * i + 3] = v.w;
            }
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
    for (int t = 0; t < N; t++) {
        float xsum = xp[t * nu + j];
#pragma unroll
        for (int s = 0; s < S; s++) acc[s][t] += bi[s] * xsum;
    }
}

/* One token's 4-bit rows in integers (DP): each piece's 32 x values as 24-bit fixed point, the method of
 * the CPU's gemv-affine-vnni.c. The piece's largest |x| = m gets the smallest power of two d with
 * m / d <= 127; X_i = round(x_i 2^16 / d) (exact scaling, one rounding: within 2^-23 m), held as three
 * signed bytes X = 2^16 x0 + 2^8 x1 + x2, so a row's 32 codes c meet them in 6 dp4a a word of 8 codes
 * (low nibbles: codes 0, 2, 4, 6; high: 1, 3, 5, 7), summed exactly in int32 (|c.x0| <= 32 * 15 * 128);
 * F = (c.x0 2^8 + c.x1) 2^8 + c.x2 in f32 (the first sum exact below 2^24, one rounding), then
 * s * (d / 2^16) * F + b * sum x per piece, as the kernel's f32 form. About 1.4 instructions a code
 * against its ~3.5. A piece's digits sit in shared memory as 24 words [digit][word][low, high] and
 * then d / 2^16, AFF_DPW words a piece (lanes reading 16 bytes of consecutive pieces hit
 * different banks), written over x (36 floats a piece in xs_index's layout) once every thread has read
 * its pieces. The default for one token (CINFER_CUDA_AFF_DP=0: the f32 forms): measured on the H200 (8B
 * shape, A/B in one process against the tensor-core form, the same greedy tokens) 2.788 against 3.063 ms
 * a step, on an H100 3.042 against 3.222; test-backend-ops' affine cases on the device pass with it.
 * k_gemv_aff_ring (below) runs the same arithmetic with its weights streamed, where it takes the set. */
#define AFF_DPW 28
__device__ __forceinline__ void aff_dp_make(const float *v, uint32_t *o) {
    float m = 0.0f;   /* max |x|, NaN when one is (max.NaN), Inf when one is */
#pragma unroll
    for (int i = 0; i < 32; i++) asm("max.NaN.f32 %0, %0, %1;" : "+f"(m) : "f"(fabsf(v[i])));
    const bool bad = !(m <= 3.402823466e38f);
    int E;
    frexpf(m, &E);
    int e = ldexpf(m, 7 - E) <= 127.0f ? E - 7 : E - 6;
    e = e < -100 ? -100 : e;   /* (|x| below 2^-93: 2^(16 - e) stays finite; such values round to 0) */
    const float sc = bad || m == 0.0f ? 0.0f : ldexpf(1.0f, 16 - e);
    /* |X| <= 127 2^16, so X = 2^16 d0 + 2^8 d1 + d2 in signed digits is X + 0x808080 in unsigned bytes d + 128
     * (no carries): each digit is a byte of that sum with its top bit flipped; bytes gathered by byte permutes */
#pragma unroll
    for (int u = 0; u < 4; u++)
#pragma unroll
        for (int h = 0; h < 2; h++) {
            uint32_t V[4];
#pragma unroll
            for (int i = 0; i < 4; i++) V[i] = (uint32_t)__float2int_rn(v[8 * u + 2 * i + h] * sc) + 0x808080u;
            const uint32_t a = __byte_perm(V[0], V[1], 0x5140), b = __byte_perm(V[2], V[3], 0x5140);   /* bytes 0 and 1 */
            const uint32_t c = __byte_perm(V[0], V[1], 0x0062), d = __byte_perm(V[2], V[3], 0x0062);   /* bytes 2 */
            o[0 * 8 + 2 * u + h] = __byte_perm(c, d, 0x5410) ^ 0x80808080u;
            o[1 * 8 + 2 * u + h] = __byte_perm(a, b, 0x7632) ^ 0x80808080u;
            o[2 * 8 + 2 * u + h] = __byte_perm(a, b, 0x5410) ^ 0x80808080u;
        }
    ((float *)o)[24] = bad ? __int_as_float(0x7fc00000) : m == 0.0f ? 0.0f : ldexpf(1.0f, e - 16);
}

/* acc[s] += sc[s] * (d / 2^16) * sum c X + bi[s] * sum x over piece j (one token; dg: the pieces' digits) */
template <int S>
__device__ __forceinline__ void aff_dp_piece(const uint4 *q, const float *sc, const float *bi, const uint32_t *dg, const float *xp, int j,
                                             float (*acc)[1]) {
    const uint4 *d4 = (const uint4 *)(dg + (size_t)j * AFF_DPW);
    uint4 dd[7];
#pragma unroll
    for (int i = 0; i < 7; i++) dd[i] = d4[i];
    const float dscale = __uint_as_float(dd[6].x);   /* d / 2^16 (NaN: a NaN or Inf in the piece) */
#pragma unroll
    for (int s = 0; s < S; s++) {
        int S0 = 0, S1 = 0, S2 = 0;
#pragma unroll
        for (int u = 0; u < 4; u++) {
            const uint32_t w = u4_word(q[s], u), lo = w & 0x0F0F0F0Fu, hi = (w >> 4) & 0x0F0F0F0Fu;
            const uint4 a0 = dd[u >> 1], a1 = dd[2 + (u >> 1)], a2 = dd[4 + (u >> 1)];
            const int l0 = (int)((u & 1) ? a0.z : a0.x), h0 = (int)((u & 1) ? a0.w : a0.y);
            const int l1 = (int)((u & 1) ? a1.z : a1.x), h1 = (int)((u & 1) ? a1.w : a1.y);
            const int l2 = (int)((u & 1) ? a2.z : a2.x), h2 = (int)((u & 1) ? a2.w : a2.y);
            S0 = __dp4a((int)lo, l0, S0); S0 = __dp4a((int)hi, h0, S0);
            S1 = __dp4a((int)lo, l1, S1); S1 = __dp4a((int)hi, h1, S1);
            S2 = __dp4a((int)lo, l2, S2); S2 = __dp4a((int)hi, h2, S2);
        }
        const float F = fmaf((float)(S0 * 256 + S1), 256.0f, (float)S2);
        acc[s][0] = fmaf(sc[s] * dscale, F, acc[s][0]);
    }
    const float xsum = xp[j];
#pragma unroll
    for (int s = 0; s < S; s++) acc[s][0] += bi[s] * xsum;
}

/* xs[t] = the N tokens' activations (the rmsnorm prologue's output, or a copy) in xs_index's layout, rows xs_row apart.
 * The copy issues every 16-byte load of a thread (N k <= AFF_XS_MAX: at most XA of them) before its first store, so
 * that x costs one L2 round trip after the wait; the loop it replaces (st.xa == 0, CINFER_CUDA_X_AHEAD=0) compiled
 * to one round trip per load for its first (trips % 4) loads, then four a round: k 14336 (the 8B shape's down
 * projection, 7 loads a thread in 16-warp blocks) four round trips, k 4096 two. */
template <int N, int W = GEMV_WARPS> __device__ __forceinline__ void aff_x_in(const gemv_set &st, const float *x, int k, float *xs, float *red, const float4 *nw) {
    if (st.norm) {
        gemv_norm_prologue<N, W>(st, x, k, xs, red, 1, nw);
        return;
    }
    constexpr int XA = AFF_XS_MAX / 4 / (W * 32);
    if (st.xa) {
        float4 v[XA];
#pragma unroll
        for (int u = 0; u < XA; u++) {
            const int e = (threadIdx.x + u * W * 32) * 4;
            if (e < N * k) v[u] = *(const float4 *)(x + e);
        }
#pragma unroll
        for (int u = 0; u < XA; u++) {
            const int e = (threadIdx.x + u * W * 32) * 4;
            const int t = N == 1 ? 0 : e / k;   /* (a division by k: ~25 instructions, on the path of every block) */
            if (e < N * k) *(float4 *)(xs + (size_t)t * xs_row(k, 1) + xs_index(e - t * k, 1)) = v[u];
        }
    } else {
        for (int e = threadIdx.x * 4; e < N * k; e += W * 32 * 4)
            *(float4 *)(xs + (size_t)(e / k) * xs_row(k, 1) + xs_index(e % k, 1)) = *(const float4 *)(x + e);
    }
    __syncthreads();
}

/* one token's x (xs, xs_index's layout, k = 32 nu) -> each piece's sum of x (xp) and its digits over x (AFF_DPW
 * words a piece); the caller's barrier follows. k <= AFF_XS_MAX: at most DPP pieces a thread */
template <int W = GEMV_WARPS> __device__ __forceinline__ void aff_dp_digits(float *xs, int nu, float *xp) {
    constexpr int DPP = AFF_XS_MAX / 32 / (W * 32);
    float v[DPP][32];
#pragma unroll
    for (int p = 0; p < DPP; p++) {
        const int e = threadIdx.x + p * W * 32;
        if (e >= nu) break;
        const float4 *v4 = (const float4 *)(xs + xs_index(e * 32, 1));
        float sum = 0.0f;
#pragma unroll
        for (int i = 0; i < 8; i++) {
            const float4 t = v4[i];
            sum += (t.x + t.y) + (t.z + t.w);
            v[p][4 * i] = t.x, v[p][4 * i + 1] = t.y, v[p][4 * i + 2] = t.z, v[p][4 * i + 3] = t.w;
        }
        xp[e] = sum;
    }
    __syncthreads();   /* every thread holds its pieces: the digits go over x */
#pragma unroll
    for (int p = 0; p < DPP; p++) {
        const int e = threadIdx.x + p * W * 32;
        if (e < nu) aff_dp_make(v[p], (uint32_t *)xs + (size_t)e * AFF_DPW);
    }
}

template <int BITS, int N, int GLU, int DP = 0>
__global__ void __launch_bounds__(GEMV_WARPS * 32, GEMV_BLOCKS_PER_SM) k_gemv_aff(gemv_set st, const float *x, int k) {
    constexpr int V = 128 / BITS, S = AFF_RW, RW = GLU ? 1 : S;   /* codes a piece; streams; rows */
    __shared__ float red[GEMV_WARPS];
    extern __shared__ float xs[];   /* [N][xs_row(k, 1)]: the normed or copied activations; then [N][k/V] their pieces' sums */
    int warp = threadIdx.x / 32, lane = threadIdx.x & 31;
    float4 nw[GEMV_NORM_PER];
    gemv_before_wait(st, k, nw);
    PDL_ENTRY();
    aff_x_in<N>(st, x, k, xs, red, nw);
    const int nu = k / V, ng = k / st.group, xrow = xs_row(k, 1), rpg = GEMV_WARPS * RW, gsh = st.gshift;
    float *xp = xs + (size_t)N * xrow;
    uint32_t *dg = (uint32_t *)xs;   /* DP: the pieces' digits, over x once every thread holds its pieces */
    if (DP) {
        aff_dp_digits(xs, nu, xp);
    } else {
        for (int e = threadIdx.x; e < N * nu; e += GEMV_WARPS * 32) {   /* each piece's sum of x, once for every row */
            const float4 *v4 = (const float4 *)(xs + (size_t)(e / nu) * xrow + xs_index(e % nu * V, 1));
            float sum = 0.0f;
#pragma unroll
            for (int i = 0; i < V / 4; i++) sum += (v4[i].x + v4[i].y) + (v4[i].z + v4[i].w);
            xp[e] = sum;
        }
    }
    __syncthreads();
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
                if (j < nu) {
                    if (DP) aff_dp_piece<S>(q[p], sc[p], bi[p], dg, xp, j, (float (*)[1])acc);
                    else aff_piece<BITS, N, S>(q[p], sc[p], bi[p], xs, xrow, xp, nu, j, acc);
                }
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

/* ---------------------------------------------------- one token's 4-bit rows in integers, streamed */

/* k_gemv_aff_ring: the integer kernel above (its warps, row pairs, digits and arithmetic), its weights
 * streamed: k_gemv_aff loads a warp's row pair in one round of registers and then waits a full DRAM
 * round trip, computes, reduces and stores before the next pair's loads issue (8B shape, H200: the big
 * GEMVs at ~2 TB/s). Here each warp streams items through its own ring of D cp.async stages, filled
 * before the wait on the kernel before (weights do not depend on it), so that the loads of its next
 * items (the next row pair's too) are in flight while it computes. An item is a round of the warp's two
 * streams: 32 pieces of each (lane L: piece 32 r + L of round r), codes [stream][lane] 16 bytes each
 * (conflict-free 16-byte reads), then the round's scales and biases, [stream][kind][chunk] 16 bytes each
 * (a stream's round has 1024 / group scales: 16 to 128 bytes), chunk c of (stream, kind) fetched by lane
 * 16 stream + 8 kind + c. Taken where a row's scales are whole 16-byte chunks (k / group * size % 16 == 0)
 * and the pointers 16-byte aligned (CINFER_CUDA_AFF_RING=0: never). */
#define AFR_STAGE 1536
/* shared memory: x (xs_index's layout), the pieces' sums of x (nu = k / 32), then the warps' rings from a 16-byte boundary */
__host__ __device__ __forceinline__ size_t afr_ring_at(int k, int nu) { return ((size_t)(xs_row(k, 1) + nu) * 4 + 15) & ~(size_t)15; }
struct afr_src {
    int grp, r;              /* the item: the warp's row group of the persistent walk, the round */
    const char *pa, *pb;     /* the lane's codes of the round in streams 0 and 1 */
    const char *ps;          /* the lane's scale or bias chunk of the round */
    int nch;                 /* chunks of the round the lanes fetch (1024 / group * size / 16; fewer in a short last round) */
};
/* the warp's rows in row group grp: matrix index, first row, rows (s: row of stream s, a row past the end: row 0) */
template <int GLU> __device__ __forceinline__ int afr_rows(const gemv_set &st, int grp, int *row0, int *m, int *ra, int *rb) {
    constexpr int RW = GLU ? 1 : AFF_RW;
    int mi = gemv_group(st, grp, (int)(blockDim.x >> 5) * RW, row0);   /* the block's warps: GEMV_WARPS, or 16 (afr_w) */
    *row0 += (threadIdx.x / 32) * RW;
    *m = st.m[mi];
    int a = *row0, b = GLU ? a : *row0 + 1;
    *ra = a < *m ? a : 0, *rb = b < *m ? b : 0;
    return mi;
}
template <int GLU, int SSZ> __device__ __forceinline__ void afr_src_at(afr_src &q, const gemv_set &st, int nu, int ng, int gsh) {
    if (q.grp >= st.gend[2]) return;
    int row0, m, ra, rb, mi = afr_rows<GLU>(st, q.grp, &row0, &m, &ra, &rb);
    const int lane = threadIdx.x & 31, s = lane >> 4, wa = GLU ? 0 : mi, wb = GLU ? 1 : mi, ws = s ? wb : wa;
    const size_t rowb = (size_t)nu * 16;
    q.pa = (const char *)st.w[wa] + (size_t)ra * rowb + (size_t)(32 * q.r + lane) * 16;
    q.pb = (const char *)st.w[wb] + (size_t)rb * rowb + (size_t)(32 * q.r + lane) * 16;
    q.ps = (const char *)((lane >> 3) & 1 ? st.bi[ws] : st.sc[ws]) + ((size_t)(s ? rb : ra) * ng + (size_t)q.r * (1024 >> gsh)) * SSZ +
           (lane & 7) * 16;
    const int pieces = nu - 32 * q.r < 32 ? nu - 32 * q.r : 32;
    q.nch = ((((pieces << 5) + (1 << gsh) - 1) >> gsh) * SSZ + 15) >> 4;
}
/* issues the warp's next item into stage qs and moves on; one commit group an item (empty past the end) */
template <int GLU, int SSZ>
__device__ __forceinline__ void afr_issue(afr_src &q, const gemv_set &st, int nu, int ng, int gsh, char *stage) {
    if (q.grp < st.gend[2]) {
        const int lane = threadIdx.x & 31;
        if (32 * q.r + lane < nu) {
            cp_async16(stage + lane * 16, q.pa);
            cp_async16(stage + 512 + lane * 16, q.pb);
        }
        if ((lane & 7) < q.nch) cp_async16(stage + 1024 + lane * 16, q.ps);
        q.pa += 512, q.pb += 512, q.ps += (size_t)(1024 >> gsh) * SSZ;
        if (32 * ++q.r >= nu) {
            q.r = 0, q.grp += gridDim.x;
            afr_src_at<GLU, SSZ>(q, st, nu, ng, gsh);
        } else if (32 * (q.r + 1) > nu) {   /* a short last round: fewer chunks */
            afr_src_at<GLU, SSZ>(q, st, nu, ng, gsh);
        }
    }
    cp_async_commit();
}

/* the ring kernel's blocks in the diagnostic timeline (cuda.cuh's CU_TRACE): kind (k / 32) << 1 | GLU */
#define AFR_TRACE(ev) CU_TRACE(ev, (unsigned)(k / 32) << 1 | GLU)
CU_TRACE_HOST(cu_trace_gemv)

template <int D, int GLU, int SDT, int W>
__global__ void __launch_bounds__(W * 32, W == GEMV_WARPS ? GEMV_BLOCKS_PER_SM : 1) k_gemv_aff_ring(gemv_set st, const float *x, int k) {
    constexpr int RW = GLU ? 1 : AFF_RW, SSZ = SDT == BE_F32 ? 4 : 2;
    __shared__ float red[W];
    extern __shared__ float xs[];   /* [xs_row(k, 1)]: x, then its digits; [k / 32] the pieces' sums of x; the warps' rings */
    const int warp = threadIdx.x / 32, lane = threadIdx.x & 31, nu = k / 32, ng = k >> st.gshift, gsh = st.gshift;
    float *xp = xs + xs_row(k, 1);
    char *ring = (char *)xs + afr_ring_at(k, nu) + (size_t)warp * D * AFR_STAGE;
    AFR_TRACE(0);
    afr_src src;
    src.grp = blockIdx.x, src.r = 0;
    afr_src_at<GLU, SSZ>(src, st, nu, ng, gsh);
    int qi = 0;   /* the stage of the next item to issue */
    for (; qi < D - 1; qi++) afr_issue<GLU, SSZ>(src, st, nu, ng, gsh, ring + qi * AFR_STAGE);   /* weights: no wait on the kernel before */
    float4 nw[GEMV_NORM_PER];
    gemv_before_wait<W>(st, k, nw);
    PDL_ENTRY();
    AFR_TRACE(1);
    aff_x_in<1, W>(st, x, k, xs, red, nw);
    aff_dp_digits<W>(xs, nu, xp);
    __syncthreads();
    AFR_TRACE(2);
    const uint32_t *dg = (const uint32_t *)xs;
    const int gi = (lane << 5) >> gsh;   /* the lane's group in a round */
    int q = 0;                           /* the stage of the next item to compute */
    for (int grp = blockIdx.x; grp < st.gend[2]; grp += gridDim.x) {
        int row0, m, ra, rb, mi = afr_rows<GLU>(st, grp, &row0, &m, &ra, &rb);
        float acc[2][1] = {{0.0f}, {0.0f}};
        for (int r = 0; 32 * r < nu; r++) {
            __syncwarp();   /* every lane is done with the stage the issue refills (its scale chunks are shared) */
            afr_issue<GLU, SSZ>(src, st, nu, ng, gsh, ring + qi * AFR_STAGE);
            qi = qi + 1 == D ? 0 : qi + 1;
            cp_async_wait<D - 1>();
            __syncwarp();   /* the other lanes' chunks of this stage are visible */
            const char *stage = ring + q * AFR_STAGE;
            q = q + 1 == D ? 0 : q + 1;
            const int j = 32 * r + lane;
            if (j < nu) {
                const uint4 qq[2] = {((const uint4 *)stage)[lane], ((const uint4 *)stage)[32 + lane]};
                const float sc[2] = {cu_mat_get(stage + 1024, SDT, gi), cu_mat_get(stage + 1024 + 256, SDT, gi)};
                const float bi[2] = {cu_mat_get(stage + 1024 + 128, SDT, gi), cu_mat_get(stage + 1024 + 384, SDT, gi)};
                aff_dp_piece<2>(qq, sc, bi, dg, xp, j, acc);
            }
        }
        (void)ra, (void)rb;
#pragma unroll
        for (int s = 0; s < 2; s++) warp_sum<1>(acc[s]);
#pragma unroll
        for (int r = 0; r < RW; r++)
            if (lane == r && row0 + r < m) {
                float a2[2][1] = {{acc[r][0]}, {GLU ? acc[1][0] : 0.0f}};
                gemv_store<1>(st, mi, row0 + r, m, a2);
            }
    }
    cp_async_wait<0>();   /* no copy outlives the block */
    AFR_TRACE(3);
}

/* ---------------------------------------------------- one token on the tensor cores */

/* 4-bit codes of one token (decode at batch 1), k a multiple of 128, groups of 32, 64 or 128. A block's
 * warps share one tile of 16 streams (16 rows; gate/up: 8 rows of each) and split its steps of
 * 128 codes (warp w: the w-th run of ceil(steps / 8)); the block ends a tile with one barrier
 * (partial sums through shared memory, double-buffered). Each warp streams its items (a tile's
 * step) through its own ring of cp.async stages (aft_ring), lane-private, so that loads of the
 * next items, the next tile's too, are in flight while it computes and while it waits at the
 * barrier; the ring fills before the wait on the kernel before (weights do not depend on it).
 * In a step lane (g, t) = (lane / 4, lane % 4) takes codes 32t..32t+31 of streams g and g+8:
 * codes become exact f16 values (a lop3 under 1024's exponent and one packed subtract or fma:
 * 1024 + c - 1024), the A operands of mma.sync m16n8k16 directly; the products are
 * exact in the f32 accumulator. B holds x scaled per group by a power of two (the group's max
 * |x| below 2^15) and split into f16 high and low parts (22 significant bits), one column per
 * (group of the step, part): column 2j+h is part h of x on group j's codes and zero elsewhere,
 * so that D's column pairs are each group's sums, which lane (g, t) finds in its accumulator
 * for group t: s * 2^-e * (hi + lo) + b * sum x per group, in f32, the association of the
 * kernel above. x sits in shared memory in the order the B fragments want (aft_convert): a
 * lane's B of one step is four 16-byte loads, lanes of one load phase hit different banks, and
 * lanes of zero columns load nothing. Measured against the kernel above (H200, 8B and 1B
 * shapes, A/B in one process): BENCHMARKS.md, issue 11; 8-bit codes the same way (a byte
 * permute per pair) were slower than the kernel above (2.0 against 2.8 TB/s on the 8B LM head)
 * and are not taken. */
#define AFT_STEP 128

__device__ __forceinline__ uint32_t aft_lop3(uint32_t w, uint32_t mask) {   /* (w & mask) | 1024's exponent in each half */
    uint32_t r;
    asm("lop3.b32 %0, %1, %2, %3, 0xEA;" : "=r"(r) : "r"(w), "r"(mask), "r"(0x64006400u));
    return r;
}
__device__ __forceinline__ uint32_t aft_sub1024(uint32_t v) {
    uint32_t r;
    asm("sub.f16x2 %0, %1, %2;" : "=r"(r) : "r"(v), "r"(0x64006400u));
    return r;
}
__device__ __forceinline__ uint32_t aft_div16(uint32_t v) {   /* (1024 + 16c) / 16 - 64 = c, exact */
    uint32_t r;
    asm("fma.rn.f16x2 %0, %1, %2, %3;" : "=r"(r) : "r"(v), "r"(0x2C002C00u), "r"(0xD400D400u));
    return r;
}
/* the 8 4-bit codes of w as f16 pairs (c0,c4) (c1,c5) (c2,c6) (c3,c7) */
__device__ __forceinline__ void aft_word4(uint32_t w, uint32_t *p) {
    uint32_t w8 = w >> 8;
    p[0] = aft_sub1024(aft_lop3(w, 0x000F000Fu));
    p[1] = aft_div16(aft_lop3(w, 0x00F000F0u));
    p[2] = aft_sub1024(aft_lop3(w8, 0x000F000Fu));
    p[3] = aft_div16(aft_lop3(w8, 0x00F000F0u));
}
/* position of element j (0..7) of an 8-code slot in its B order (0,4,1,5,2,6,3,7): aft_word4's pairs */
__host__ __device__ __forceinline__ int aft_perm(int j) { return (j & 3) * 2 + (j >> 2); }

/* x (k floats, shared memory) rewritten in place in the B order, each group scaled by its own power of two
 * (its max |x| below 2^15) and split into f16 high and low parts: step s's 512 bytes hold
 * [slot w 0..3][chunk t 0..3][hi 8 | lo 8], slot w of chunk t being elements 32t+8w..+7 of the step in
 * aft_perm's order; gg[j] = (group j's sum of x (unscaled), its scale's inverse). A chunk is
 * one lane's, a group's chunks neighbouring lanes, a step's four chunks four lanes of one warp, which
 * read all before any writes. */
__device__ void aft_convert(float *xs, int k, int gsh2, float2 *gg) {
    int warp = threadIdx.x / 32, lane = threadIdx.x & 31, nch = k / 32, cpg = 1 << gsh2;
    for (int base = warp * 32; base < nch; base += GEMV_WARPS * 32) {
        int ch = base + lane;
        float v[32], mx = 0.0f, sum = 0.0f;
        if (ch < nch)
#pragma unroll
            for (int i = 0; i < 8; i++) {
                float4 f = ((const float4 *)(xs + (size_t)ch * 32))[i];
                v[4 * i] = f.x, v[4 * i + 1] = f.y, v[4 * i + 2] = f.z, v[4 * i + 3] = f.w;
                mx = fmaxf(mx, fmaxf(fmaxf(fabsf(f.x), fabsf(f.y)), fmaxf(fabsf(f.z), fabsf(f.w))));
                sum += (f.x + f.y) + (f.z + f.w);
            }
        for (int o = 1; o < cpg; o <<= 1)   /* the group's lanes (all in range or none: nch % 4 == 0) */
            mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o)), sum += __shfl_xor_sync(0xffffffffu, sum, o);
        int ex = 0;
        if (mx > 0.0f && mx < INFINITY) frexpf(mx, &ex);
        ex = ex < -100 ? -100 : ex;   /* the scale stays finite */
        const float sc = ldexpf(1.0f, 15 - ex);   /* max |x| * sc < 2^15 */
        __syncwarp();
        if (ch < nch) {
            if ((ch & (cpg - 1)) == 0) gg[ch >> gsh2] = make_float2(sum, ldexpf(1.0f, ex - 15));
            uint4 *dst = (uint4 *)(xs + (size_t)(ch / 4) * AFT_STEP) + (ch % 4) * 2;
#pragma unroll
            for (int w = 0; w < 4; w++) {
                unsigned short h[8], l[8];
#pragma unroll
                for (int j = 0; j < 8; j++) {
                    float y = v[8 * w + j] * sc;
                    __half hh = __float2half_rn(y);
                    h[aft_perm(j)] = __half_as_ushort(hh);
                    l[aft_perm(j)] = __half_as_ushort(__float2half_rn(y - __half2float(hh)));
                }
                uint4 H, L;
                H.x = h[0] | (uint32_t)h[1] << 16, H.y = h[2] | (uint32_t)h[3] << 16, H.z = h[4] | (uint32_t)h[5] << 16, H.w = h[6] | (uint32_t)h[7] << 16;
                L.x = l[0] | (uint32_t)l[1] << 16, L.y = l[2] | (uint32_t)l[3] << 16, L.z = l[4] | (uint32_t)l[5] << 16, L.w = l[6] | (uint32_t)l[7] << 16;
                dst[w * 8] = H;
                dst[w * 8 + 1] = L;
            }
        }
        __syncwarp();
    }
}

/* one step's products of lane (g, t): d (4 accumulators of D) from the two streams' codes qa, qb (32 codes each) and B (bp, slots 8 uint4 apart) */
/* one step's products of lane (g, t): d (4 accumulators of D) from the two streams' codes qa, qb (32 codes each) and B (bp, slots 8 uint4 apart) */
__device__ __forceinline__ void aft_step(uint4 qa, uint4 qb, const uint4 *bp, int bact, float *d) {
    float e[4] = {0.0f, 0.0f, 0.0f, 0.0f};   /* a second chain */
#pragma unroll
    for (int w = 0; w < 4; w++) {
        uint4 xb = make_uint4(0, 0, 0, 0);   /* a lane of a zero column loads nothing: a quarter-warp of them costs no wavefront */
        if (bact) xb = bp[w * 8];
        uint32_t pa[4], pb[4];
        aft_word4(u4_word(qa, w), pa);
        aft_word4(u4_word(qb, w), pb);
        const uint32_t a1[4] = {pa[0], pb[0], pa[1], pb[1]}, a2[4] = {pa[2], pb[2], pa[3], pb[3]};
        mma16816(d, a1, xb.x, xb.y);
        mma16816(e, a2, xb.z, xb.w);
    }
#pragma unroll
    for (int i = 0; i < 4; i++) d[i] += e[i];
}

/* a warp's ring of D cp.async stages, each: lane-private slots of the two streams' codes (16 bytes each,
 * padded so that a quarter-warp's 16-byte loads hit different banks), then [scales, biases][stream row
 * 0..15] 16 bytes each, which lane r + 16 * (biases) fetches for stream row r: the step's gpl scales of the
 * row: the aligned 16 bytes that hold them (a step's gpl scales, 2 to 16 bytes, never straddle 16; reading the 16
 * whole bytes costs the same L2 request as reading the scales alone, and no branch on their size) */
template <int D> struct aft_ring {
    static constexpr int SLOT = 48, SC = 32 * SLOT, STAGE = SC + 512, WARP = D * STAGE;
};
/* where row group grp's streams of lane g are: matrix and row of each (a row past the end: row 0, never stored) */
template <int GLU> __device__ __forceinline__ int aft_rows(const gemv_set &st, int grp, int g, int *row0, int *ra, int *rb, int *m) {
    int mi = gemv_group(st, grp, GLU ? 8 : 16, row0);
    *m = st.m[mi];
    int a = *row0 + g, b = GLU ? a : *row0 + g + 8;
    *ra = a < *m ? a : 0, *rb = b < *m ? b : 0;
    return mi;
}
/* the warp's next item to load: tile grp (of the block's persistent walk), the j-th step of this warp's run; the
 * lane's code rows there and the scale row it fetches */
struct aft_src {
    int grp, j;
    const char *pa, *pb, *ps;   /* the item's codes of the two streams (advanced an item at a time); the lane's scales or biases */
    size_t so;                  /* the item's scales' byte offset in ps (its group 0; the fetch takes the 16 bytes around) */
};
template <int GLU> __device__ __forceinline__ void aft_src_tile(aft_src &r, const gemv_set &st, int g, int t, size_t rowb, int ng, int s0,
                                                               int gpl, int ssz) {
    if (r.grp >= st.gend[2]) return;
    int row0, ra, rb, m, mi = aft_rows<GLU>(st, r.grp, g, &row0, &ra, &rb, &m);
    const int wa = GLU ? 0 : mi, wb = GLU ? 1 : mi, lane = threadIdx.x & 31, sr = lane & 15, sw = sr < 8 ? wa : wb;
    int rs = GLU ? row0 + (sr & 7) : row0 + sr;
    rs = rs < m ? rs : 0;
    r.pa = (const char *)st.w[wa] + (size_t)ra * rowb + (size_t)t * 16 + (size_t)s0 * (AFT_STEP / 2);
    r.pb = (const char *)st.w[wb] + (size_t)rb * rowb + (size_t)t * 16 + (size_t)s0 * (AFT_STEP / 2);
    r.ps = (const char *)(lane < 16 ? st.sc[sw] : st.bi[sw]);
    r.so = ((size_t)rs * ng + (size_t)s0 * gpl) * ssz;
}
/* issues the warp's next item into stage qs (< D) and moves on; one commit group an item, empty past the end */
template <int D, int GLU>
__device__ __forceinline__ void aft_issue(aft_src &r, const gemv_set &st, unsigned qs, int nper, int s0, int g, int t, int gpl, int ssz,
                                          int ng, size_t rowb, char *ring) {
    typedef aft_ring<D> R;
    if (nper && r.grp < st.gend[2]) {
        int lane = threadIdx.x & 31;
        char *stage = ring + qs * R::STAGE, *slot = stage + lane * R::SLOT;
        cp_async16(slot, r.pa);
        cp_async16(slot + 16, r.pb);
        const char *sp = r.ps + (r.so & ~(size_t)15);
        char *sd = stage + R::SC + lane * 16;
        cp_async_ca<16>(sd, sp, 1);
        r.pa += AFT_STEP / 2, r.pb += AFT_STEP / 2, r.so += (size_t)gpl * ssz;
        if (++r.j == nper) {
            r.j = 0, r.grp += gridDim.x;
            aft_src_tile<GLU>(r, st, g, t, rowb, ng, s0, gpl, ssz);
        }
    }
    cp_async_commit();
}

/* SDT: the scales' type (BE_F32, BE_F16, BE_BF16), a template parameter so that reading one is a load and a conversion */
template <int D, int GLU, int SDT>
__global__ void __launch_bounds__(GEMV_WARPS * 32, 2) k_gemv_aff_tc(gemv_set st, const float *x, int k) {
    typedef aft_ring<D> R;
    __shared__ float red[GEMV_WARPS];
    __shared__ float part[2][GEMV_WARPS][16];
    extern __shared__ float xs[];   /* [k]: x, then its B form (aft_convert); [ng2] float2: each group's sum of x and inverse scale; the warps' rings */
    int warp = threadIdx.x / 32, lane = threadIdx.x & 31, g = lane / 4, t = lane % 4;
    const int ng = k / st.group, gpl = AFT_STEP / st.group, nsteps = k / AFT_STEP, gsh2 = st.gshift - 5;
    /* warp w: steps s0 .. s0 + nper - 1 of every tile (a run, so that its scale words share sectors item after item) */
    const int per = (nsteps + GEMV_WARPS - 1) / GEMV_WARPS, s0 = warp * per, nper = nsteps - s0 < per ? (nsteps > s0 ? nsteps - s0 : 0) : per;
    const int dact = t < gpl;
    constexpr int ssz = SDT == BE_F32 ? 4 : 2;
    const size_t rowb = (size_t)k / 2;
    float2 *gg = (float2 *)(xs + k);
    char *ring = (char *)(gg + ((ng + 1) & ~1)) + (size_t)warp * R::WARP;
    aft_src src;
    src.grp = blockIdx.x, src.j = 0;
    aft_src_tile<GLU>(src, st, g, t, rowb, ng, s0, gpl, ssz);
    unsigned qi = 0;   /* the stage of the next item to issue */
    for (; qi < D - 1; qi++) aft_issue<D, GLU>(src, st, qi, nper, s0, g, t, gpl, ssz, ng, rowb, ring);   /* weights: no wait on the kernel before */
    float4 nw[GEMV_NORM_PER];
    gemv_before_wait(st, k, nw);
    PDL_ENTRY();
    if (st.norm) {
        gemv_norm_prologue<1>(st, x, k, xs, red, 0, nw);
    } else {
        for (int e = threadIdx.x * 4; e < k; e += GEMV_WARPS * 32 * 4) *(float4 *)(xs + e) = *(const float4 *)(x + e);
        __syncthreads();
    }
    aft_convert(xs, k, gsh2, gg);
    __syncthreads();

    /* lane (g, t)'s B: part g & 1 of chunk t where column g's group is chunk t's, else zeros */
    const int bact = (g >> 1) == (t >> gsh2);
    const uint4 *bbase = (const uint4 *)xs + t * 2 + (g & 1) + (size_t)s0 * (AFT_STEP * 4 / 16);   /* step s0's */
    const float2 *ggb = gg + s0 * gpl + t;
    unsigned buf = 0, q = 0;   /* q: the stage of the next item to compute */
    for (int grp = blockIdx.x; grp < st.gend[2]; grp += gridDim.x, buf ^= 1) {
        int row0, ra, rb, m, mi = aft_rows<GLU>(st, grp, g, &row0, &ra, &rb, &m);
        /* the low bits of the byte offsets of group t of step s0's scales in rows ra and rb: where in the fetched 16 bytes they are */
        unsigned oa = ((unsigned)ra * ng + t + s0 * gpl) * ssz, ob = ((unsigned)rb * ng + t + s0 * gpl) * ssz;
        const uint4 *bp = bbase;
        const float2 *gp = ggb;
        float acc0 = 0.0f, acc1 = 0.0f;
        for (int j = 0; j < nper; j++) {
            aft_issue<D, GLU>(src, st, qi, nper, s0, g, t, gpl, ssz, ng, rowb, ring);
            qi = qi + 1 == D ? 0 : qi + 1;
            cp_async_wait<D - 1>();
            const char *stage = ring + q * R::STAGE, *slot = stage + lane * R::SLOT;
            q = q + 1 == D ? 0 : q + 1;
            const uint4 qa = ((const uint4 *)slot)[0], qb = ((const uint4 *)slot)[1];
            float d[4] = {0.0f, 0.0f, 0.0f, 0.0f};
            aft_step(qa, qb, bp, bact, d);
            bp += AFT_STEP * 4 / 16;
            if (dact) {   /* group t of the step: its scales (aft_ring) and x's sum and inverse scale */
                const char *sa = stage + R::SC + g * 16 + (oa & 15), *sb = stage + R::SC + (8 + g) * 16 + (ob & 15);
                float2 x2 = *gp;
                acc0 += cu_mat_get(sa, SDT, 0) * x2.y * (d[0] + d[1]) + cu_mat_get(sa + 256, SDT, 0) * x2.x;
                acc1 += cu_mat_get(sb, SDT, 0) * x2.y * (d[2] + d[3]) + cu_mat_get(sb + 256, SDT, 0) * x2.x;
            }
            oa += gpl * ssz, ob += gpl * ssz, gp += gpl;
        }
        acc0 += __shfl_xor_sync(0xffffffffu, acc0, 1), acc1 += __shfl_xor_sync(0xffffffffu, acc1, 1);
        acc0 += __shfl_xor_sync(0xffffffffu, acc0, 2), acc1 += __shfl_xor_sync(0xffffffffu, acc1, 2);
        if (t == 0) part[buf][warp][g] = acc0, part[buf][warp][g + 8] = acc1;
        __syncthreads();
        if (threadIdx.x < (GLU ? 8 : 16)) {
            int r = threadIdx.x;
            float v[2][1] = {{0.0f}, {0.0f}};
#pragma unroll
            for (int w = 0; w < GEMV_WARPS; w++) v[0][0] += part[buf][w][r], v[1][0] += GLU ? part[buf][w][r + 8] : 0.0f;
            if (row0 + r < m) gemv_store<1>(st, mi, row0 + r, m, v);
        }
    }
    cp_async_wait<0>();   /* no copy outlives the block */
}

template <int D> static size_t aff_tc_smem(int k, int group) {
    return sizeof(float) * ((size_t)k + 2 * (size_t)((k / group + 1) & ~1)) + (size_t)GEMV_WARPS * aft_ring<D>::WARP;
}
/* kern over the set with smem bytes of dynamic shared memory; with groups > 0 a persistent grid of as many blocks an
 * SM as fit (at most cap when cap > 0), else grid (the affine GEMV kernels' one launch path) */
static void aff_go(be_ctx *c, void (*kern)(gemv_set, const float *, int), unsigned groups, int cap, dim3 grid, size_t smem,
                   const gemv_set &st, const float *x, int k, int warps = GEMV_WARPS) {
    /* one instance launches with different amounts (k differs between matrices): its limit is the device's, not this
     * launch's, so that a graph node captured with more than the last launch set still launches (as ncu replays it) */
    cudaFuncAttributes fa;
    if (smem > 48 * 1024 &&
        (cu_check(c, cudaFuncGetAttributes(&fa, kern), "gemv smem") ||
         cu_check(c, cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, c->smem_optin - (int)fa.sharedSizeBytes),
                  "gemv smem")))
        return;
    if (groups) {
        int per = 0;
        if (cu_check(c, cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per, kern, warps * 32, smem), "gemv occupancy")) return;
        if (cap > 0 && cap < per) per = cap;
        const unsigned most = (unsigned)c->n_sm * (unsigned)(per > 0 ? per : 1);
        grid = dim3(groups < most ? groups : most);
    }
    cu_launch(c, kern, grid, dim3(warps * 32), smem, st, x, k);
}
template <int D, int GLU, int SDT>
static void aff_tc_launch(be_ctx *c, unsigned groups, const gemv_set &st, const float *x, int k) {
    aff_go(c, k_gemv_aff_tc<D, GLU, SDT>, groups, 0, dim3(1), aff_tc_smem<D>(k, st.group), st, x, k);
}
template <int D, int GLU> static void aff_tc_launch_sdt(be_ctx *c, unsigned groups, const gemv_set &st, const float *x, int k) {
    if (st.sdt == BE_BF16) aff_tc_launch<D, GLU, BE_BF16>(c, groups, st, x, k);
    else if (st.sdt == BE_F16) aff_tc_launch<D, GLU, BE_F16>(c, groups, st, x, k);
    else aff_tc_launch<D, GLU, BE_F32>(c, groups, st, x, k);
}
/* the tensor-core form takes this launch (see above) where its ring is AFT_D stages deep with two blocks an SM
 * (AFT_SMEM_2 bytes each: k up to 8192); beyond (the 8B shape's down projection, k 14336) three stages left it
 * slower than the CUDA-core kernel (26.8 against 19.8 us, H200) */
#define AFT_D 5
#define AFT_SMEM_2 (111 * 1024)
static int aff_tc_takes(const be_ctx *c, int n, const gemv_set &st, int k) {
    return c->aff_tc && n == 1 && k % AFT_STEP == 0 && st.group >= 32 && st.group <= 128 && aff_tc_smem<AFT_D>(k, st.group) <= AFT_SMEM_2;
}

/* the streamed integer kernel: its ring depth, shared memory, and where it takes a set (see k_gemv_aff_ring).
 * This form (6 stages of 1.5 kB, digits one thread a piece, x in shared memory) measured on an H100 in one process
 * against the compact stages and 4-stage rings of a later form (commit 1a7588e): 8B step 2.517 against 2.882 ms,
 * 1B 0.698 against 0.774. Depth 4 (CINFER_CUDA_AFR_D=2|3|6|8 forces another): same H100 call, A/B against 6 in one
 * process, 8B 2.442 against 2.500 ms, 1B 0.683 against 0.700. */
#define AFR_D 4
static size_t afr_smem(int k, int d, int w) { return afr_ring_at(k, k / 32) + (size_t)w * d * AFR_STAGE; }
static int afr_depth(const be_ctx *c) { return c->afr_d == 2 || c->afr_d == 3 || c->afr_d == 6 || c->afr_d == 8 ? c->afr_d : AFR_D; }
/* its warps a block: 16, one block an SM (x and its digits made once an SM, by twice the threads), at depths 4 and 6
 * (H100, A/B in one process: 8B 4-bit step 2.180 -> 2.135 ms, 1B 0.611 -> 0.604); CINFER_CUDA_AFR_W=8 (or another
 * depth): GEMV_WARPS, two blocks an SM */
static int afr_warps(const be_ctx *c) { return c->afr_w == 16 && (afr_depth(c) == 4 || afr_depth(c) == 6) ? 16 : GEMV_WARPS; }
static int afr_takes(const be_ctx *c, const gemv_set &st, int count, int k) {
    const size_t ssz = st.sdt == BE_F32 ? 4 : 2;
    if (!c->aff_ring || k > AFF_XS_MAX || k % 32 || (size_t)(k / st.group) * ssz % 16 || afr_smem(k, afr_depth(c), afr_warps(c)) > 227 * 1024)
        return 0;
    for (int i = 0; i < (st.glu ? 2 : count); i++)
        if (((uintptr_t)st.w[i] | (uintptr_t)st.sc[i] | (uintptr_t)st.bi[i]) & 15) return 0;
    return 1;
}
template <int D, int GLU, int SDT, int W> static void afr_launch(be_ctx *c, unsigned groups, const gemv_set &st, const float *x, int k) {
    aff_go(c, k_gemv_aff_ring<D, GLU, SDT, W>, groups, c->afr_blocks, dim3(1), afr_smem(k, D, W), st, x, k, W);
}
template <int D, int SDT, int W> static void afr_launch_glu(be_ctx *c, unsigned groups, const gemv_set &st, const float *x, int k) {
    if (st.glu) afr_launch<D, 1, SDT, W>(c, groups, st, x, k);
    else afr_launch<D, 0, SDT, W>(c, groups, st, x, k);
}
template <int D, int W = GEMV_WARPS> static void afr_launch_sdt(be_ctx *c, unsigned groups, const gemv_set &st, const float *x, int k) {
    if (st.sdt == BE_BF16) afr_launch_glu<D, BE_BF16, W>(c, groups, st, x, k);
    else if (st.sdt == BE_F16) afr_launch_glu<D, BE_F16, W>(c, groups, st, x, k);
    else afr_launch_glu<D, BE_F32, W>(c, groups, st, x, k);
}
/* the set's row groups of afr_warps(c) warps (gemv_groups), in the ring kernel */
static void afr_launch_any(be_ctx *c, gemv_set st, int count, const float *x, int k) {
    const int d = afr_depth(c), w = afr_warps(c);
    const unsigned groups = gemv_groups(&st, count, w * (st.glu ? 1 : AFF_RW));
    if (w == 16 && d == 6) afr_launch_sdt<6, 16>(c, groups, st, x, k);
    else if (w == 16) afr_launch_sdt<AFR_D, 16>(c, groups, st, x, k);
    else if (d == 2) afr_launch_sdt<2>(c, groups, st, x, k);
    else if (d == 3) afr_launch_sdt<3>(c, groups, st, x, k);
    else if (d == 6) afr_launch_sdt<6>(c, groups, st, x, k);
    else if (d == 8) afr_launch_sdt<8>(c, groups, st, x, k);
    else afr_launch_sdt<AFR_D>(c, groups, st, x, k);
}

/* the affine GEMV over the set's matrices (BITS 4 or 8; DP: one token's 4-bit rows in integers) */
template <int BITS, int N, int GLU, int DP = 0>
static void aff_launch(be_ctx *c, dim3 grid, size_t smem, const gemv_set &st, const float *x, int k) {
    aff_go(c, k_gemv_aff<BITS, N, GLU, DP>, 0, 0, grid, smem, st, x, k);
}

template <int BITS>
static void gemv_aff_n(be_ctx *c, int n, gemv_set st, int count, const float *x, int k) {
    unsigned groups = gemv_groups(&st, count, GEMV_WARPS * (st.glu ? 1 : AFF_RW));
    if (!groups || n <= 0) return;
    unsigned most = (unsigned)c->n_sm * GEMV_BLOCKS_PER_SM;
    dim3 grid(groups < most ? groups : most);
    if (BITS == 4 && n == 1 && c->aff_dp && afr_takes(c, st, count, k)) {   /* one token in integers, streamed */
        afr_launch_any(c, st, count, x, k);
        return;
    }
    if (BITS == 4 && n == 1 && c->aff_dp) {   /* one token in integers: xs, the pieces' sums, their digits */
        size_t smem = sizeof(float) * ((size_t)xs_row(k, 1) + (size_t)k / 32);   /* the digits take x's place */
        if (st.glu) aff_launch<4, 1, 1, 1>(c, grid, smem, st, x, k);
        else aff_launch<4, 1, 0, 1>(c, grid, smem, st, x, k);
        return;
    }
    if (BITS == 4 && aff_tc_takes(c, n, st, k)) {   /* the same row groups: 16 streams a block */
        if (st.glu) aff_tc_launch_sdt<AFT_D, 1>(c, groups, st, x, k);
        else aff_tc_launch_sdt<AFT_D, 0>(c, groups, st, x, k);
        return;
    }
    /* tokens a launch takes: their activations fit in shared memory (the norm prologue's always do) */
    int nc = AFF_XS_MAX / k < n ? AFF_XS_MAX / k : n;
    for (int r0 = 0; r0 < n; r0 += nc) {
        int nt = n - r0 < nc ? n - r0 : nc;
        gemv_set sc = st;
        for (int i = 0; i < 3; i++)
            if (sc.y[i]) sc.y[i] += (size_t)r0 * sc.m[i];
        size_t smem = sizeof(float) * (size_t)nt * (xs_row(k, 1) + k / (128 / BITS));
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

void cu_gemv_affine(be_ctx *c, int n, int dt, gemv_set st, int count, const float *x, int k) {
    st.xa = c->x_ahead;
    if (dt == BE_Q4) gemv_aff_n<4>(c, n, st, count, x, k);
    else gemv_aff_n<8>(c, n, st, count, x, k);
}
