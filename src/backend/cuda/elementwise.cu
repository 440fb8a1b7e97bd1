/*
 * elementwise.cu — the CUDA backend's row and element ops: embedding lookup,
 * RMSNorm (one warp per short row, one block per long row, f32 sums;
 * optionally after the residual add, x += t, in the same pass), RoPE
 * (angle float(pos) * inv_freq in f32 and accurate cosf/sinf, as the CPU and
 * transformers do), SwiGLU, residual add, row gather, KV-cache writes (f32 or
 * f16, round to nearest even), a device argmax, and the random fill used by
 * benchmarks. Host arrays reach the kernels through cu_stage.
 * References: cpu/ops.c and cpu/ref.c (the definitions these match).
 */
#include <math.h>
#include <string.h>
#include "backend/cuda/cuda.cuh"
#include "backend/cuda/cuda-api.h"

/* ---------------------------------------------------------------- embed */

__global__ void k_embed(const void *tab, int dt, const int32_t *ids, int n, int cols, float *out) {
    PDL_ENTRY();
    size_t total = (size_t)n * cols;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < total; i += (size_t)gridDim.x * blockDim.x) {
        size_t t = i / cols, col = i % cols;
        out[i] = cu_mat_get(tab, dt, (size_t)ids[t] * cols + col);
    }
}

static void l_embed(be_ctx *c, const cu_rec *r) {
    size_t total = (size_t)r->i[0] * r->i[1];
    unsigned g = cu_blocks(total, 256);
    cu_launch(c, k_embed, dim3(g > 65535 ? 65535 : g), dim3(256), 0, r->p[0], (int)r->i[2], (const int32_t *)r->p[1], (int)r->i[0],
                                                          (int)r->i[1], (float *)r->p[2]);
    CU_LAUNCHED(c, "embed");
}

void cu_op_embed(be_ctx *c, const be_mat *tab, const int32_t *ids, int n, float *out) {
    cu_rec r;
    memset(&r, 0, sizeof r);
    r.fn = l_embed;
    r.p[0] = tab->dev;
    r.p[1] = cu_stage(c, ids, sizeof(int32_t) * (size_t)n);
    r.p[2] = out;
    r.i[0] = n;
    r.i[1] = tab->cols;
    r.i[2] = tab->dt;
    cu_submit(c, &r);
}

/* -------------------------------------------------------------- rmsnorm */

/* a 16-bit copy of an f32 result for the cuBLAS matmul that follows (prefill) */
__device__ __forceinline__ void put16(void *p, size_t i, float v, int bf16) {
    if (bf16) ((__nv_bfloat16 *)p)[i] = __float2bfloat16_rn(v);
    else ((__half *)p)[i] = __float2half_rn(v);
}

/* eagerly (prefill), an op whose output a cuBLAS matmul will read next also
 * writes it rounded into the context's act16 buffer; returns that buffer or NULL */
