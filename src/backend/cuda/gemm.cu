/*
 * gemm.cu — y[n][m] = x[n][k] . w[m][k]^T (+ bias) on the device.
 *
 * Decode (n <= 8): a memory-bound GEMV that streams each weight row once:
 * a persistent grid, 1-8 warps per output row (each a slice), 16-byte
 * non-allocating loads of the stored dtype
 * (8 bf16/f16 or 4 f32 per load), four loads in flight per lane, x (f32, few
 * rows, L1-resident) read alongside, all n rows accumulated per weight load
 * in f32, a warp-shuffle sum at the end. Rows whose length or alignment does
 * not allow 16-byte loads take a scalar warp-per-row kernel.
 *
 * Prefill (n > 8): cuBLAS. 16-bit weights: x is rounded to the weight's
 * dtype (as transformers computes in bf16/f16; consecutive matmuls of one
 * input, q/k/v and gate/up, round it once) and multiplied by
 * cublasGemmEx with f32 accumulation and f32 output; f32 weights use SGEMM
 * in plain f32 (no TF32). Row-major y = x w^T is column-major
 * y^T = w^T(op T) x, so w is the transposed A operand with lda = k.
 */
#include <string.h>
#include "backend/cuda/cuda.cuh"

#define GEMV_MAX_N 8
#define GEMV_WARPS 8

__device__ __forceinline__ uint4 ld_stream(const uint4 *p) {
    uint4 r;
    asm("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];" : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w) : "l"(p));
    return r;
}

/* the 16 bytes q hold V weights starting at element e; acc[t] += w . x[t][e..e+V) */
template <typename WT, int N> struct dot16;

template <int N> struct dot16<__nv_bfloat16, N> {
    static __device__ __forceinline__ void run(uint4 q, const float *x, size_t k, int e, float *acc) {
        float w[8];
        uint32_t u[4] = {q.x, q.y, q.z, q.w};
#pragma unroll
        for (int i = 0; i < 4; i++) { w[2 * i] = __uint_as_float(u[i] << 16); w[2 * i + 1] = __uint_as_float(u[i] & 0xffff0000u); }
#pragma unroll
        for (int t = 0; t < N; t++) {
            float4 a = *(const float4 *)(x + t * k + e), b = *(const float4 *)(x + t * k + e + 4);
            acc[t] += w[0] * a.x + w[1] * a.y + w[2] * a.z + w[3] * a.w + w[4] * b.x + w[5] * b.y + w[6] * b.z + w[7] * b.w;
        }
    }
};

template <int N> struct dot16<__half, N> {
    static __device__ __forceinline__ void run(uint4 q, const float *x, size_t k, int e, float *acc) {
        float w[8];
        uint32_t u[4] = {q.x, q.y, q.z, q.w};
#pragma unroll
        for (int i = 0; i < 4; i++) {
            __half2 h = *(__half2 *)&u[i];
            float2 f = __half22float2(h);
            w[2 * i] = f.x;
            w[2 * i + 1] = f.y;
        }
#pragma unroll
        for (int t = 0; t < N; t++) {
            float4 a = *(const float4 *)(x + t * k + e), b = *(const float4 *)(x + t * k + e + 4);
            acc[t] += w[0] * a.x + w[1] * a.y + w[2] * a.z + w[3] * a.w + w[4] * b.x + w[5] * b.y + w[6] * b.z + w[7] * b.w;
        }
    }
};

template <int N> struct dot16<float, N> {
    static __device__ __forceinline__ void run(uint4 q, const float *x, size_t k, int e, float *acc) {
#pragma unroll
        for (int t = 0; t < N; t++) {
            float4 a = *(const float4 *)(x + t * k + e);
            acc[t] += __uint_as_float(q.x) * a.x + __uint_as_float(q.y) * a.y + __uint_as_float(q.z) * a.z + __uint_as_float(q.w) * a.w;
        }
    }
};

/* A persistent grid (a few blocks per SM) walks groups of rows; ks warps
 * share a row (ks | GEMV_WARPS), each streaming one slice of it, so the work
 * comes in small pieces: no half-empty last wave, and matrices with few rows
 * (k/v projections) still keep every SM busy. Slice partial sums meet in
 * shared memory (double-buffered: one barrier per group). */
template <typename WT, int N> constexpr int gemv_blocks_per_sm() { return N == 1 && sizeof(WT) == 2 ? 4 : 2; }

