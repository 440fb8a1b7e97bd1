/*
 * gemm.cu — y[n][m] = x[n][k] . w[m][k]^T (+ bias) on the device.
 *
 * Decode (one row; up to GEMV_MAX_N when batch-invariant or by
 * CINFER_CUDA_GEMV_ROWS): a memory-bound GEMV that streams each weight row once:
 * a persistent grid, 1-8 warps per output row (each a slice), 16-byte
 * non-allocating loads of the stored dtype (8 bf16/f16 or 4 f32 per load),
 * x (f32, few rows, L1-resident) read alongside, all n rows accumulated per
 * weight load in f32, a warp-shuffle sum at the end. One token (n = 1) takes
 * a warp per row, eight loads in flight per lane, two blocks per SM: measured
 * on the H200 (bench/gpu/gemv-sweep.cu) the 32 layers of llama-3-8b stream at
 * 4.17 TB/s (90% of a pure read) that way, against 3.85 TB/s for the
 * slice-per-warp layout that batches keep. The GLU form computes gate and up
 * rows together and writes silu(gate) * up. Rows whose length or alignment
 * does not allow 16-byte loads take a scalar warp-per-row kernel.
 *
 * Batches of 2 rows and more take cuBLAS by default: measured on the H200
 * (bench-cuda BENCH_AGG, llama-3-8b, CINFER_CUDA_GEMV_ROWS=8 against 1),
 * decode steps of 2/4/8 rows took 7.4/11.5/21.0 ms on this GEMV and
 * 5.4/5.7/6.3 ms on cuBLAS (one row: 4.1 ms on the GEMV).
 *
 * A tensor-core kernel for 2..64 rows (weights streamed once, mma.sync
 * m16n8k16, x staged in shared memory per 128 columns and shared by 128
 * features, split-K with an in-order reduction, q/k/v and gate/up in one
 * launch) was measured against cuBLAS in the same calls (bench-cuda
 * BENCH_AGG, llama-3-8b, 2026-12-01): 6.19/9.52/14.33 ms per step at 8/32/64
 * rows against cuBLAS's 6.33/7.85/9.11 — level at 8 rows, slower beyond — so
 * it was not kept (commits 5727e54, 36083de, af4680f hold it).
 *
 * Prefill and batches: cuBLAS. 16-bit weights: x is rounded to the weight's
 * dtype (as transformers computes in bf16/f16; consecutive matmuls of one
 * input, q/k/v and gate/up, round it once) and multiplied by
 * cublasGemmEx with f32 accumulation and f32 output; f32 weights use SGEMM
 * in plain f32 (no TF32). Row-major y = x w^T is column-major
 * y^T = w^T(op T) x, so w is the transposed A operand with lda = k.
 *
 * Batch-invariant mode (be_ops.batch_invariant): the bf16 rounding above
 * makes a row's result depend on how many rows share its matmul (n <= 8 keeps
 * f32). In this mode every matmul runs as GEMVs over chunks of at most 8 rows
 * with f32 activations, one slice layout whatever n (ks as for n > 1) and the
 * input norm never folded into the GEMV, so each output element is summed in
 * the same order whatever the batch. Weights are re-read per chunk: slower
 * for large batches, which is the price of the switch.
 */
#include <string.h>
#include "backend/cuda/gemv.cuh"

/* acc[t] += w[0..8) . x[t][e..e+8) for the N rows of x (row stride k) */
template <int N> __device__ __forceinline__ void dot8(const float *w, const float *x, size_t k, int e, float *acc) {
#pragma unroll
    for (int t = 0; t < N; t++) {
        float4 a = *(const float4 *)(x + t * k + e), b = *(const float4 *)(x + t * k + e + 4);
        acc[t] += w[0] * a.x + w[1] * a.y + w[2] * a.z + w[3] * a.w + w[4] * b.x + w[5] * b.y + w[6] * b.z + w[7] * b.w;
    }
}

/* the 16 bytes q hold V weights starting at element e; acc[t] += w . x[t][e..e+V) */
template <typename WT, int N> struct dot16;