static void *side16(be_ctx *c, size_t len) {
    if (c->in_step || len < 8 * 256) return NULL;
    if (!cu_ensure(c, &c->act16, &c->act16_n, len * 2)) return NULL;
    return c->act16;
}

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
    for (int o = 16; o; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

/* one warp per row */
__global__ void k_rmsnorm_warp(float *x, const float *t, int n, int dim, const void *w, int wdt, float w_add, float eps, float *y, void *y16,
                               int bf16) {
    PDL_ENTRY();
    int row = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32, lane = threadIdx.x % 32;
    if (row >= n) return;
    float *a = x + (size_t)row * dim;
    float ss = 0;
    if (t) {   /* x += t first (the residual add fused with the norm); each thread rereads only its own */
        const float *tr = t + (size_t)row * dim;
        for (int i = lane; i < dim; i += 32) { float v = a[i] + tr[i]; a[i] = v; ss += v * v; }
    } else {
        for (int i = lane; i < dim; i += 32) ss += a[i] * a[i];
    }
    ss = warp_sum(ss);
    float inv = 1.0f / sqrtf(ss / (float)dim + eps);
    float *o = y + (size_t)row * dim;
    for (int i = lane; i < dim; i += 32) {
        float v = a[i] * inv * ((w ? cu_mat_get(w, wdt, i) : 1.0f) + w_add);
        o[i] = v;
        if (y16) put16(y16, (size_t)row * dim + i, v, bf16);
    }
}

/* one block per row */
__global__ void k_rmsnorm_block(float *x, const float *t, int dim, const void *w, int wdt, float w_add, float eps, float *y, void *y16,
                                int bf16) {
    PDL_ENTRY();
    __shared__ float red[32];
    float *a = x + (size_t)blockIdx.x * dim;
    float ss = 0;
    if (t) {
        const float *tr = t + (size_t)blockIdx.x * dim;
        for (int i = threadIdx.x; i < dim; i += blockDim.x) { float v = a[i] + tr[i]; a[i] = v; ss += v * v; }
    } else {
        for (int i = threadIdx.x; i < dim; i += blockDim.x) ss += a[i] * a[i];
    }
    ss = warp_sum(ss);
    if (threadIdx.x % 32 == 0) red[threadIdx.x / 32] = ss;
    __syncthreads();
    if (threadIdx.x < 32) {
        float v = threadIdx.x < blockDim.x / 32 ? red[threadIdx.x] : 0.0f;
        v = warp_sum(v);
        if (threadIdx.x == 0) red[0] = v;
    }
    __syncthreads();
    float inv = 1.0f / sqrtf(red[0] / (float)dim + eps);
    float *o = y + (size_t)blockIdx.x * dim;
    for (int i = threadIdx.x; i < dim; i += blockDim.x) {
        float v = a[i] * inv * ((w ? cu_mat_get(w, wdt, i) : 1.0f) + w_add);
        o[i] = v;
        if (y16) put16(y16, (size_t)blockIdx.x * dim + i, v, bf16);
    }
}

static void l_rmsnorm(be_ctx *c, const cu_rec *r) {
    int n = (int)r->i[0], dim = (int)r->i[1];
    if (n <= 0) return;
    float *x = (float *)r->p[0];
    const float *t = (const float *)r->p[4];
    if (dim <= 512)
        cu_launch(c, k_rmsnorm_warp, dim3(cu_blocks(n, 8)), dim3(256), 0, x, t, n, dim, r->p[1], (int)r->i[2], r->f[0], r->f[1],
                  (float *)r->p[2], (void *)r->p[3], (int)r->i[3]);
    else
        cu_launch(c, k_rmsnorm_block, dim3(n), dim3(dim >= 2048 ? 512 : 256), 0, x, t, dim, r->p[1], (int)r->i[2], r->f[0], r->f[1],
                  (float *)r->p[2], (void *)r->p[3], (int)r->i[3]);
    CU_LAUNCHED(c, "rmsnorm");
}

/* t != NULL: x += t, then the norm (x is written) */
static void rmsnorm_op(be_ctx *c, float *x, const float *t, int n, int dim, const be_mat *w, float w_add, float eps, float *y) {
    cu_rec r;
    memset(&r, 0, sizeof r);
    r.fn = l_rmsnorm;
    r.p[0] = x;
    r.p[1] = w ? w->dev : NULL;
    r.p[2] = y;
    r.p[4] = t;
    r.i[0] = n;
    r.i[1] = dim;
    r.i[2] = w ? w->dt : 0;
    r.f[0] = w_add;
    r.f[1] = eps;
    size_t len = (size_t)n * dim;
    void *y16 = dim >= 256 && n > 8 ? side16(c, len) : NULL;
    r.p[3] = y16;
    r.i[3] = c->act16_dt == BE_F16 ? 0 : 1;
    int dt16 = r.i[3] ? BE_BF16 : BE_F16;
    cu_submit(c, &r);
    if (y16) { c->act16_src = y; c->act16_len = len; c->act16_dt = dt16; }
}

void cu_op_rmsnorm(be_ctx *c, const float *x, int n, int dim, const be_mat *w, float w_add, float eps, float *y) {
    rmsnorm_op(c, (float *)x, NULL, n, dim, w, w_add, eps, y);   /* x is only read when t is NULL */
}

void cu_op_add_rmsnorm(be_ctx *c, float *x, const float *t, int n, int dim, const be_mat *w, float w_add, float eps, float *y) {
    rmsnorm_op(c, x, t, n, dim, w, w_add, eps, y);
}

/* ----------------------------------------------------------------- rope */

/* one thread per (token, head, pair) */
__global__ void k_rope(float *x, int n, int heads, int hd, int rot, const int *pos, const float *inv_freq, int neox) {
    PDL_ENTRY();
    int half = rot / 2;
    size_t total = (size_t)n * heads * half;
    for (size_t w = blockIdx.x * (size_t)blockDim.x + threadIdx.x; w < total; w += (size_t)gridDim.x * blockDim.x) {
        int i = (int)(w % half);
        size_t th = w / half;
        int t = (int)(th / heads);
        float ang = (float)pos[t] * inv_freq[i];
        float cs = cosf(ang), sn = sinf(ang);
        float *v = x + th * hd;
        int i0 = neox ? i : 2 * i, i1 = neox ? i + half : 2 * i + 1;
        float a = v[i0], b = v[i1];
        v[i0] = a * cs - b * sn;
        v[i1] = b * cs + a * sn;
    }
}

static void l_rope(be_ctx *c, const cu_rec *r) {
    size_t total = (size_t)r->i[0] * r->i[1] * (r->i[3] / 2);
    if (!total) return;
    unsigned g = cu_blocks(total, 256);
    cu_launch(c, k_rope, dim3(g > 65535 ? 65535 : g), dim3(256), 0, (float *)r->p[0], (int)r->i[0], (int)r->i[1], (int)r->i[2], (int)r->i[3],
                                                         (const int *)r->p[1], (const float *)r->p[2], (int)r->i[4]);
    CU_LAUNCHED(c, "rope");
}

void cu_op_rope(be_ctx *c, float *x, int n, int heads, int hd, int rot, const int *pos, const float *inv_freq, int neox) {
    cu_rec r;
    memset(&r, 0, sizeof r);
    r.fn = l_rope;
    r.p[0] = x;
    r.p[1] = cu_stage(c, pos, sizeof(int) * (size_t)n);
    r.p[2] = cu_stage(c, inv_freq, sizeof(float) * (size_t)(rot / 2));
    r.i[0] = n;
    r.i[1] = heads;
    r.i[2] = hd;
    r.i[3] = rot;
    r.i[4] = neox;
    cu_submit(c, &r);
}

/* ------------------------------------------------------ swiglu, add, gather */

__global__ void k_swiglu(const float *g, const float *u, float *o, size_t n, void *o16, int bf16) {
    PDL_ENTRY();
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        float a = g[i];
        float v = a / (1.0f + expf(-a)) * u[i];
        o[i] = v;
        if (o16) put16(o16, i, v, bf16);
    }
}

