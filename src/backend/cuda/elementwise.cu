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
#include <stdlib.h>
#include "backend/cuda/cuda.cuh"
#include "backend/cuda/cuda-api.h"

/* ---------------------------------------------------------------- embed */

__global__ void k_embed(const void *tab, int dt, const void *ids, int keys, int n, int cols, float *out) {
    PDL_ENTRY();
    size_t total = (size_t)n * cols;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < total; i += (size_t)gridDim.x * blockDim.x) {
        size_t t = i / cols, col = i % cols;
        out[i] = cu_mat_get(tab, dt, (size_t)cu_id_at(ids, keys, (int64_t)t) * cols + col);
    }
}

static void l_embed(be_ctx *c, const cu_rec *r) {
    size_t total = (size_t)r->i[0] * r->i[1];
    unsigned g = cu_blocks(total, 256);
    cu_launch(c, k_embed, dim3(g > 65535 ? 65535 : g), dim3(256), 0, r->p[0], (int)r->i[2], r->p[1], (int)r->i[3], (int)r->i[0],
              (int)r->i[1], (float *)r->p[2]);
    CU_LAUNCHED(c, "embed");
}

void cu_op_embed(be_ctx *c, const be_mat *tab, const int32_t *ids, int n, float *out) {
    if (be_traits(tab->dt)->affine) {   /* affine.cu */
        cu_affine_embed(c, tab, ids, n, out);
        return;
    }
    cu_rec r;
    memset(&r, 0, sizeof r);
    r.fn = l_embed;
    r.p[0] = tab->dev;
    int keys;
    r.p[1] = cu_ids(c, ids, n, &keys);
    r.p[2] = out;
    r.i[0] = n;
    r.i[1] = tab->cols;
    r.i[2] = tab->dt;
    r.i[3] = keys;
    if (!r.p[1]) return;
    cu_submit(c, &r);
}

/* -------------------------------------------------------------- rmsnorm */

/* a 16-bit copy of an f32 result for the cuBLAS matmul that follows (prefill) */
__device__ __forceinline__ void put16(void *p, size_t i, float v, int bf16) {
    if (bf16) ((__nv_bfloat16 *)p)[i] = __float2bfloat16_rn(v);
    else ((__half *)p)[i] = __float2half_rn(v);
}

/* an op whose output a cuBLAS matmul will read next (prefill, and decode steps of
 * more rows than the GEMV takes) also writes it rounded into the context's act16
 * buffer; returns that buffer or NULL. Measured on the H200 (llama-3-8b, 32
 * sequences decoding together, ncu): the separate rounding kernels took 383 us of a
 * 7.8 ms step, 96 of their 129 launches after a norm or the GLU. */
