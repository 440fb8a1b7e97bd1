/*
 * score.cu — be_ops.score on the device: the per-position statistics of
 * perplexity, KL and response log-probs reduced from logits rows that never
 * leave the GPU; only one be_score_row per row (and, when saving a base, its
 * 16-bit code row) crosses to the host.
 *
 * One block of 1024 threads per row, in passes over the row (the second and
 * third read it again, from L2 when it fits: two blocks per SM keep at most
 * 264 rows in flight): max (first index on ties, NaN never wins) and min;
 * sum expf(z - max) accumulated in double per thread and across the block;
 * with a base or codes, the KL terms (exp in double) and the codes. Every f32
 * step that the definition rounds (be_ref_score_row, cpu/ref.c) is written
 * with an explicit _rn intrinsic so nvcc cannot contract it into an FMA: lse
 * and the log-probs come out bit-equal to the reference unless the exp sum
 * (double, in another order; CUDA's expf within 2 ulp, glibc's within 0.5)
 * moves log(sum) across an f32 rounding boundary.
 */
#include <math.h>
#include <stdlib.h>
#include "backend/cuda/cuda.cuh"

#define SC_T 1024

struct sc_best { float v; int i; };

__device__ __forceinline__ sc_best sc_pick(sc_best a, sc_best b) {
    if (b.v > a.v || (b.v == a.v && b.i < a.i)) return b;
    return a;
}