/* up to three matrices of one input (q/k/v, gate/up) in one launch; their
 * row groups are numbered one after another (gend: cumulative group ends) */
typedef struct gemv_set {
    const void *w[3], *bias[3];
    float *y[3];
    int m[3], bdt[3], gend[3];
} gemv_set;

template <typename WT, int N>
__global__ void __launch_bounds__(GEMV_WARPS * 32, gemv_blocks_per_sm<WT, N>()) k_gemv(gemv_set st, const float *x, int k, int ks) {
    __shared__ float part[2][GEMV_WARPS][N];
    PDL_ENTRY();
    int warp = threadIdx.x / 32, lane = threadIdx.x & 31;
    int rpg = GEMV_WARPS / ks, seg = warp % ks, ngroups = st.gend[2];
    constexpr int V = 16 / sizeof(WT), U = 4;
    int nv = k / V, slice = (nv + ks - 1) / ks;
    int jbeg = seg * slice, jend = min(nv, jbeg + slice);
    int buf = 0;
    for (int grp = blockIdx.x; grp < ngroups; grp += gridDim.x, buf ^= 1) {
        int mi = grp < st.gend[0] ? 0 : grp < st.gend[1] ? 1 : 2;
        int g0 = mi == 0 ? 0 : mi == 1 ? st.gend[0] : st.gend[1];
        int m = mi == 0 ? st.m[0] : mi == 1 ? st.m[1] : st.m[2];
        const WT *w = (const WT *)(mi == 0 ? st.w[0] : mi == 1 ? st.w[1] : st.w[2]);
        int row = (grp - g0) * rpg + warp / ks;
        float acc[N];
#pragma unroll
        for (int t = 0; t < N; t++) acc[t] = 0.0f;
        if (row < m) {
            const uint4 *wr = (const uint4 *)(w + (size_t)row * k);
            int j = jbeg + lane;
            for (; j + 32 * (U - 1) < jend; j += 32 * U) {
                uint4 q[U];
#pragma unroll
                for (int u = 0; u < U; u++) q[u] = ld_stream(wr + j + 32 * u);
#pragma unroll
                for (int u = 0; u < U; u++) dot16<WT, N>::run(q[u], x, (size_t)k, (j + 32 * u) * V, acc);
            }
            for (; j < jend; j += 32) dot16<WT, N>::run(ld_stream(wr + j), x, (size_t)k, j * V, acc);
        }
#pragma unroll
        for (int t = 0; t < N; t++) {
            float s = acc[t];
#pragma unroll
            for (int o = 16; o; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
            acc[t] = s;
        }
        if (ks > 1) {
            if (lane == 0) {
#pragma unroll
                for (int t = 0; t < N; t++) part[buf][warp][t] = acc[t];
            }
            __syncthreads();
            if (seg == 0 && lane == 0)
                for (int s2 = 1; s2 < ks; s2++) {
#pragma unroll
                    for (int t = 0; t < N; t++) acc[t] += part[buf][warp + s2][t];
                }
        }
        if (row < m && seg == 0 && lane == 0) {
            const void *bias = mi == 0 ? st.bias[0] : mi == 1 ? st.bias[1] : st.bias[2];
            float *y = mi == 0 ? st.y[0] : mi == 1 ? st.y[1] : st.y[2];
            float b = bias ? cu_mat_get(bias, mi == 0 ? st.bdt[0] : mi == 1 ? st.bdt[1] : st.bdt[2], row) : 0.0f;
#pragma unroll
            for (int t = 0; t < N; t++) y[(size_t)t * m + row] = acc[t] + b;
        }
    }
}

/* any k, any alignment, any n: warp per row, weights re-read per token */
__global__ void k_gemv_any(const void *w, int dt, const float *x, int n, const void *bias, int bdt, float *y, int m, int k) {
    PDL_ENTRY();
    int row = blockIdx.x * GEMV_WARPS + threadIdx.x / 32, lane = threadIdx.x & 31;
    if (row >= m) return;
    size_t base = (size_t)row * k;
    float b = bias ? cu_mat_get(bias, bdt, row) : 0.0f;
    for (int t = 0; t < n; t++) {
        float s = 0;
        for (int i = lane; i < k; i += 32) s += cu_mat_get(w, dt, base + i) * x[(size_t)t * k + i];
#pragma unroll
        for (int o = 16; o; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
        if (lane == 0) y[(size_t)t * m + row] = s + b;
    }
}

/* launches the GEMV over the set's count matrices (all with k columns) */
template <typename WT>
static void gemv_n(be_ctx *c, int n, gemv_set st, int count, const float *x, int k) {
    /* warps per row: slices of at least 128 16-byte loads (4 per lane) */
    int ks = 1, nv = k / (int)(16 / sizeof(WT));
    while (ks < GEMV_WARPS && nv / (ks * 2) >= 128) ks *= 2;
    int rpg = GEMV_WARPS / ks, end = 0;
    for (int i = 0; i < 3; i++) {
        if (i < count) end += (st.m[i] + rpg - 1) / rpg;
        st.gend[i] = end;
    }
    unsigned groups = (unsigned)end;
    switch (n) {
#define CASE(N)                                                                                      \
    case N: {                                                                                        \
        unsigned most = (unsigned)c->n_sm * gemv_blocks_per_sm<WT, N>();                             \
        cu_launch(c, k_gemv<WT, N>, dim3(groups < most ? groups : most), dim3(GEMV_WARPS * 32), 0, st, x, k, ks); \
        break;                                                                                       \
    }
        CASE(1) CASE(2) CASE(3) CASE(4) CASE(5) CASE(6) CASE(7) CASE(8)
#undef CASE
    }
}

static void gemv_launch(be_ctx *c, int n, int dt, gemv_set st, int count, const float *x, int k) {
    if (dt == BE_BF16) gemv_n<__nv_bfloat16>(c, n, st, count, x, k);
    else if (dt == BE_F16) gemv_n<__half>(c, n, st, count, x, k);
    else gemv_n<float>(c, n, st, count, x, k);
}

__global__ void k_round16(const float *x, void *out, int bf16, size_t n) {
    PDL_ENTRY();
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        if (bf16) ((__nv_bfloat16 *)out)[i] = __float2bfloat16_rn(x[i]);
        else ((__half *)out)[i] = __float2half_rn(x[i]);
    }
}

__global__ void k_bias(float *y, const void *bias, int bdt, int m, size_t total) {
    PDL_ENTRY();
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < total; i += (size_t)gridDim.x * blockDim.x)
        y[i] += cu_mat_get(bias, bdt, i % m);
}