__global__ void k_add(float *y, const float *x, size_t n) {
    PDL_ENTRY();
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) y[i] += x[i];
}

static unsigned grid_for(size_t n) {
    unsigned g = cu_blocks(n, 256);
    return g > 132 * 16 ? 132 * 16 : (g ? g : 1);
}

static void l_swiglu(be_ctx *c, const cu_rec *r) {
    size_t n = (size_t)r->i[0];
    if (!n) return;
    cu_launch(c, k_swiglu, dim3(grid_for(n)), dim3(256), 0, (const float *)r->p[0], (const float *)r->p[1], (float *)r->p[2], n,
              (void *)r->p[3], (int)r->i[1]);
    CU_LAUNCHED(c, "swiglu");
}

void cu_op_swiglu(be_ctx *c, const float *gate, const float *up, float *out, size_t n) {
    cu_rec r;
    memset(&r, 0, sizeof r);
    r.fn = l_swiglu;
    r.p[0] = gate;
    r.p[1] = up;
    r.p[2] = out;
    r.i[0] = (int64_t)n;
    void *o16 = side16(c, n);
    r.p[3] = o16;
    r.i[1] = c->act16_dt == BE_F16 ? 0 : 1;
    int dt16 = r.i[1] ? BE_BF16 : BE_F16;
    cu_submit(c, &r);
    if (o16) { c->act16_src = out; c->act16_len = n; c->act16_dt = dt16; }
}

