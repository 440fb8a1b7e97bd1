/*
 * gemv.cuh — the decode GEMV's shared pieces (gemm.cu's dense kernels and
 * gemv-affine.cu's MLX affine ones): the set of matrices one launch walks
 * (q/k/v, gate/up with the GLU, the residual add, the rmsnorm prologue), the
 * row groups of its persistent grid, and the store of a row's sums.
 */
#ifndef CINFER_GEMV_CUH
#define CINFER_GEMV_CUH
#include "backend/cuda/cuda.cuh"

#define GEMV_MAX_N 8
#define GEMV_WARPS 8
#define GEMV_BLOCKS_PER_SM 2   /* persistent grid: blocks per multiprocessor */

__device__ __forceinline__ uint4 ld_stream(const uint4 *p) {
    uint4 r;
    asm("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];" : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w) : "l"(p));
    return r;
}


/* up to three matrices of one input (q/k/v, gate/up) in one launch; their
 * row groups are numbered one after another (gend: cumulative group ends).
 * glu (a BE_ACT_*): two matrices of m[0] rows walked together; y[0] = act(x.w0) * (x.w1). */
typedef struct gemv_set {
    const void *w[3], *bias[3];
    float *y[3];
    int m[3], bdt[3], gend[3];
    int glu;
    int acc;              /* y += the result (the residual add) */
    const void *norm;     /* non-NULL: the input is rmsnorm(x) * (norm + norm_add), made in shared memory */
    int norm_dt;
    int prefetch;         /* stream this launch's rows into L2 before waiting on the kernel before */
    float norm_add, eps;
    const void *sc[3], *bi[3];   /* affine weights (k_gemv_aff): per-group scales and biases of each matrix */
    int sdt, group, gshift;      /* their dtype, group size (one for the set) and its log2 */
    const char *pf[2];           /* prefetch_next's hint: bytes [0, pf_bytes) of each into L2 before the wait */
    unsigned pf_bytes[2];
    int xa;                      /* the affine GEMV's copy of x: every load issued before the first store (aff_x_in) */
} gemv_set;

#define GEMV_NORM_MAX 8192   /* n * k floats a norm prologue keeps in shared memory */

/* the shared-memory index of element i of an activation row: pad (the affine GEMV's layout) leaves 4 floats
 * after every 32, so that lanes reading 16-byte pieces 32 or 16 elements apart hit different banks */
__device__ __forceinline__ int xs_index(int i, int pad) { return pad ? i + (i >> 5) * 4 : i; }
__host__ __device__ __forceinline__ int xs_row(int k, int pad) { return pad ? k + (k >> 5) * 4 : k; }

#define GEMV_NORM_PER (GEMV_NORM_MAX / 4 / (GEMV_WARPS * 32))   /* 4-element pieces of a row a thread normalizes (at most) */

/* elements 4j..4j+3 of a vector of dtype dt (f32/f16/bf16) */
__device__ __forceinline__ float4 cu_get4(const void *p, int dt, int j) {
    if (dt == BE_F32) return ((const float4 *)p)[j];
    const uint2 u = ((const uint2 *)p)[j];
    float2 a, b;
    if (dt == BE_F16) a = __half22float2(*(const __half2 *)&u.x), b = __half22float2(*(const __half2 *)&u.y);
    else a = __bfloat1622float2(*(const __nv_bfloat162 *)&u.x), b = __bfloat1622float2(*(const __nv_bfloat162 *)&u.y);
    return make_float4(a.x, a.y, b.x, b.y);
}

/* the norm's weights (+ norm_add) this thread applies in gemv_norm_prologue; a kernel loads them before its wait
 * on the kernel before (they do not depend on it), so that the one round trip of the prologue after it is x's */
template <int W = GEMV_WARPS> __device__ __forceinline__ void gemv_norm_fetch(const gemv_set &st, int k, float4 *w) {
#pragma unroll
    for (int u = 0; u < GEMV_NORM_MAX / 4 / (W * 32); u++) {
        const int j = threadIdx.x + u * W * 32;
        float4 v = j < k / 4 ? cu_get4(st.norm, st.norm_dt, j) : make_float4(0, 0, 0, 0);
        w[u] = make_float4(v.x + st.norm_add, v.y + st.norm_add, v.z + st.norm_add, v.w + st.norm_add);
    }
}

/* xs[t][..] = x[t] / rms(x[t]) * nw for the block (nw: gemv_norm_fetch's): x read once in
 * 16-byte loads, all issued before the first use (k % 4 == 0, k <= 8192); rows xs_row(k, pad) apart */