enum { PATH_GEMV = 0, PATH_GEMV_ANY = 1, PATH_BLAS = 2 };

void cu_matmul_launcher(be_ctx *c, const cu_rec *r) {
    const float *x = (const float *)r->p[0];
    const void *w = r->p[1], *bias = r->p[2];
    float *y = (float *)r->p[3];
    int n = (int)r->i[0], m = (int)r->i[1], k = (int)r->i[2], dt = (int)r->i[3], bdt = (int)r->i[4], path = (int)r->i[5];
    if (n <= 0 || m <= 0) return;
    if (path == PATH_GEMV) {
        gemv_set st;
        memset(&st, 0, sizeof st);
        st.w[0] = w;
        st.bias[0] = bias;
        st.y[0] = y;
        st.m[0] = m;
        st.bdt[0] = bdt;
        gemv_launch(c, n, dt, st, 1, x, k);
        CU_LAUNCHED(c, "gemv");
        return;
    }
    if (path == PATH_GEMV_ANY) {
        cu_launch(c, k_gemv_any, dim3(cu_blocks(m, GEMV_WARPS)), dim3(GEMV_WARPS * 32), 0, w, dt, x, n, bias, bdt, y, m, k);
        CU_LAUNCHED(c, "gemv (any)");
        return;
    }
    const float one = 1.0f, zero = 0.0f;
    if (dt == BE_F32) {
        cu_check_blas(c, cublasSgemm(c->blas, CUBLAS_OP_T, CUBLAS_OP_N, m, n, k, &one, (const float *)w, k, x, k, &zero, y, m),
                      "cublasSgemm");
    } else {
        size_t total = (size_t)n * k;
        unsigned g = cu_blocks(total, 256);
        if (!r->i[6]) {   /* else act16 already holds x rounded (q/k/v and gate/up share their input) */
            cu_launch(c, k_round16, dim3(g > 132 * 16 ? 132 * 16 : g), dim3(256), 0, x, (void *)r->p[4], dt == BE_BF16, total);
            if (CU_LAUNCHED(c, "round to 16-bit")) return;
        }
        cudaDataType t = dt == BE_BF16 ? CUDA_R_16BF : CUDA_R_16F;
        cu_check_blas(c, cublasGemmEx(c->blas, CUBLAS_OP_T, CUBLAS_OP_N, m, n, k, &one, w, t, k, r->p[4], t, k, &zero, y, CUDA_R_32F,
                                      m, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
                      "cublasGemmEx");
    }
    if (bias) {
        size_t total = (size_t)n * m;
        unsigned g = cu_blocks(total, 256);
        cu_launch(c, k_bias, dim3(g > 132 * 16 ? 132 * 16 : g), dim3(256), 0, y, bias, bdt, m, total);
        CU_LAUNCHED(c, "bias");
    }
}

void cu_op_matmul(be_ctx *c, const float *x, int n, const be_mat *w, const be_mat *bias, float *y) {
    cu_rec r;
    memset(&r, 0, sizeof r);
    int k = (int)w->cols, vec = 16 / (int)be_dtype_size(w->dt);
    int path = PATH_BLAS;
    if (n <= GEMV_MAX_N) path = (k % vec == 0 && ((uintptr_t)x & 15) == 0 && (k % 4) == 0) ? PATH_GEMV : PATH_GEMV_ANY;
    if (path == PATH_BLAS && w->dt != BE_F32 && !cu_ensure(c, &c->act16, &c->act16_n, (size_t)n * k * 2)) return;
    r.fn = cu_matmul_launcher;
    r.p[0] = x;
    r.p[1] = w->dev;
    r.p[2] = bias ? bias->dev : NULL;
    r.p[3] = y;
    r.p[4] = path == PATH_BLAS ? c->act16 : NULL;
    r.i[0] = n;
    r.i[1] = w->rows;
    r.i[2] = k;
    r.i[3] = w->dt;
    r.i[4] = bias ? bias->dt : 0;
    r.i[5] = path;
    if (path == PATH_BLAS && w->dt != BE_F32) {
        size_t len = (size_t)n * k;
        r.i[6] = c->act16_src == x && c->act16_len == len && c->act16_dt == (int)w->dt;
        cu_submit(c, &r);
        /* y must not overlap x for the rounded copy to stay valid */
        const char *xb = (const char *)x, *yb = (const char *)y;
        int overlap = yb < xb + len * 4 && xb < yb + (size_t)n * w->rows * 4;
        c->act16_src = overlap ? NULL : x;
        c->act16_len = len;
        c->act16_dt = (int)w->dt;
        return;
    }
    c->act16_src = NULL;
    cu_submit(c, &r);
}

/* ---------------------------------------------------- several matrices */

static void l_matmul_multi(be_ctx *c, const cu_rec *r) {
    gemv_set st;
    memset(&st, 0, sizeof st);
    int count = (int)r->i[3];
    for (int i = 0; i < count; i++) {
        st.w[i] = r->p[1 + i];
        st.bias[i] = r->p[4 + i];
        st.y[i] = (float *)r->p[7 + i];
        st.m[i] = (int)r->i[4 + i];
        st.bdt[i] = (int)r->i[7 + i];
    }
    gemv_launch(c, (int)r->i[0], (int)r->i[2], st, count, (const float *)r->p[0], (int)r->i[1]);
    CU_LAUNCHED(c, "gemv (several matrices)");
}

void cu_op_matmul_multi(be_ctx *c, const float *x, int n, int count, const be_mat *const *w, const be_mat *const *bias, float *const *y) {
    int k = (int)w[0]->cols, vec = 16 / (int)be_dtype_size(w[0]->dt);
    int one = count < 1 || count > 3 || n > GEMV_MAX_N || k % vec || k % 4 || ((uintptr_t)x & 15);
    for (int i = 1; i < count && !one; i++) one = w[i]->cols != k || w[i]->dt != w[0]->dt;
    if (one) {   /* prefill (cuBLAS) or mixed shapes: one matmul each */
        for (int i = 0; i < count; i++) cu_op_matmul(c, x, n, w[i], bias[i], y[i]);
        return;
    }
    cu_rec r;
    memset(&r, 0, sizeof r);
    r.fn = l_matmul_multi;
    r.p[0] = x;
    r.i[0] = n;
    r.i[1] = k;
    r.i[2] = w[0]->dt;
    r.i[3] = count;
    for (int i = 0; i < count; i++) {
        r.p[1 + i] = w[i]->dev;
        r.p[4 + i] = bias[i] ? bias[i]->dev : NULL;
        r.p[7 + i] = y[i];
        r.i[4 + i] = w[i]->rows;
        r.i[7 + i] = bias[i] ? bias[i]->dt : 0;
    }
    cu_submit(c, &r);
}