static void l_add(be_ctx *c, const cu_rec *r) {
    size_t n = (size_t)r->i[0];
    if (!n) return;
    cu_launch(c, k_add, dim3(grid_for(n)), dim3(256), 0, (float *)r->p[0], (const float *)r->p[1], n);
    CU_LAUNCHED(c, "add");
}

void cu_op_add(be_ctx *c, float *y, const float *x, size_t n) {
    cu_rec r;
    memset(&r, 0, sizeof r);
    r.fn = l_add;
    r.p[0] = y;
    r.p[1] = x;
    r.i[0] = (int64_t)n;
    cu_submit(c, &r);
}

__global__ void k_gather(const float *x, int dim, const int *rows, int n, float *y) {
    PDL_ENTRY();
    size_t total = (size_t)n * dim;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < total; i += (size_t)gridDim.x * blockDim.x)
        y[i] = x[(size_t)rows[i / dim] * dim + i % dim];
}

static void l_gather(be_ctx *c, const cu_rec *r) {
    size_t total = (size_t)r->i[0] * r->i[1];
    if (!total) return;
    cu_launch(c, k_gather, dim3(grid_for(total)), dim3(256), 0, (const float *)r->p[0], (int)r->i[0], (const int *)r->p[1], (int)r->i[1],
                                                     (float *)r->p[2]);
    CU_LAUNCHED(c, "gather");
}

void cu_op_gather(be_ctx *c, const float *x, int dim, const int *rows, int n, float *y) {
    cu_rec r;
    memset(&r, 0, sizeof r);
    r.fn = l_gather;
    r.p[0] = x;
    r.p[1] = cu_stage(c, rows, sizeof(int) * (size_t)n);
    r.p[2] = y;
    r.i[0] = dim;
    r.i[1] = n;
    cu_submit(c, &r);
}

/* ------------------------------------------------------------- kv write */

/* one block per (b, i, kv head); threads over hd */
__global__ void k_kv_write(const float *src, void *cache, int f16, int L, int n_kv, int hd, int cap, const int *pos0, const int *len) {
    PDL_ENTRY();
    int h = blockIdx.x % n_kv, i = (blockIdx.x / n_kv) % L, b = blockIdx.x / n_kv / L;
    if (i >= len[b]) return;
    const float *s = src + (((size_t)b * L + i) * n_kv + h) * hd;
    size_t off = (((size_t)b * n_kv + h) * cap + pos0[b] + i) * hd;
    for (int d = threadIdx.x; d < hd; d += blockDim.x) {
        if (f16) ((__half *)cache)[off + d] = __float2half_rn(s[d]);
        else ((float *)cache)[off + d] = s[d];
    }
}

static void l_kv_write(be_ctx *c, const cu_rec *r) {
    unsigned blocks = (unsigned)(r->i[0] * r->i[1] * r->i[2]);
    if (!blocks) return;
    int hd = (int)r->i[3];
    cu_launch(c, k_kv_write, dim3(blocks), dim3(hd >= 128 ? 128 : 32 * ((hd + 31) / 32)), 0, 
        (const float *)r->p[0], (void *)r->p[1], (int)r->i[5], (int)r->i[1], (int)r->i[2], hd, (int)r->i[4],
        (const int *)r->p[2], (const int *)r->p[3]);
    CU_LAUNCHED(c, "kv_write");
}