__global__ void __launch_bounds__(SC_T, 2)
k_score(const float *z, int V, const int32_t *tgt, const float *bz, const float *blse, const unsigned char *rec,
        long long rec_bytes, const int32_t *idx, uint16_t *codes, long long cs, be_score_row *out) {
    PDL_ENTRY();
    __shared__ float s_v[32], s_mn[32];
    __shared__ int s_i[32];
    __shared__ double s_d[32];
    __shared__ float s_row[3];   /* max, min, lse */
    const int r = blockIdx.x, t = threadIdx.x, lane = t & 31, w = t >> 5;
    const float *a = z + (size_t)r * V;
    /* pass 1: max (first index), min */
    sc_best b = {-INFINITY, V};
    float mn = INFINITY;
    for (int i = t; i < V; i += SC_T) {
        float v = a[i];
        if (v > b.v) { b.v = v; b.i = i; }
        mn = fminf(mn, v);
    }
#pragma unroll
    for (int o = 16; o; o >>= 1) {
        sc_best ob = {__shfl_xor_sync(0xffffffffu, b.v, o), __shfl_xor_sync(0xffffffffu, b.i, o)};
        b = sc_pick(b, ob);
        mn = fminf(mn, __shfl_xor_sync(0xffffffffu, mn, o));
    }
    if (lane == 0) { s_v[w] = b.v; s_i[w] = b.i; s_mn[w] = mn; }
    __syncthreads();
    if (t == 0) {
        for (int k = 1; k < SC_T / 32; k++) {
            sc_best ob = {s_v[k], s_i[k]};
            b = sc_pick(b, ob);
            mn = fminf(mn, s_mn[k]);
        }
        if (b.i >= V) b.i = 0;   /* no value above -inf (or NaN): the reference keeps index 0 */
        s_i[0] = b.i;
        s_row[0] = a[b.i];
        s_row[1] = mn;
    }
    __syncthreads();
    const float mx = s_row[0];
    const int im = s_i[0];
    /* pass 2: the normaliser, double sums */
    double s = 0;
    for (int i = t; i < V; i += SC_T) s += (double)expf(__fsub_rn(a[i], mx));
#pragma unroll
    for (int o = 16; o; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
    if (lane == 0) s_d[w] = s;
    __syncthreads();
    if (t == 0) {
        double tot = 0;
        for (int k = 0; k < SC_T / 32; k++) tot += s_d[k];
        s_row[2] = __fadd_rn(mx, (float)log(tot));
    }
    __syncthreads();
    const float lse = s_row[2];
    const float top = __fsub_rn(a[im], lse);
    float lo = __fsub_rn(s_row[1], lse);
    if (lo < __fsub_rn(top, 16.0f)) lo = __fsub_rn(top, 16.0f);
    const float sc = __fdiv_rn(__fsub_rn(top, lo), 65535.0f);
    /* pass 3: KL against the base, the row's own code */
    double kld = 0;
    if (bz || rec || codes) {
        const float *zb = bz ? bz + (size_t)idx[r] * V : NULL;
        const float bl = bz ? blse[r] : 0.0f;
        float bsc = 0, bmin = 0;
        const uint16_t *q = NULL;
        if (rec) {
            const unsigned char *p = rec + (size_t)idx[r] * rec_bytes;
            bsc = *(const float *)p;
            bmin = *(const float *)(p + 4);
            q = (const uint16_t *)(p + 16);
        }
        uint16_t *cr = codes ? codes + (size_t)r * cs : NULL;
        const float inv = sc > 0 ? __fdiv_rn(1.0f, sc) : 0.0f;
        for (int i = t; i < V; i += SC_T) {
            float lq = __fsub_rn(a[i], lse);
            if (zb || q) {
                float lb = zb ? __fsub_rn(zb[i], bl) : __fadd_rn(__fmul_rn(bsc, (float)q[i]), bmin);
                if (lb > -16.0f) kld += exp((double)lb) * ((double)lb - (double)lq);
            }
            if (cr) {
                long v = sc > 0 && lq > lo ? lroundf(__fmul_rn(inv, __fsub_rn(lq, lo))) : 0;
                cr[i] = (uint16_t)(v < 0 ? 0 : v > 65535 ? 65535 : v);
            }
        }
#pragma unroll
        for (int o = 16; o; o >>= 1) kld += __shfl_xor_sync(0xffffffffu, kld, o);
        __syncthreads();   /* s_d is read by thread 0 above */
        if (lane == 0) s_d[w] = kld;
        __syncthreads();
        if (t == 0) {
            kld = 0;
            for (int k = 0; k < SC_T / 32; k++) kld += s_d[k];
        }
    }
    if (t == 0) {
        be_score_row o;
        o.lse = lse;
        o.lp = __fsub_rn(a[tgt[r]], lse);
        o.argmax = im;
        o.code_scale = sc;
        o.code_min = lo;
        o.kld = kld;
        cu_store_score_row(out + r, o);
    }
}

const float *cu_stage_base_lse(be_ctx *c, const be_score_base *base, int n) {
    float *l = (float *)malloc(sizeof(float) * (size_t)n);
    if (!l) { cu_check(c, cudaErrorMemoryAllocation, "score: base lse"); return NULL; }
    for (int i = 0; i < n; i++) l[i] = base->lse[base->idx[i]];
    const float *d = (const float *)cu_stage(c, l, sizeof(float) * (size_t)n);
    free(l);
    return d;
}

void cu_op_score(be_ctx *c, const float *z, int n, int V, const int32_t *tgt, const be_score_base *base, uint16_t *codes,
                 size_t code_stride, be_score_row *out) {
    if (n <= 0 || V <= 0) return;
    cu_go_eager(c);
    if (!cu_ensure(c, &c->score_out, &c->score_out_n, sizeof(be_score_row) * (size_t)n)) {
        cu_check(c, cudaErrorMemoryAllocation, "score results");
        return;
    }
    const int32_t *d_tgt = (const int32_t *)cu_stage(c, tgt, sizeof(int32_t) * (size_t)n);
    const int32_t *d_idx = NULL;
    const float *d_lse = NULL;
    if (base) {
        d_idx = (const int32_t *)cu_stage(c, base->idx, sizeof(int32_t) * (size_t)n);
        if (base->z && !(d_lse = cu_stage_base_lse(c, base, n))) return;
    }
    be_score_row *d_out = (be_score_row *)c->score_out;
    cu_launch(c, k_score, dim3((unsigned)n), dim3(SC_T), 0, z, V, d_tgt, base ? base->z : (const float *)NULL, d_lse,
              base ? base->rec : (const unsigned char *)NULL, (long long)(base ? base->rec_bytes : 0), d_idx, codes,
              (long long)code_stride, d_out);
    if (!CU_LAUNCHED(c, "score") &&
        !cu_check(c, cudaMemcpyAsync(out, d_out, sizeof *out * (size_t)n, cudaMemcpyDeviceToHost, c->stream), "score copy") &&
        !cu_check(c, cudaStreamSynchronize(c->stream), "score sync"))
        c->arena_off = 0;   /* drained: the staged arrays are consumed */
}