template <int N, int W = GEMV_WARPS>
__device__ void gemv_norm_prologue(const gemv_set &st, const float *x, int k, float *xs, float *red, int pad, const float4 *nw) {
    constexpr int PER = GEMV_NORM_MAX / 4 / (W * 32);
    int nv = k / 4;
#pragma unroll
    for (int t = 0; t < N; t++) {
        float4 v[PER];
        float ss = 0.0f;
#pragma unroll
        for (int u = 0; u < PER; u++) {
            int j = threadIdx.x + u * W * 32;
            v[u] = j < nv ? ((const float4 *)(x + (size_t)t * k))[j] : make_float4(0, 0, 0, 0);
        }
#pragma unroll
        for (int u = 0; u < PER; u++) ss += v[u].x * v[u].x + v[u].y * v[u].y + v[u].z * v[u].z + v[u].w * v[u].w;
#pragma unroll
        for (int o = 16; o; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
        if (threadIdx.x % 32 == 0) red[threadIdx.x / 32] = ss;
        __syncthreads();
        ss = 0.0f;
#pragma unroll
        for (int w = 0; w < W; w++) ss += red[w];
        float inv = 1.0f / sqrtf(ss / (float)k + st.eps);
#pragma unroll
        for (int u = 0; u < PER; u++) {
            int j = threadIdx.x + u * W * 32;
            if (j >= nv) continue;
            float *o = xs + (size_t)t * xs_row(k, pad) + xs_index(4 * j, pad);
            o[0] = v[u].x * inv * nw[u].x;
            o[1] = v[u].y * inv * nw[u].y;
            o[2] = v[u].z * inv * nw[u].z;
            o[3] = v[u].w * inv * nw[u].w;
        }
        __syncthreads();   /* red is reused by the next row; xs complete */
    }
}

/* bytes at p (16-byte aligned, a multiple of 16) into L2, one bulk prefetch */
__device__ __forceinline__ void cu_l2_prefetch(const void *p, unsigned bytes) {
    asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(p), "r"(bytes) : "memory");
}

/* the set's L2 hint (prefetch_next: the matrices read after this launch, e.g. gate/up after o_proj), issued before
 * the wait on the kernel before (the attention, whose reads leave DRAM idle) in chunks spread over the grid's blocks */
__device__ __forceinline__ void gemv_l2_ahead(const gemv_set &st) {
    constexpr unsigned CH = 16u << 10;
    const unsigned t = threadIdx.x * gridDim.x + blockIdx.x, nt = gridDim.x * blockDim.x;
#pragma unroll
    for (int m = 0; m < 2; m++)
        for (unsigned i = t; i < (st.pf_bytes[m] + CH - 1) / CH; i += nt) {
            const unsigned len = (st.pf_bytes[m] - i * CH < CH ? st.pf_bytes[m] - i * CH : CH) & ~15u;
            if (len) cu_l2_prefetch(st.pf[m] + (size_t)i * CH, len);
        }
}

/* what a GEMV kernel does before its wait on the kernel before (neither depends on it): the norm's weights into
 * nw (gemv_norm_fetch, for gemv_norm_prologue) and the set's L2 hint */
template <int W = GEMV_WARPS> __device__ __forceinline__ void gemv_before_wait(const gemv_set &st, int k, float4 *nw) {
    if (st.norm) gemv_norm_fetch<W>(st, k, nw);
    if (st.pf_bytes[0] | st.pf_bytes[1]) gemv_l2_ahead(st);
}

template <int N> __device__ __forceinline__ void warp_sum(float *acc) {
#pragma unroll
    for (int t = 0; t < N; t++) {
        float s = acc[t];
#pragma unroll
        for (int o = 16; o; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
        acc[t] = s;
    }
}

/* y[t][row] (=, or += with st.acc) the row's sums plus bias, through the gated activation st.glu */
template <int N> __device__ __forceinline__ void gemv_store(const gemv_set &st, int mi, int row, int m, const float (*acc)[N]) {
    float b[2] = {0.0f, 0.0f};
#pragma unroll
    for (int h = 0; h < 2; h++) {
        if (h && !st.glu) break;
        int wi = st.glu ? h : mi;
        b[h] = st.bias[wi] ? cu_mat_get(st.bias[wi], st.bdt[wi], row) : 0.0f;
    }
    float *y = mi == 0 ? st.y[0] : mi == 1 ? st.y[1] : st.y[2];
#pragma unroll
    for (int t = 0; t < N; t++) {
        float g = acc[0][t] + b[0];
        float v = st.glu ? be_act(st.glu, g) * (acc[1][t] + b[1]) : g;
        y[(size_t)t * m + row] = st.acc ? y[(size_t)t * m + row] + v : v;
    }
}

/* which of the set's matrices row group grp is in, and its first row there */
__device__ __forceinline__ int gemv_group(const gemv_set &st, int grp, int rpg, int *row0) {
    int mi = grp < st.gend[0] ? 0 : grp < st.gend[1] ? 1 : 2;
    *row0 = (grp - (mi == 0 ? 0 : st.gend[mi - 1])) * rpg;
    return mi;
}

/* numbers the set's row groups of rpg rows (st->gend); their count */
static inline unsigned gemv_groups(gemv_set *st, int count, int rpg) {
    int end = 0;
    if (st->glu) count = 1;   /* one walk over the rows of both matrices */
    for (int i = 0; i < 3; i++) {
        if (i < count) end += (st->m[i] + rpg - 1) / rpg;
        st->gend[i] = end;
    }
    return (unsigned)end;
}

/* gemv-affine.cu: the set's 4- or 8-bit affine matrices (dt BE_Q4 / BE_Q8) over n <= GEMV_MAX_N rows of x */
#define AFF_XS_MAX 16384   /* columns up to which the affine GEMV takes a matrix (its activations in shared memory) */
void cu_gemv_affine(be_ctx *c, int n, int dt, gemv_set st, int count, const float *x, int k);
#endif