template <int N> struct dot16<__nv_bfloat16, N> {
    static __device__ __forceinline__ void run(uint4 q, const float *x, size_t k, int e, float *acc) {
        float w[8];
        uint32_t u[4] = {q.x, q.y, q.z, q.w};
#pragma unroll
        for (int i = 0; i < 4; i++) { w[2 * i] = __uint_as_float(u[i] << 16); w[2 * i + 1] = __uint_as_float(u[i] & 0xffff0000u); }
        dot8<N>(w, x, k, e, acc);
    }
};

template <int N> struct dot16<__half, N> {
    static __device__ __forceinline__ void run(uint4 q, const float *x, size_t k, int e, float *acc) {
        float w[8];
        uint32_t u[4] = {q.x, q.y, q.z, q.w};
#pragma unroll
        for (int i = 0; i < 4; i++) {
            float2 f = __half22float2(*(__half2 *)&u[i]);
            w[2 * i] = f.x;
            w[2 * i + 1] = f.y;
        }
        dot8<N>(w, x, k, e, acc);
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
template <int N> constexpr int gemv_unroll() { return N == 1 ? 8 : 4; }

/* acc[t] += w[row][jbeg..jend) . x[t][..] for one warp's slice (16-byte units) */
template <typename WT, int N>
__device__ __forceinline__ void gemv_slice(const WT *w, int row, const float *x, int k, int jbeg, int jend, int lane, float *acc) {
    constexpr int V = 16 / sizeof(WT), U = gemv_unroll<N>();
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

/* The kernel before this one moves little memory (decode attention): the
 * rows this warp will read go to L2 now (one bulk prefetch per row, before
 * the grid-dependency wait), so HBM streams them while that kernel runs.
 * Not done after a GEMV: there the bandwidth is already taken. */
template <typename WT>
__device__ void gemv_prefetch(const gemv_set &st, int rpg, int wrow, int k) {
    unsigned bytes = (unsigned)k * sizeof(WT);
    for (int grp = blockIdx.x; grp < st.gend[2]; grp += gridDim.x) {
        int row, mi = gemv_group(st, grp, rpg, &row);
        row += wrow;
        if (row >= st.m[mi]) continue;
        for (int h = 0; h < (st.glu ? 2 : 1); h++) {
            cu_l2_prefetch((const char *)st.w[st.glu ? h : mi] + (size_t)row * bytes, bytes);
        }
    }
}

template <typename WT, int N>
__global__ void __launch_bounds__(GEMV_WARPS * 32, GEMV_BLOCKS_PER_SM) k_gemv(gemv_set st, const float *x, int k, int ks) {
    __shared__ float part[2][GEMV_WARPS][2][N];
    __shared__ float red[GEMV_WARPS];
    extern __shared__ float xs[];   /* [N][k] with a norm prologue */
    int warp = threadIdx.x / 32, lane = threadIdx.x & 31;
    int rpg = GEMV_WARPS / ks, seg = warp % ks, ngroups = st.gend[2];
    constexpr int V = 16 / sizeof(WT);
    if (st.prefetch && seg == 0 && lane == 0) gemv_prefetch<WT>(st, rpg, warp / ks, k);
    float4 nw[GEMV_NORM_PER];
    gemv_before_wait(st, k, nw);
    PDL_ENTRY();
    if (st.norm) {
        gemv_norm_prologue<N>(st, x, k, xs, red, 0, nw);
        x = xs;
    }
    int nv = k / V, slice = (nv + ks - 1) / ks;
    int jbeg = seg * slice, jend = min(nv, jbeg + slice);
    int buf = 0;
    for (int grp = blockIdx.x; grp < ngroups; grp += gridDim.x, buf ^= 1) {
        int row, mi = gemv_group(st, grp, rpg, &row), m = st.m[mi];
        row += warp / ks;
        float acc[2][N];
#pragma unroll
        for (int t = 0; t < N; t++) acc[0][t] = acc[1][t] = 0.0f;
        if (row < m) {
            gemv_slice<WT, N>((const WT *)(mi == 0 ? st.w[0] : mi == 1 ? st.w[1] : st.w[2]), row, x, k, jbeg, jend, lane, acc[0]);
            if (st.glu) gemv_slice<WT, N>((const WT *)st.w[1], row, x, k, jbeg, jend, lane, acc[1]);
        }
        warp_sum<N>(acc[0]);
        if (st.glu) warp_sum<N>(acc[1]);
        if (ks > 1) {
            if (lane == 0) {
#pragma unroll
                for (int t = 0; t < N; t++) part[buf][warp][0][t] = acc[0][t], part[buf][warp][1][t] = acc[1][t];
            }
            __syncthreads();
            if (seg == 0 && lane == 0)
                for (int s2 = 1; s2 < ks; s2++) {
#pragma unroll
                    for (int t = 0; t < N; t++) acc[0][t] += part[buf][warp + s2][0][t], acc[1][t] += part[buf][warp + s2][1][t];
                }
        }
        if (row < m && seg == 0 && lane == 0) gemv_store<N>(st, mi, row, m, acc);
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
    /* warps per row: one for a single token; for batches (and always when batch-invariant),
     * slices of at least 128 16-byte loads */
    int ks = 1, nv = k / (int)(16 / sizeof(WT));
    while ((n > 1 || c->batch_inv) && ks < GEMV_WARPS && nv / (ks * 2) >= 128) ks *= 2;
    unsigned groups = gemv_groups(&st, count, GEMV_WARPS / ks);
    if (!groups || n <= 0) return;   /* no rows or no tokens: nothing to launch */
    size_t smem = st.norm ? sizeof(float) * (size_t)n * k : 0;
    st.prefetch = c->prefetch && c->light_prev;
    switch (n) {
#define CASE(N)                                                                                      \
    case N: {                                                                                        \
        unsigned most = (unsigned)c->n_sm * GEMV_BLOCKS_PER_SM;                             \
        cu_launch(c, k_gemv<WT, N>, dim3(groups < most ? groups : most), dim3(GEMV_WARPS * 32), smem, st, x, k, ks); \
        break;                                                                                       \
    }
        CASE(1) CASE(2) CASE(3) CASE(4) CASE(5) CASE(6) CASE(7) CASE(8)
#undef CASE
    }
}

static void gemv_launch(be_ctx *c, int n, int dt, gemv_set st, int count, const float *x, int k) {
    if (dt == BE_Q4 || dt == BE_Q8) cu_gemv_affine(c, n, dt, st, count, x, k);
    else if (dt == BE_BF16) gemv_n<__nv_bfloat16>(c, n, st, count, x, k);
    else if (dt == BE_F16) gemv_n<__half>(c, n, st, count, x, k);
    else gemv_n<float>(c, n, st, count, x, k);
}

/* out[i] = x[i] rounded to 16 bits; idx (device): row r of out (rows of k) is row idx[r] of x */
__global__ void k_round16(const float *x, const int32_t *idx, int k, void *out, int bf16, size_t n) {
    PDL_ENTRY();
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        const float v = idx ? x[(size_t)idx[i / k] * k + i % k] : x[i];
        if (bf16) ((__nv_bfloat16 *)out)[i] = __float2bfloat16_rn(v);
        else ((__half *)out)[i] = __float2half_rn(v);
    }
}

__global__ void k_bias(float *y, const void *bias, int bdt, int m, size_t total) {
    PDL_ENTRY();
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < total; i += (size_t)gridDim.x * blockDim.x)
        y[i] += cu_mat_get(bias, bdt, i % m);
}

int cu_round16(be_ctx *c, const float *x, const int32_t *idx, int k, void *out, int dt, size_t total) {
    unsigned g = cu_blocks(total, 256);
    cu_launch(c, k_round16, dim3(g > 132 * 16 ? 132 * 16 : g), dim3(256), 0, x, idx, k, out, dt == BE_BF16, total);
    return CU_LAUNCHED(c, "round to 16-bit");
}

/* one matrix: the 16-byte GEMV goes through the several-matrices record (l_matmul_multi) */
enum { PATH_GEMV_ANY = 1, PATH_BLAS = 2 };

void cu_matmul_launcher(be_ctx *c, const cu_rec *r) {
    const float *x = (const float *)r->p[0];
    const void *w = r->p[1], *bias = r->p[2];
    float *y = (float *)r->p[3];
    int n = (int)r->i[0], m = (int)r->i[1], k = (int)r->i[2], dt = (int)r->i[3], bdt = (int)r->i[4], path = (int)r->i[5];
    if (n <= 0 || m <= 0) return;
    if (path == PATH_GEMV_ANY) {
        cu_launch(c, k_gemv_any, dim3(cu_blocks(m, GEMV_WARPS)), dim3(GEMV_WARPS * 32), 0, w, dt, x, n, bias, bdt, y, m, k);
        CU_LAUNCHED(c, "gemv (any)");
        return;
    }
    const float one = 1.0f, beta = r->i[7] ? 1.0f : 0.0f;   /* i[7]: y += (the residual add) */
    if (dt == BE_F32) {
        cu_check_blas(c, cublasSgemm(c->blas, CUBLAS_OP_T, CUBLAS_OP_N, m, n, k, &one, (const float *)w, k, x, k, &beta, y, m),
                      "cublasSgemm");
    } else {
        /* i[6]: act16 already holds x rounded (q/k/v and gate/up share their input) */
        if (!r->i[6] && cu_round16(c, x, NULL, k, (void *)r->p[4], dt, (size_t)n * k)) return;
        cudaDataType t = dt == BE_BF16 ? CUDA_R_16BF : CUDA_R_16F;
        cu_check_blas(c, cublasGemmEx(c->blas, CUBLAS_OP_T, CUBLAS_OP_N, m, n, k, &one, w, t, k, r->p[4], t, k, &beta, y, CUDA_R_32F,
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

/* ---------------------------------------------------- several matrices */

/* count (2..3) matrices of one shape and one input through cuBLAS in one batched launch (gate/up
 * beyond the GEMV's rows): the input rounded to 16 bits once (or the producer's copy, i[6]). p[5]:
 * the staged pointer arrays A[3] (weights), B[3] (the rounded input), C[3] (outputs). Measured on
 * the H200 (llama-3-8b, 8/32/64 sequences decoding): 1-4% off the step, the GEMM itself no faster
 * (ncu: 64.4 us against 2 x 31.9); q | k, v through cublasGemmGroupedBatchedEx (bf16 in, f32 out)
 * ran as one GEMM each (no grouped kernel in ncu), so matrices of different shapes stay apart. */
static void l_matmul_batched(be_ctx *c, const cu_rec *r) {
    int n = (int)r->i[0], m = (int)r->i[1], k = (int)r->i[2], dt = (int)r->i[3], count = (int)r->i[5];
    const void *const *pa = (const void *const *)r->p[5];
    if (!r->i[6] && cu_round16(c, (const float *)r->p[0], NULL, k, (void *)r->p[4], dt, (size_t)n * k)) return;
    cudaDataType t = dt == BE_BF16 ? CUDA_R_16BF : CUDA_R_16F;
    const float one = 1.0f, zero = 0.0f;
    cu_check_blas(c, cublasGemmBatchedEx(c->blas, CUBLAS_OP_T, CUBLAS_OP_N, m, n, k, &one, pa, t, k, pa + 3, t, k, &zero,
                                         (void *const *)(pa + 6), CUDA_R_32F, m, count, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
                  "cublasGemmBatchedEx");
}

static int gemv_rows(const be_ctx *c);
#define BATCHED_MAX_N 256   /* rows up to which (decode batches; prefill keeps one GEMM each) */

/* 1 when l_matmul_batched serves these matrices: beyond the GEMV's rows up to BATCHED_MAX_N,
 * 16-bit weights of one type and one shape, no bias, outputs clear of x */
static int multi_batched_ok(const be_ctx *c, const float *x, int n, int count, const be_mat *const *w, const be_mat *const *bias,
                            float *const *y) {
    int ok = c->batched && count >= 2 && count <= 3 && n > gemv_rows(c) && n <= BATCHED_MAX_N && w[0]->dt != BE_F32;
    size_t xb = (size_t)n * w[0]->cols * 4, yb = (size_t)n * w[0]->rows * 4;
    for (int i = 0; i < count && ok; i++)
        ok = !bias[i] && !be_traits(w[i]->dt)->affine && w[i]->dt == w[0]->dt && w[i]->cols == w[0]->cols && w[i]->rows == w[0]->rows &&
             ((const char *)y[i] + yb <= (const char *)x || (const char *)x + xb <= (const char *)y[i]);
    return ok;
}

static void submit_batched(be_ctx *c, const float *x, int n, int count, const be_mat *const *w, float *const *y) {
    int k = (int)w[0]->cols;
    size_t len = (size_t)n * k;
    if (!cu_ensure(c, &c->act16, &c->act16_n, len * 2)) return;
    cu_rec r;
    memset(&r, 0, sizeof r);
    const void *pa[9] = {0};
    r.fn = l_matmul_batched;
    r.p[0] = x;
    r.p[4] = c->act16;
    for (int i = 0; i < count; i++) {
        pa[i] = w[i]->dev;
        pa[3 + i] = c->act16;
        pa[6 + i] = y[i];
    }
    r.p[5] = cu_stage(c, pa, sizeof pa);
    r.i[0] = n;
    r.i[1] = w[0]->rows;
    r.i[2] = k;
    r.i[3] = w[0]->dt;
    r.i[5] = count;
    r.i[6] = c->act16_src == x && c->act16_len == len && c->act16_dt == (int)w[0]->dt;
    cu_submit(c, &r);
    c->act16_src = x;   /* the outputs are clear of x (multi_batched_ok): the rounded copy stays valid */
    c->act16_len = len;
    c->act16_dt = (int)w[0]->dt;
}

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
    st.glu = (int)r->i[10];
    st.acc = (int)r->i[11];
    st.norm = r->p[10];
    st.norm_dt = (int)r->i[12];
    st.norm_add = r->f[0];
    st.eps = r->f[1];
    for (int i = 0; i < 2; i++) st.pf[i] = (const char *)r->p[11 + i], st.pf_bytes[i] = (unsigned)r->i[14 + i];
    int dt = (int)r->i[2], k = (int)r->i[1];
    if (be_traits((be_dtype)dt)->affine) {   /* i[13]: group | scale dtype << 16 */
        st.group = (int)(r->i[13] & 0xffff);
        st.sdt = (int)(r->i[13] >> 16);
        while ((1 << st.gshift) < st.group) st.gshift++;   /* groups are powers of two (multi_ok) */
        for (int i = 0; i < count; i++)
            cu_affine_parts(r->p[1 + i], st.m[i], k, be_traits((be_dtype)dt)->bits, st.group, st.sdt, &st.w[i], &st.sc[i], &st.bi[i]);
    }
    gemv_launch(c, (int)r->i[0], (int)r->i[2], st, count, (const float *)r->p[0], (int)r->i[1]);
    CU_LAUNCHED(c, "gemv (several matrices)");
}

/* rows up to which a matmul takes the GEMV (f32 activations): one (see above), or up to
 * GEMV_MAX_N by CINFER_CUDA_GEMV_ROWS (for comparisons); always GEMV_MAX_N when
 * batch-invariant (its chunks) */
static int gemv_rows(const be_ctx *c) {
    if (c->batch_inv) return GEMV_MAX_N;
    return c->gemv_rows < 1 ? 1 : c->gemv_rows > GEMV_MAX_N ? GEMV_MAX_N : c->gemv_rows;
}

/* 1 when the count matrices can share one GEMV launch over x (n rows) */
static int multi_ok(const be_ctx *c, const float *x, int n, int count, const be_mat *const *w) {
    /* affine: 4- and 8-bit codes (k_gemv_aff) up to GEMV_MAX_N rows, one group size and scale dtype
     * for the set; other widths go through affine.cu one matrix at a time */
    int aff = be_traits(w[0]->dt)->affine, bits = be_traits(w[0]->dt)->bits;
    if (aff && ((bits != 4 && bits != 8) || !c->aff_gemv || w[0]->cols > AFF_XS_MAX)) return 0;
    int k = (int)w[0]->cols, vec = aff ? 128 / bits : 16 / (int)be_dtype_size(w[0]->dt);
    int ok = count >= 1 && count <= 3 && n <= (aff ? GEMV_MAX_N : gemv_rows(c)) && k % vec == 0 && k % 4 == 0 &&
             ((uintptr_t)x & 15) == 0 && (!aff || (w[0]->group % vec == 0 && !(w[0]->group & (w[0]->group - 1))));
    for (int i = 1; i < count && ok; i++)
        ok = w[i]->cols == k && w[i]->dt == w[0]->dt && (!aff || (w[i]->group == w[0]->group && w[i]->sdt == w[0]->sdt));
    return ok;
}

/* what a GEMV launch does around the products */
typedef struct mm_opts {
    int glu, acc;          /* y[0] = act(.) * (.) of two matrices (glu a BE_ACT_*); y += result */
    const be_mat *norm;    /* input rmsnorm(x) * (norm + norm_add) made in the prologue */
    float norm_add, eps;
} mm_opts;

static void submit_multi(be_ctx *c, const float *x, int n, int count, const be_mat *const *w, const be_mat *const *bias, float *const *y,
                         const mm_opts *o) {
    cu_rec r;
    memset(&r, 0, sizeof r);
    r.fn = l_matmul_multi;
    r.p[0] = x;
    r.i[0] = n;
    r.i[1] = w[0]->cols;
    r.i[2] = w[0]->dt;
    r.i[3] = count;
    r.i[10] = o->glu;
    r.i[11] = o->acc;
    r.p[10] = o->norm ? o->norm->dev : NULL;
    r.i[12] = o->norm ? o->norm->dt : 0;
    r.f[0] = o->norm_add;
    r.f[1] = o->eps;
    r.i[13] = (int64_t)w[0]->group | (int64_t)w[0]->sdt << 16;
    for (int i = 0; i < count; i++) {
        r.p[1 + i] = w[i]->dev;
        r.p[4 + i] = bias[i] ? bias[i]->dev : NULL;
        r.p[7 + i] = y[i];
        r.i[4 + i] = w[i]->rows;
        r.i[7 + i] = bias[i] ? bias[i]->dt : 0;
    }
    for (int i = 0; i < 2; i++) r.p[11 + i] = c->pf_bytes[i] ? c->pf_w[i] : NULL, r.i[14 + i] = c->pf_bytes[i];   /* p[11..12], i[14..15]: the L2 hint */
    cu_submit(c, &r);
}

/* acc: y += the product (the 16-byte GEMV and cuBLAS; the any-shape GEMV has no accumulate) */
void cu_matmul_op(be_ctx *c, const float *x, int n, const be_mat *w, const be_mat *bias, float *y, int acc) {
    if (be_traits(w->dt)->affine && !multi_ok(c, x, n, 1, &w)) {   /* affine.cu */
        cu_affine_matmul(c, x, n, w, bias, y, acc);
        return;
    }
    if (multi_ok(c, x, n, 1, &w)) {
        mm_opts o = {0, acc, NULL, 0.0f, 0.0f};
        submit_multi(c, x, n, 1, &w, &bias, &y, &o);
        return;
    }
    cu_rec r;
    memset(&r, 0, sizeof r);
    int k = (int)w->cols;
    int path = n <= gemv_rows(c) ? PATH_GEMV_ANY : PATH_BLAS;
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
    r.i[7] = acc;
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

/* batch-invariant mode: an op over more than GEMV_MAX_N rows runs as the same op over chunks
 * of at most GEMV_MAX_N rows (x, xn: k columns; y[i]: w[i]->rows columns) */
#define INV_CHUNKS(c, n, call)                                                                          \
    do {                                                                                                \
        if ((c)->batch_inv && (n) > GEMV_MAX_N) {                                                       \
            for (int r0_ = 0; r0_ < (n); r0_ += GEMV_MAX_N) {                                           \
                int nr_ = (n) - r0_ < GEMV_MAX_N ? (n) - r0_ : GEMV_MAX_N;                              \
                call;                                                                                   \
            }                                                                                           \
            return;                                                                                     \
        }                                                                                               \
    } while (0)

/* y[i] + r0 rows, for count matrices */
static void rows_at(float *const *y, const be_mat *const *w, int count, int r0, float **out) {
    for (int i = 0; i < count; i++) out[i] = y[i] + (size_t)r0 * w[i]->rows;
}

void cu_op_matmul(be_ctx *c, const float *x, int n, const be_mat *w, const be_mat *bias, float *y) {
    INV_CHUNKS(c, n, cu_matmul_op(c, x + (size_t)r0_ * w->cols, nr_, w, bias, y + (size_t)r0_ * w->rows, 0));
    cu_matmul_op(c, x, n, w, bias, y, 0);
}

void cu_op_matmul_multi(be_ctx *c, const float *x, int n, int count, const be_mat *const *w, const be_mat *const *bias, float *const *y) {
    float *yc[3];
    INV_CHUNKS(c, n, (rows_at(y, w, count, r0_, yc), cu_op_matmul_multi(c, x + (size_t)r0_ * w[0]->cols, nr_, count, w, bias, yc)));
    if (!multi_ok(c, x, n, count, w)) {   /* prefill (cuBLAS) or mixed shapes: one launch, or one matmul each */
        if (multi_batched_ok(c, x, n, count, w, bias, y)) {
            submit_batched(c, x, n, count, w, y);
            return;
        }
        for (int i = 0; i < count; i++) cu_op_matmul(c, x, n, w[i], bias[i], y[i]);
        return;
    }
    mm_opts o = {0, 0, NULL, 0.0f, 0.0f};
    submit_multi(c, x, n, count, w, bias, y, &o);
}

void cu_op_norm_matmul(be_ctx *c, const float *x, int n, const be_mat *norm, float w_add, float eps, float *xn, int count,
                       const be_mat *const *w, const be_mat *const *bias, float *const *y, int glu) {
    int k = (int)w[0]->cols, ok = multi_ok(c, x, n, count, w) && (!glu || (count == 2 && w[0]->rows == w[1]->rows));
    float *yc[3];
    INV_CHUNKS(c, n, (rows_at(y, w, count, r0_, yc), cu_op_norm_matmul(c, x + (size_t)r0_ * k, nr_, norm, w_add, eps, xn + (size_t)r0_ * k,
                                                                        count, w, bias, yc, glu)));
    if (ok && (size_t)n * k <= GEMV_NORM_MAX && !c->batch_inv) {   /* decode: the norm in the GEMV's prologue */
        mm_opts o = {glu, 0, norm, w_add, eps};
        submit_multi(c, x, n, count, w, bias, y, &o);
        return;
    }
    cu_op_rmsnorm(c, x, n, k, norm, w_add, eps, xn);
    if (glu && multi_ok(c, xn, n, 2, w) && w[0]->rows == w[1]->rows) {
        mm_opts o = {glu, 0, NULL, 0.0f, 0.0f};
        submit_multi(c, xn, n, 2, w, bias, y, &o);
        return;
    }
    cu_op_matmul_multi(c, xn, n, count, w, bias, y);
    if (glu) cu_op_glu(c, y[0], y[1], y[0], (size_t)n * w[0]->rows, glu);
}

/* prefetch_next: a prefix of each matrix (of its codes, for affine ones), together at most l2_next eighths of L2,
 * for the next record to take if it is a GEMV launch (submit_multi; cu_submit drops the hint at every record) */
void cu_op_prefetch_next(be_ctx *c, int count, const be_mat *const *w) {
    for (int i = 0; i < 2; i++) {
        const be_mat *m = i < count ? w[i] : NULL;
        const int64_t bytes = m && m->dev ? m->rows * m->cols * be_traits(m->dt)->bits / 8 : 0,
                      most = (int64_t)c->l2_bytes * c->l2_next / 8 / (count > 0 ? count : 1);
        c->pf_w[i] = m ? m->dev : NULL;
        c->pf_bytes[i] = (bytes < most ? bytes : most) & ~(int64_t)15;
    }
}

void cu_op_matmul_add(be_ctx *c, const float *x, int n, const be_mat *w, const be_mat *bias, float *y, float *tmp) {
    INV_CHUNKS(c, n, cu_op_matmul_add(c, x + (size_t)r0_ * w->cols, nr_, w, bias, y + (size_t)r0_ * w->rows, tmp + (size_t)r0_ * w->rows));
    if (n <= gemv_rows(c) && !multi_ok(c, x, n, 1, &w)) {   /* the any-shape GEMV: product, then the add */
        cu_op_matmul(c, x, n, w, bias, tmp);
        cu_op_add(c, y, tmp, (size_t)n * w->rows);
        return;
    }
    cu_matmul_op(c, x, n, w, bias, y, 1);   /* the GEMV's epilogue or cuBLAS beta = 1 add into y */
}
