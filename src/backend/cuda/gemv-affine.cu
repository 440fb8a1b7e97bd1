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

template <int BITS, int N, int GLU>
__global__ void __launch_bounds__(GEMV_WARPS * 32, GEMV_BLOCKS_PER_SM) k_gemv_aff(gemv_set st, const float *x, int k) {
    constexpr int V = 128 / BITS, S = AFF_RW, RW = GLU ? 1 : S;   /* codes a piece; streams; rows */
    __shared__ float red[GEMV_WARPS];
    extern __shared__ float xs[];   /* [N][xs_row(k, 1)]: the normed or copied activations; then [N][k/V] their pieces' sums */
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
    float *xp = xs + (size_t)N * xrow;
    for (int e = threadIdx.x; e < N * nu; e += GEMV_WARPS * 32) {   /* each piece's sum of x, once for every row */
        const float4 *v4 = (const float4 *)(xs + (size_t)(e / nu) * xrow + xs_index(e % nu * V, 1));
        float sum = 0.0f;
#pragma unroll
        for (int i = 0; i < V / 4; i++) sum += (v4[i].x + v4[i].y) + (v4[i].z + v4[i].w);
        xp[e] = sum;
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
                if (j < nu) aff_piece<BITS, N, S>(q[p], sc[p], bi[p], xs, xrow, xp, nu, j, acc);
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
    if (dt == BE_Q4) gemv_aff_n<4>(c, n, st, count, x, k);
    else gemv_aff_n<8>(c, n, st, count, x, k);
}
