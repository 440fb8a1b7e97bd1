/*
 * attention-gemm.c — causal attention over the KV cache through OpenBLAS
 * sgemm: the CPU attention op's fast path (same contract as be_ops.attention,
 * checked against be_ref_attention in tests/test-cpu-kernels.c).
 *
 * Work is split over the pool by (row b, kv head, block of <= ATT_QB
 * queries). For one item, the keys any of its queries may see are
 * t in [t_lo, t_hi] (t_hi = the last query's position; t_lo = 0, or the
 * window start of the first query); then, for each query head of the group:
 *     S[M][T] = scale * Q[M][hd] . K[T][hd]^T         (sgemm)
 *     per row: softmax over its visible keys, 0 elsewhere (causal / window)
 *     O[M][hd] = S[M][T] . V[T][hd]                    (sgemm, into out)
 * With one query per row (decode), the group's query heads are adjacent in q
 * and share their mask, so they go as one [grp][hd] matrix. The masked
 * upper triangle is computed and discarded: sgemm at ~100 GFLOP/s per core
 * wins over exact-triangle scalar loops by far. f16 caches are widened to
 * f32 for the item's key range first (in the thread's workspace).
 *
 * Workspace: the context's attention buffer (c->att), grown on first use to
 * n_threads x (ATT_QB*T + 2*T*hd) floats, T <= longest row + L. Like
 * cpu_matmul, it keeps OpenBLAS single-threaded: the pool runs the threads.
 * Padded queries (i >= len[b]) get zeros.
 */
#include <cblas.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include "backend/cpu/cpu.h"
#include "backend/cpu/gemv.h"

#define ATT_QB 128   /* queries per work item */

typedef struct ag_job {
    const be_attn *a;
    const float *q;          /* [B][L][n_head][hd] */
    const void *k, *v;       /* [B][n_kv][cap][hd] */
    be_dtype dt;
    float *out;              /* [B][L][n_head][hd] */
    float *ws;               /* [nth][ws_per] */
    size_t ws_per;
    int tmax;                /* longest key range of any item */
    int nqb;                 /* query blocks per row */
} ag_job;

static void widen(const void *src, be_dtype dt, size_t off, size_t n, float *dst) {
    if (dt == BE_F32) { memcpy(dst, (const float *)src + off, n * sizeof(float)); return; }
    const uint16_t *s = (const uint16_t *)src + off;
    for (size_t i = 0; i < n; i++) dst[i] = be_f16_to_f32(s[i]);
}

/* softmax of s[0..T) restricted to [lo, hi] (relative), zero elsewhere */
static void masked_softmax(float *s, int T, int lo, int hi) {
    float mx = -INFINITY, sum = 0;
    for (int t = lo; t <= hi; t++) if (s[t] > mx) mx = s[t];
    for (int t = lo; t <= hi; t++) sum += (s[t] = expf(s[t] - mx));
    float inv = 1.0f / sum;
    for (int t = 0; t < lo; t++) s[t] = 0;
    for (int t = lo; t <= hi; t++) s[t] *= inv;
    for (int t = hi + 1; t < T; t++) s[t] = 0;
}

static void item(const ag_job *j, int b, int kh, int qb, float *ws) {
    const be_attn *a = j->a;
    int hd = a->head_dim, grp = a->n_head / a->n_kv_head, nh = a->n_head;
    int i0 = qb * ATT_QB, i1 = i0 + ATT_QB < a->L ? i0 + ATT_QB : a->L;
    int live = a->len[b] < i1 ? a->len[b] : i1;     /* queries [i0, live) are real */
    size_t ld = (size_t)nh * hd;
    for (int i = live > i0 ? live : i0; i < i1; i++)   /* padding: zeros */
        memset(j->out + ((size_t)b * a->L + i) * ld + (size_t)kh * grp * hd, 0, sizeof(float) * grp * hd);
    if (live <= i0) return;
    int p0 = a->pos0[b] + i0, p1 = a->pos0[b] + live - 1;
    int t_lo = a->window && p0 - a->window + 1 > 0 ? p0 - a->window + 1 : 0, T = p1 - t_lo + 1;
    size_t base = ((size_t)b * a->n_kv_head + kh) * a->cap * hd + (size_t)t_lo * hd;
    float *S = ws;
    const float *K, *V;
    if (j->dt == BE_F32) {
        K = (const float *)j->k + base;
        V = (const float *)j->v + base;
    } else {
        float *kf = ws + (size_t)ATT_QB * j->tmax, *vf = kf + (size_t)j->tmax * hd;
        widen(j->k, j->dt, base, (size_t)T * hd, kf);
        widen(j->v, j->dt, base, (size_t)T * hd, vf);
        K = kf;
        V = vf;
    }
    int M = live - i0;
    /* one query per row: the group's heads are adjacent rows of q with one mask */
    int rows = M == 1 ? grp : M, heads = M == 1 ? 1 : grp;
    int lda = M == 1 ? hd : (int)ld;
    for (int g = 0; g < heads; g++) {
        const float *Q = j->q + ((size_t)b * a->L + i0) * ld + (size_t)(kh * grp + g) * hd;
        float *O = j->out + ((size_t)b * a->L + i0) * ld + (size_t)(kh * grp + g) * hd;
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, rows, T, hd, a->scale, Q, lda, K, hd, 0.0f,
                    S, T);
        for (int r = 0; r < rows; r++) {
            int p = a->pos0[b] + i0 + (M == 1 ? 0 : r);
            int lo = a->window && p - a->window + 1 > t_lo ? p - a->window + 1 : t_lo;
            masked_softmax(S + (size_t)r * T, T, lo - t_lo, p - t_lo);
        }
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, rows, hd, T, 1.0f, S, T, V, hd, 0.0f, O,
                    lda);
    }
}

static void ag_task(void *arg, int ith, int nth) {
    const ag_job *j = arg;
    const be_attn *a = j->a;
    int n_items = a->B * a->n_kv_head * j->nqb;
    float *ws = j->ws + (size_t)ith * j->ws_per;
    /* interleaved: the costly late query blocks spread over the threads */
    for (int w = ith; w < n_items; w += nth) {
        int qb = w % j->nqb, kh = w / j->nqb % a->n_kv_head, b = w / j->nqb / a->n_kv_head;
        item(j, b, kh, qb, ws);
    }
}

int cpu_attention_gemm(be_ctx *c, const be_attn *a, const float *q, const void *k, const void *v,
                       be_dtype kv_dt, float *out) {
    int tmax = 1;
    for (int b = 0; b < a->B; b++) {
        int span = a->len[b] < ATT_QB ? a->len[b] : ATT_QB;
        int t = a->window && a->window + span < a->pos0[b] + a->len[b] ? a->window + span
                                                                       : a->pos0[b] + a->len[b];
        if (t > tmax) tmax = t;
    }
    int nth = cpu_pool_size(c->pool);
    size_t per = (size_t)ATT_QB * tmax + (kv_dt == BE_F32 ? 0 : 2 * (size_t)tmax * a->head_dim);
    per = (per + 15) & ~(size_t)15;
    if (c->att_n < per * nth) {
        float *p = realloc(c->att, per * nth * sizeof(float));
        if (!p) return 1;
        c->att = p;
        c->att_n = per * nth;
    }
    ag_job j = { a, q, k, v, kv_dt, out, c->att, per, tmax, (a->L + ATT_QB - 1) / ATT_QB };
    if (openblas_get_num_threads() != 1) openblas_set_num_threads(1);
    cpu_pool_run(c->pool, ag_task, &j);
    return 0;
}