static void *side16(be_ctx *c, size_t len) {
    if (c->batch_inv || len < 8 * 256) return NULL;
    if (!cu_ensure(c, &c->act16, &c->act16_n, len * 2)) return NULL;
    return c->act16;
}

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
    for (int o = 16; o; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

/* the sum of v over the block (red: 32 floats of shared memory), in every thread */
__device__ __forceinline__ float block_sum(float v, float *red) {
    v = warp_sum(v);
    if (threadIdx.x % 32 == 0) red[threadIdx.x / 32] = v;
    __syncthreads();
    if (threadIdx.x < 32) {
        float w = threadIdx.x < blockDim.x / 32 ? red[threadIdx.x] : 0.0f;
        w = warp_sum(w);
        if (threadIdx.x == 0) red[0] = w;
    }
    __syncthreads();
    return red[0];
}

/* one warp per row */
__global__ void k_rmsnorm_warp(const float *x, int n, int dim, const void *w, int wdt, float w_add, float eps, float *y, void *y16,
                               int bf16) {
    PDL_ENTRY();
    int row = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32, lane = threadIdx.x % 32;
    if (row >= n) return;
    const float *a = x + (size_t)row * dim;
    float ss = 0;
    for (int i = lane; i < dim; i += 32) ss += a[i] * a[i];
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
__global__ void k_rmsnorm_block(const float *x, int dim, const void *w, int wdt, float w_add, float eps, float *y, void *y16,
                                int bf16) {
    PDL_ENTRY();
    __shared__ float red[32];
    const float *a = x + (size_t)blockIdx.x * dim;
    float ss = 0;
    for (int i = threadIdx.x; i < dim; i += blockDim.x) ss += a[i] * a[i];
    float inv = 1.0f / sqrtf(block_sum(ss, red) / (float)dim + eps);
    float *o = y + (size_t)blockIdx.x * dim;
    for (int i = threadIdx.x; i < dim; i += blockDim.x) {
        float v = a[i] * inv * ((w ? cu_mat_get(w, wdt, i) : 1.0f) + w_add);
        o[i] = v;
        if (y16) put16(y16, (size_t)blockIdx.x * dim + i, v, bf16);
    }
}

/* one block per row, VPT float4 per thread held in registers (dim % 4 == 0,
 * dim <= 4096 * VPT): the norm weights are read before waiting on the kernel
 * before, every load of x is issued before the first store — a
 * decode step's norm is one short chain of memory round trips */
template <int VPT>
__global__ void __launch_bounds__(1024) k_rmsnorm_vec(const float *x, int dim, const void *w, int wdt, float w_add, float eps,
                                                      float *y, void *y16, int bf16) {
    __shared__ float red[32];
    int nv = dim / 4;
    float4 wv[VPT];
#pragma unroll
    for (int u = 0; u < VPT; u++) {
        int e = 4 * (threadIdx.x + u * blockDim.x);
        wv[u] = make_float4(1.0f, 1.0f, 1.0f, 1.0f);
        if (w && e < dim) wv[u] = make_float4(cu_mat_get(w, wdt, e), cu_mat_get(w, wdt, e + 1), cu_mat_get(w, wdt, e + 2), cu_mat_get(w, wdt, e + 3));
    }
    PDL_ENTRY();
    const float4 *xr = (const float4 *)(x + (size_t)blockIdx.x * dim);
    float4 a[VPT];
    float ss = 0;
#pragma unroll
    for (int u = 0; u < VPT; u++) {
        int j = threadIdx.x + u * blockDim.x;
        a[u] = j < nv ? xr[j] : make_float4(0, 0, 0, 0);
    }
#pragma unroll
    for (int u = 0; u < VPT; u++) ss += a[u].x * a[u].x + a[u].y * a[u].y + a[u].z * a[u].z + a[u].w * a[u].w;
    float inv = 1.0f / sqrtf(block_sum(ss, red) / (float)dim + eps);
    float4 *o = (float4 *)(y + (size_t)blockIdx.x * dim);
#pragma unroll
    for (int u = 0; u < VPT; u++) {
        int j = threadIdx.x + u * blockDim.x;
        if (j >= nv) continue;
        float4 v = make_float4(a[u].x * inv * (wv[u].x + w_add), a[u].y * inv * (wv[u].y + w_add), a[u].z * inv * (wv[u].z + w_add),
                               a[u].w * inv * (wv[u].w + w_add));
        o[j] = v;
        if (y16) {
            size_t e = (size_t)blockIdx.x * dim + 4 * (size_t)j;
            put16(y16, e, v.x, bf16); put16(y16, e + 1, v.y, bf16); put16(y16, e + 2, v.z, bf16); put16(y16, e + 3, v.w, bf16);
        }
    }
}

static void l_rmsnorm(be_ctx *c, const cu_rec *r) {
    int n = (int)r->i[0], dim = (int)r->i[1];
    if (n <= 0) return;
    const float *x = (const float *)r->p[0];
    int vec = dim % 4 == 0 && dim <= 16384 && ((uintptr_t)x & 15) == 0 && ((uintptr_t)r->p[2] & 15) == 0;
    if (vec && dim > 512) {
        int nv = dim / 4, vpt = nv <= 1024 ? 1 : nv <= 2048 ? 2 : 4;
        int threads = (nv + vpt - 1) / vpt;
        threads = (threads + 31) / 32 * 32;
#define RV(V) cu_launch(c, k_rmsnorm_vec<V>, dim3(n), dim3(threads), 0, x, dim, r->p[1], (int)r->i[2], r->f[0], r->f[1], \
                        (float *)r->p[2], (void *)r->p[3], (int)r->i[3])
        if (vpt == 1) RV(1);
        else if (vpt == 2) RV(2);
        else RV(4);
#undef RV
    } else if (dim <= 512)
        cu_launch(c, k_rmsnorm_warp, dim3(cu_blocks(n, 8)), dim3(256), 0, x, n, dim, r->p[1], (int)r->i[2], r->f[0], r->f[1],
                  (float *)r->p[2], (void *)r->p[3], (int)r->i[3]);
    else
        cu_launch(c, k_rmsnorm_block, dim3(n), dim3(dim >= 2048 ? 512 : 256), 0, x, dim, r->p[1], (int)r->i[2], r->f[0], r->f[1],
                  (float *)r->p[2], (void *)r->p[3], (int)r->i[3]);
    CU_LAUNCHED(c, "rmsnorm");
}

void cu_op_rmsnorm(be_ctx *c, const float *x, int n, int dim, const be_mat *w, float w_add, float eps, float *y) {
    cu_rec r;
    memset(&r, 0, sizeof r);
    r.fn = l_rmsnorm;
    r.p[0] = x;
    r.p[1] = w ? w->dev : NULL;
    r.p[2] = y;
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
        int i0, i1;
        cu_rope_dims(i, rot, neox, &i0, &i1);
        const float2 r = cu_rope_pair(v[i0], v[i1], cs, sn);
        v[i0] = r.x;
        v[i1] = r.y;
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

/* --------------------------------------- glu, add, scale, softcap, gather */

__global__ void k_glu(const float *g, const float *u, float *o, size_t n, void *o16, int bf16, int act) {
    PDL_ENTRY();
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        float v = be_act(act, g[i]) * u[i];
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

static void l_glu(be_ctx *c, const cu_rec *r) {
    size_t n = (size_t)r->i[0];
    if (!n) return;
    cu_launch(c, k_glu, dim3(grid_for(n)), dim3(256), 0, (const float *)r->p[0], (const float *)r->p[1], (float *)r->p[2], n,
              (void *)r->p[3], (int)r->i[1], (int)r->i[2]);
    CU_LAUNCHED(c, "glu");
}

void cu_op_glu(be_ctx *c, const float *gate, const float *up, float *out, size_t n, int act) {
    cu_rec r;
    memset(&r, 0, sizeof r);
    r.fn = l_glu;
    r.p[0] = gate;
    r.p[1] = up;
    r.p[2] = out;
    r.i[0] = (int64_t)n;
    r.i[2] = act;
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

/* x[i] *= v (cap 0), or x[i] = be_softcap(x[i], v) */
__global__ void k_scale_cap(float *x, size_t n, float v, int cap) {
    PDL_ENTRY();
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        x[i] = cap ? be_softcap(x[i], v) : x[i] * v;
}

static void l_scale_cap(be_ctx *c, const cu_rec *r) {
    size_t n = (size_t)r->i[0];
    if (!n) return;
    cu_launch(c, k_scale_cap, dim3(grid_for(n)), dim3(256), 0, (float *)r->p[0], n, r->f[0], (int)r->i[1]);
    CU_LAUNCHED(c, r->i[1] ? "softcap" : "scale");
}

static void scale_cap(be_ctx *c, float *x, size_t n, float v, int cap) {
    cu_rec r;
    memset(&r, 0, sizeof r);
    r.fn = l_scale_cap;
    r.p[0] = x;
    r.i[0] = (int64_t)n;
    r.i[1] = cap;
    r.f[0] = v;
    cu_submit(c, &r);
}

void cu_op_scale(be_ctx *c, float *x, size_t n, float s) { scale_cap(c, x, n, s, 0); }
void cu_op_softcap(be_ctx *c, float *x, size_t n, float cap) { scale_cap(c, x, n, cap, 1); }

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

/* element offset of (row b, query i, kv head h) in a pool: the page of
 * sequence seq[b] holding position pos0[b] + i; -1 when the row's token is
 * padding or its page is not held (the cache holds every page a step writes) */
__device__ __forceinline__ int64_t kv_slot(const int32_t *pt, int n_pt, int sh, int n_kv, int hd, int b, int i, int h, const int *pos0,
                                           const int *len, const int *seq) {
    if (i >= len[b]) return -1;
    int64_t row = cu_kv_row(pt + (size_t)seq[b] * n_pt, sh, n_kv, h, pos0[b] + i);
    return row < 0 ? -1 : row * hd;
}

/* one block per (b, i, kv head); threads over hd */
__global__ void k_kv_write(const float *src, void *cache, int dt, int L, int n_kv, int hd, const int32_t *pt, int n_pt, int sh,
                           const int *pos0, const int *len, const int *seq) {
    PDL_ENTRY();
    int h = blockIdx.x % n_kv, i = (blockIdx.x / n_kv) % L, b = blockIdx.x / n_kv / L;
    int64_t off = kv_slot(pt, n_pt, sh, n_kv, hd, b, i, h, pos0, len, seq);
    if (off < 0) return;
    const float *s = src + (((size_t)b * L + i) * n_kv + h) * hd;
    for (int d = threadIdx.x; d < hd; d += blockDim.x) cu_kv_put(cache, dt, (size_t)off + d, s[d]);
}

static void l_kv_write(be_ctx *c, const cu_rec *r) {
    unsigned blocks = (unsigned)(r->i[CU_A_B] * r->i[CU_A_L] * r->i[CU_A_NKV]);
    if (!blocks) return;
    int hd = (int)r->i[CU_A_HD];
    cu_launch(c, k_kv_write, dim3(blocks), dim3(hd >= 128 ? 128 : 32 * ((hd + 31) / 32)), 0, (const float *)r->p[0], (void *)r->p[1],
              (int)r->i[CU_A_OP], (int)r->i[CU_A_L], (int)r->i[CU_A_NKV], hd, (const int32_t *)r->p[6], (int)r->i[CU_A_NPT],
              (int)r->i[CU_A_PSH], (const int *)r->p[2], (const int *)r->p[3], (const int *)r->p[4]);
    CU_LAUNCHED(c, "kv_write");
}

void cu_op_kv_write(be_ctx *c, const be_attn *a, const float *src, void *cache, be_dtype dt) {
    cu_rec r;
    memset(&r, 0, sizeof r);
    r.fn = l_kv_write;
    r.p[0] = src;
    r.p[1] = cache;
    cu_rec_attn(c, &r, a, 2);
    r.i[CU_A_OP] = dt;
    cu_submit(c, &r);
}

/* ------------------------------------------------- rope + kv write, fused */

/* one block per (token, kv head), one work item per thread: a rotation pair
 * of one of the kv head's g q heads or of its k head (k pairs also go to the
 * cache), a k dim past rot_dims (copied), or a v dim (copied). The angles
 * come from staged positions and frequencies, so they are computed before
 * waiting on the kernel before; there is no barrier. Rotation as k_rope, the
 * cache layout as k_kv_write; decode runs one launch here instead of four. */
__global__ void k_rope_kv(float *q, float *k, const float *v, void *kc, void *vc, int dt, int L, int H, int n_kv, int hd, int rot,
                          const int32_t *pt, int n_pt, int sh, const int *pos, const float *inv_freq, int neox, const int *pos0,
                          const int *len, const int *seq) {
    CU_TRACE(0, CU_TRACE_ROPE);
    int h = blockIdx.x % n_kv, t = blockIdx.x / n_kv, b = t / L, i = t % L;
    int half = rot / 2, g = H / n_kv, npair = (g + 1) * half, nwork = npair + (hd - rot) + hd;
    int w = threadIdx.x;
    float cs = 0.0f, sn = 0.0f;
    PDL_TRIGGER();   /* the decode attention after this only prefetches older cache rows before its wait */
    if (w < npair) {
        float ang = (float)pos[t] * inv_freq[w % half];
        cs = cosf(ang);
        sn = sinf(ang);
    }
    PDL_WAIT();
    CU_TRACE(1, CU_TRACE_ROPE);
    int64_t slot = kv_slot(pt, n_pt, sh, n_kv, hd, b, i, h, pos0, len, seq);
    int store = slot >= 0;
    size_t off = store ? (size_t)slot : 0;
    for (; w < nwork; w += blockDim.x) {
        float *kr = k + ((size_t)t * n_kv + h) * hd;
        if (w < npair) {
            int i0, i1;
            float2 r;
            int hh = cu_rope_kv_pair(w, q + ((size_t)t * H + h * g) * hd, kr, hd, half, rot, neox, g, (float)pos[t], inv_freq, cs, sn,
                                     &i0, &i1, &r);
            if (hh == g && store) {
                cu_kv_put(kc, dt, off + i0, r.x);
                cu_kv_put(kc, dt, off + i1, r.y);
            }
        } else if (store) {
            int d = w - npair, isv = d >= hd - rot;
            if (isv) d -= hd - rot;
            else d += rot;
            float val = isv ? v[((size_t)t * n_kv + h) * hd + d] : kr[d];
            cu_kv_put(isv ? vc : kc, dt, off + d, val);
        }
    }
    CU_TRACE(3, CU_TRACE_ROPE);
}

CU_TRACE_HOST(cu_trace_rope)

static void l_rope_kv(be_ctx *c, const cu_rec *r) {
    unsigned blocks = (unsigned)(r->i[CU_A_B] * r->i[CU_A_L] * r->i[CU_A_NKV]);
    if (!blocks) return;
    int g = (int)(r->i[CU_A_H] / r->i[CU_A_NKV]), hd = (int)r->i[CU_A_HD], rot = (int)r->i[CU_A_OP + 1];
    int work = (g + 1) * (rot / 2) + (hd - rot) + hd, threads = (work + 31) / 32 * 32;
    cu_launch(c, k_rope_kv, dim3(blocks), dim3(threads > 1024 ? 1024 : threads), 0, (float *)r->p[0], (float *)r->p[1],
              (const float *)r->p[2], (void *)r->p[3], (void *)r->p[4], (int)r->i[CU_A_OP], (int)r->i[CU_A_L], (int)r->i[CU_A_H],
              (int)r->i[CU_A_NKV], hd, rot, (const int32_t *)r->p[9], (int)r->i[CU_A_NPT], (int)r->i[CU_A_PSH],
              (const int *)r->p[10], (const float *)r->p[11], (int)r->i[CU_A_OP + 2], (const int *)r->p[5], (const int *)r->p[6],
              (const int *)r->p[7]);
    CU_LAUNCHED(c, "rope + kv_write");
}

void cu_op_rope_kv_write(be_ctx *c, const be_attn *a, float *q, float *k, const float *v, void *kc, void *vc, be_dtype dt) {
    int T = a->B * a->L;
    if (a->n_kv_head <= 0 || a->n_head % a->n_kv_head || a->rot_dims > a->head_dim) {
        cu_check(c, cudaErrorInvalidValue, "rope + kv_write: bad head geometry");
        return;
    }
    cu_rec r;
    memset(&r, 0, sizeof r);
    r.fn = l_rope_kv;
    r.p[0] = q;
    r.p[1] = k;
    r.p[2] = v;
    r.p[3] = kc;
    r.p[4] = vc;
    cu_rec_attn(c, &r, a, 5);
    r.p[10] = cu_stage(c, a->pos, sizeof(int) * (size_t)T);
    r.p[11] = cu_stage(c, a->inv_freq, sizeof(float) * (size_t)(a->rot_dims / 2));
    r.i[CU_A_OP] = dt;
    r.i[CU_A_OP + 1] = a->rot_dims;
    r.i[CU_A_OP + 2] = a->neox;
    cu_submit(c, &r);
}

/* --------------------------------------------------------------- argmax */

/* A grid of blocks per row, each folding its chunk to one 64-bit key (order-preserving bits of the value << 32 |
 * ~index, so the larger value and then the smaller index wins); NaN never wins. Each block writes its key to
 * part; the row's last block (an arrival count) reduces them into slot[row] and resets the count, so a slot
 * needs no clearing (a row of NaN gives key 0: index 0). */
__device__ __forceinline__ unsigned long long argmax_key(float v, int i) {
    unsigned u = __float_as_uint(v);
    u = (u & 0x80000000u) ? ~u : u | 0x80000000u;
    return ((unsigned long long)u << 32) | (unsigned)~i;
}

__device__ __forceinline__ unsigned long long block_max_key(unsigned long long best, unsigned long long *wk) {
#pragma unroll
    for (int o = 16; o; o >>= 1) {
        unsigned long long ok = __shfl_xor_sync(0xffffffffu, best, o);
        best = ok > best ? ok : best;
    }
    if (threadIdx.x % 32 == 0) wk[threadIdx.x / 32] = best;
    __syncthreads();
    for (int w = 0; w < (int)blockDim.x / 32; w++) best = wk[w] > best ? wk[w] : best;
    return best;
}

__global__ void k_argmax(const float *x, int dim, int chunk, unsigned long long *part, unsigned *cnt, unsigned long long *slot) {
    PDL_ENTRY();
    __shared__ unsigned long long wk[32];
    __shared__ int last;
    const float *a = x + (size_t)blockIdx.y * dim;
    int lo = blockIdx.x * chunk, hi = min(dim, lo + chunk);
    unsigned long long best = 0;
    for (int i = lo + threadIdx.x; i < hi; i += blockDim.x) {
        float v = a[i];
        unsigned long long key = v == v ? argmax_key(v, i) : 0;
        best = key > best ? key : best;
    }
    best = block_max_key(best, wk);
    unsigned long long *pr = part + (size_t)blockIdx.y * gridDim.x;
    if (threadIdx.x == 0) {
        pr[blockIdx.x] = best;
        __threadfence();
        last = atomicAdd(cnt + blockIdx.y, 1u) == gridDim.x - 1;
    }
    __syncthreads();
    if (!last) return;
    __threadfence();
    best = 0;
    for (int i = threadIdx.x; i < (int)gridDim.x; i += blockDim.x) {
        const unsigned long long v = __ldcg(pr + i);
        best = v > best ? v : best;
    }
    __syncthreads();   /* wk is reused */
    best = block_max_key(best, wk);
    if (threadIdx.x == 0) {
        slot[blockIdx.y] = best;
        cnt[blockIdx.y] = 0;
    }
}

/* p: x, the rows' slot, its pinned copy (NULL: none); i: rows, dim, chunk, blocks */
static void argmax_launcher(be_ctx *c, const cu_rec *r) {
    unsigned long long *slot = (unsigned long long *)r->p[1];
    const int n = (int)r->i[0];
    cu_launch(c, k_argmax, dim3((unsigned)r->i[3], (unsigned)n), dim3(256), 0, (const float *)r->p[0], (int)r->i[1], (int)r->i[2],
              c->am_part, c->am_cnt, slot);
    if (!CU_LAUNCHED(c, "argmax") && r->p[2])
        cu_check(c, cudaMemcpyAsync((void *)r->p[2], slot, sizeof *slot * (size_t)n, cudaMemcpyDeviceToHost, c->stream), "argmax copy");
}

static void argmax_keys(const unsigned long long *keys, int n, int32_t *out) {
    for (int i = 0; i < n; i++) out[i] = cu_key_id(keys[i]);
}

void cu_argmax_settle(be_ctx *c) {
    if (c->am_out && !c->err && !cu_check(c, cudaStreamSynchronize(c->stream), "argmax sync"))
        argmax_keys(c->am_h + 2 * CU_AM_MAX, c->am_n, c->am_out);
    c->am_out = NULL;
}

/* In an open step (a decode step's graph) the rows' argmax is issued with the step, its keys copied back into
 * pinned memory by the graph, and out written by step_end after the step's one wait; with out NULL the result is
 * kept (the next step's embedding may read it, argmax_take brings it back; no wait at step_end). Else
 * (CINFER_CUDA_ARGMAX_STEP=0, more than CU_AM_MAX rows) after the step's graph, eagerly, CU_AM_MAX rows a copy and
 * a wait. */
void cu_op_argmax(be_ctx *c, const float *x, int n, int dim, int32_t *out) {
    if (n <= 0 || dim <= 0) return;
    if (!out && (!c->in_step || !c->chain || n > CU_AM_MAX || c->am_kn + (c->am_pend >= 0) >= 2)) {
        cu_check(c, cudaErrorInvalidValue, "argmax: a result kept on the device needs an open step, chaining on, at most 256 "
                                           "rows and at most two kept results not taken");
        return;
    }
    const int in_step = !out || (c->in_step && c->am_step && !c->am_out && n <= CU_AM_MAX);
    if (!in_step) {   /* an open step's graph first (nothing without one), then its argmax's keys */
        cu_step_launch(c);
        cu_argmax_settle(c);
    }
    int chunk = 4096, blocks = (dim + chunk - 1) / chunk;
    if (blocks > 2 * c->n_sm) {
        blocks = 2 * c->n_sm;
        chunk = (dim + blocks - 1) / blocks;
    }
    const int q = out ? 2 : c->am_next;   /* the slot */
    for (int r0 = 0; r0 < n && !c->err; r0 += CU_AM_MAX) {
        const int nr = n - r0 < CU_AM_MAX ? n - r0 : CU_AM_MAX;
        cu_rec r = {};
        r.fn = argmax_launcher;
        r.p[0] = x + (size_t)r0 * dim;
        r.p[1] = c->am_d + (size_t)q * CU_AM_MAX;
        r.p[2] = c->am_h + (size_t)q * CU_AM_MAX;
        r.i[0] = nr, r.i[1] = dim, r.i[2] = chunk, r.i[3] = blocks;
        cu_submit(c, &r);
        if (!out) {
            c->am_pend = q, c->am_rows[q] = nr, c->am_next ^= 1;
            return;
        }
        if (in_step) {
            c->am_out = out, c->am_n = nr;
            return;
        }
        if (!cu_check(c, cudaStreamSynchronize(c->stream), "argmax sync")) argmax_keys(c->am_h + 2 * CU_AM_MAX, nr, out + r0);
    }
}

/* the oldest kept result not taken yet, after its step: out NULL asks whether results may be kept (0: yes) */
int cu_op_argmax_take(be_ctx *c, int32_t *out) {
    if (!out) return !c->chain;
    if (!c->am_kn) return 1;   /* none kept (or dropped by an error's recovery) */
    const int q = c->am_fifo[0];
    c->am_fifo[0] = c->am_fifo[1];
    c->am_kn--;
    if (cu_check(c, cudaEventSynchronize(c->am_ev[q]), "argmax wait")) return 1;
    argmax_keys(c->am_h + (size_t)q * CU_AM_MAX, c->am_rows[q], out);
    return 0;
}

const void *cu_ids(be_ctx *c, const int32_t *ids, int n, int *keys) {
    *keys = !ids;
    if (ids) return cu_stage(c, ids, sizeof(int32_t) * (size_t)n);
    if (c->am_last < 0 || c->am_rows[c->am_last] != n) {
        cu_check(c, cudaErrorInvalidValue, "embed: no kept argmax of that many rows to read the tokens from");
        return NULL;
    }
    return c->am_d + (size_t)c->am_last * CU_AM_MAX;
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