void cu_op_kv_write(be_ctx *c, const be_attn *a, const float *src, void *cache, be_dtype dt) {
    cu_rec r;
    memset(&r, 0, sizeof r);
    r.fn = l_kv_write;
    r.p[0] = src;
    r.p[1] = cache;
    r.p[2] = cu_stage(c, a->pos0, sizeof(int) * (size_t)a->B);
    r.p[3] = cu_stage(c, a->len, sizeof(int) * (size_t)a->B);
    r.i[0] = a->B;
    r.i[1] = a->L;
    r.i[2] = a->n_kv_head;
    r.i[3] = a->head_dim;
    r.i[4] = a->cap;
    r.i[5] = dt == BE_F16;
    cu_submit(c, &r);
}

/* --------------------------------------------------------------- argmax */

/* one block per row; first index on ties; NaN never wins */
__global__ void k_argmax(const float *x, int dim, int32_t *out) {
    PDL_ENTRY();
    __shared__ float bv[32];
    __shared__ int bi[32];
    const float *a = x + (size_t)blockIdx.x * dim;
    float best = -INFINITY;
    int idx = dim;   /* dim = none yet */
    for (int i = threadIdx.x; i < dim; i += blockDim.x) {
        float v = a[i];
        if (v > best || (idx == dim && v == v)) { best = v; idx = i; }
    }
#pragma unroll
    for (int o = 16; o; o >>= 1) {
        float ov = __shfl_xor_sync(0xffffffffu, best, o);
        int oi = __shfl_xor_sync(0xffffffffu, idx, o);
        if (ov > best || (ov == best && oi < idx)) { best = ov; idx = oi; }
    }
    if (threadIdx.x % 32 == 0) { bv[threadIdx.x / 32] = best; bi[threadIdx.x / 32] = idx; }
    __syncthreads();
    if (threadIdx.x == 0) {
        for (int w = 1; w < (int)blockDim.x / 32; w++)
            if (bv[w] > best || (bv[w] == best && bi[w] < idx)) { best = bv[w]; idx = bi[w]; }
        out[blockIdx.x] = idx == dim ? 0 : idx;
    }
}

void cu_op_argmax(be_ctx *c, const float *x, int n, int dim, int32_t *out) {
    if (n <= 0) return;
    int32_t *d = NULL;
    /* the result goes through the staging arena's device side */
    cu_go_eager(c);
    const void *slot = cu_stage(c, out, sizeof(int32_t) * (size_t)n);   /* reserves n ints */
    d = (int32_t *)slot;
    cu_launch(c, k_argmax, dim3(n), dim3(1024), 0, x, dim, d);
    if (CU_LAUNCHED(c, "argmax")) return;
    cu_check(c, cudaMemcpyAsync(out, d, sizeof(int32_t) * (size_t)n, cudaMemcpyDeviceToHost, c->stream), "argmax copy");
    cu_check(c, cudaStreamSynchronize(c->stream), "argmax sync");
}

/* ---------------------------------------------------------- random fill */

__device__ __forceinline__ uint64_t mix64(uint64_t z) {
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

__global__ void k_fill(void *p, int dt, size_t n, uint64_t seed, float mean, float std) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        uint64_t h = mix64(seed * 0x9e3779b97f4a7c15ull + i);
        float u = ((float)(h >> 40) * (1.0f / 16777216.0f) * 2.0f - 1.0f) * 1.7320508f;
        float v = mean + std * u;
        if (dt == BE_F32) ((float *)p)[i] = v;
        else if (dt == BE_F16) ((__half *)p)[i] = __float2half_rn(v);
        else ((__nv_bfloat16 *)p)[i] = __float2bfloat16_rn(v);
    }
}

extern "C" int cuda_fill_random(void *dev, be_dtype dt, size_t n, uint64_t seed, float mean, float std) {
    if (!n) return 0;
    k_fill<<<132 * 8, 256>>>(dev, (int)dt, n, seed, mean, std);
    if (cudaGetLastError() != cudaSuccess) return 1;
    return cudaDeviceSynchronize() != cudaSuccess;
}
