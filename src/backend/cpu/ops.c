/*
 * ops.c — the CPU backend's op table (be_cpu()). Buffers are plain host
 * memory; heavy ops (matmul, attention) split work (ith, nth) over the pool.
 * Attention: tiny problems run the scalar loop on the calling thread, the
 * rest go through sgemm (attention-gemm.c); the threaded scalar loop remains
 * as the fallback when its workspace cannot be had.
 * Numerics follow transformers in float32: RoPE angles are float(pos) *
 * inv_freq in float32, softmax subtracts the row max.
 */
#include <cblas.h>
#include <math.h>
#include <stdlib.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>
#include "backend/cpu/cpu.h"
#include "backend/cpu/gemv.h"

static int cpu_ctx_new(be_ctx **out, int n_threads) {
    be_ctx *c = calloc(1, sizeof *c);
    if (!c) return 1;
    c->pool = cpu_pool_new(n_threads);
    if (!c->pool) { free(c); return 1; }
    c->n_threads = cpu_pool_size(c->pool);
    /* OpenBLAS's thread count is process-global: every sgemm here runs inside
     * the pool at one OpenBLAS thread, so a new context (the server's second)
     * must never raise it under another context's running GEMMs */
    if (openblas_get_num_threads() != 1) openblas_set_num_threads(1);
    *out = c;
    return 0;
}

static void cpu_ctx_free(be_ctx *c) {
    if (!c) return;
    cpu_pool_free(c->pool);
    free(c->scratch);
    free(c->att);
    free(c);
}

static int cpu_n_threads(const be_ctx *c) { return c->n_threads; }
static void *cpu_alloc(be_ctx *c, size_t bytes) { (void)c; return calloc(1, bytes ? bytes : 1); }
static void cpu_free(be_ctx *c, void *p) { (void)c; free(p); }
static void cpu_copy(be_ctx *c, void *dst, const void *src, size_t bytes) { (void)c; memcpy(dst, src, bytes); }
static int cpu_mat_prepare(be_ctx *c, be_mat *m) { (void)c; (void)m; return 0; }
static void cpu_mat_release(be_ctx *c, be_mat *m) { (void)c; (void)m; }
static void cpu_batch_invariant(be_ctx *c, int on) { c->batch_inv = on != 0; }
static void cpu_prefill_act(be_ctx *c, int mode) { c->prefill_act = mode; }

static void cpu_embed(be_ctx *c, const be_mat *tab, const int32_t *ids, int n, float *out) {
    (void)c;
    for (int i = 0; i < n; i++) cpu_mat_row_f32(tab, ids[i], out + (size_t)i * tab->cols);
}

/* the weight (+ w_add) of elements [i0, i0 + cnt) of a norm as f32 */
static void norm_weights(const be_mat *w, float w_add, int64_t i0, int cnt, float *dst) {
    if (!w) { for (int i = 0; i < cnt; i++) dst[i] = 1.0f + w_add; return; }
    be_mat part = { .data = (const char *)w->data + i0 * (int64_t)be_dtype_size(w->dt), .dt = w->dt, .rows = 1, .cols = cnt };
    gemv_pick()->rows_f32[w->dt](&part, 0, 1, dst);
    if (w_add != 0.0f) for (int i = 0; i < cnt; i++) dst[i] += w_add;
}

#define NORM_BLK 512
typedef struct norm_job {
    const float *x;
    int n, dim;
    const be_mat *w;
    float w_add, eps;
    float *y;
} norm_job;

static void norm_task(void *arg, int ith, int nth) {
    const norm_job *j = arg;
    float wb[NORM_BLK];
    for (int t = j->n * ith / nth; t < j->n * (ith + 1) / nth; t++) {
        const float *a = j->x + (size_t)t * j->dim;
        float ss = 0;
        for (int i = 0; i < j->dim; i++) ss += a[i] * a[i];
        float inv = 1.0f / sqrtf(ss / (float)j->dim + j->eps);
        float *o = j->y + (size_t)t * j->dim;
        for (int i0 = 0; i0 < j->dim; i0 += NORM_BLK) {   /* weights converted a block at a time */
            int cnt = j->dim - i0 < NORM_BLK ? j->dim - i0 : NORM_BLK;
            norm_weights(j->w, j->w_add, i0, cnt, wb);
            for (int i = 0; i < cnt; i++) o[i0 + i] = a[i0 + i] * inv * wb[i];
        }
    }
}

/* element-wise ops run over the pool when large (prefill), else on the
 * caller (a pool run costs microseconds) */
#define EW_PAR (1u << 16)

static void cpu_rmsnorm(be_ctx *c, const float *x, int n, int dim, const be_mat *w, float w_add, float eps, float *y) {
    norm_job j = { x, n, dim, w, w_add, eps, y };
    if ((size_t)n * (size_t)dim >= EW_PAR && n > 1) cpu_pool_run(c->pool, norm_task, &j);
    else norm_task(&j, 0, 1);
}

#define ROPE_MAX 1024
static void cpu_rope(be_ctx *c, float *x, int n, int heads, int hd, int rot, const int *pos, const float *inv_freq, int neox) {
    (void)c;
    float cs[ROPE_MAX / 2], sn[ROPE_MAX / 2];
    if (rot > ROPE_MAX) { be_ref_rope(x, n, heads, hd, rot, pos, inv_freq, neox); return; }
    for (int t = 0; t < n; t++) {
        for (int i = 0; i < rot / 2; i++) {
            float ang = (float)pos[t] * inv_freq[i];
            cs[i] = cosf(ang);
            sn[i] = sinf(ang);
        }
        for (int h = 0; h < heads; h++) {
            float *v = x + ((size_t)t * heads + h) * hd;
            for (int i = 0; i < rot / 2; i++) {
                int i0 = neox ? i : 2 * i, i1 = neox ? i + rot / 2 : 2 * i + 1;
                float a = v[i0], b = v[i1];
                v[i0] = a * cs[i] - b * sn[i];
                v[i1] = b * cs[i] + a * sn[i];
            }
        }
    }
}

enum { EW_ADD, EW_GLU, EW_SCALE, EW_SOFTCAP };
typedef struct ew_job {
    int op;
    float *y;
    const float *a, *b;   /* glu: y = act(a) * b; add: y += a; scale: y *= v; softcap: y = cap(y, v) */
    size_t n;
    int act;
    float v;
} ew_job;

static void ew_range(const ew_job *j, size_t i0, size_t i1) {
    switch (j->op) {
    case EW_GLU:
        if (j->act == BE_ACT_SILU) for (size_t i = i0; i < i1; i++) j->y[i] = j->a[i] / (1.0f + expf(-j->a[i])) * j->b[i];
        else for (size_t i = i0; i < i1; i++) j->y[i] = be_act(j->act, j->a[i]) * j->b[i];
        break;
    case EW_ADD: for (size_t i = i0; i < i1; i++) j->y[i] += j->a[i]; break;
    case EW_SCALE: for (size_t i = i0; i < i1; i++) j->y[i] *= j->v; break;
    default: for (size_t i = i0; i < i1; i++) j->y[i] = be_softcap(j->y[i], j->v); break;
    }
}

static void ew_task(void *arg, int ith, int nth) {
    const ew_job *j = arg;
    size_t blocks = (j->n + 15) / 16, i0 = blocks * ith / nth * 16, i1 = blocks * (ith + 1) / nth * 16;
    ew_range(j, i0 < j->n ? i0 : j->n, i1 < j->n ? i1 : j->n);
}

static void ew_run(be_ctx *c, ew_job *j) {
    if (j->n >= EW_PAR) cpu_pool_run(c->pool, ew_task, j);
    else ew_range(j, 0, j->n);
}

static void cpu_glu(be_ctx *c, const float *gate, const float *up, float *out, size_t n, int act) {
    ew_job j = { EW_GLU, out, gate, up, n, act, 0.0f };
    ew_run(c, &j);
}

static void cpu_add(be_ctx *c, float *y, const float *x, size_t n) {
    ew_job j = { EW_ADD, y, x, NULL, n, 0, 0.0f };
    ew_run(c, &j);
}

static void cpu_scale(be_ctx *c, float *x, size_t n, float s) {
    ew_job j = { EW_SCALE, x, NULL, NULL, n, 0, s };
    ew_run(c, &j);
}

static void cpu_softcap(be_ctx *c, float *x, size_t n, float cap) {
    ew_job j = { EW_SOFTCAP, x, NULL, NULL, n, 0, cap };
    ew_run(c, &j);
}

static void cpu_gather(be_ctx *c, const float *x, int dim, const int *rows, int n, float *y) {
    (void)c;
    for (int i = 0; i < n; i++) memcpy(y + (size_t)i * dim, x + (size_t)rows[i] * dim, sizeof(float) * dim);
}

static void cpu_kv_write(be_ctx *c, const be_attn *a, const float *src, void *pool, be_dtype dt) {
    (void)c;
    be_ref_kv_write(a, src, pool, dt);
}

typedef struct att_job {
    const be_attn *a;
    const float *q;
    const void *k, *v;
    be_dtype dt;
    float *out;
    float *scr;   /* [nth][max_span] */
} att_job;

static inline float kv_dot(const void *k, be_dtype dt, size_t off, const float *q, int hd) {
    float d = 0;
    if (dt == BE_F32) { const float *kk = (const float *)k + off; for (int e = 0; e < hd; e++) d += q[e] * kk[e]; }
    else for (int e = 0; e < hd; e++) d += q[e] * be_kv_get(k, dt, off + e);
    return d;
}

/* one query head at a time over be_span's ranges: small attentions (decode of small models) */
static void att_task(void *arg, int ith, int nth) {
    att_job *j = arg;
    const be_attn *a = j->a;
    int hd = a->head_dim, grp = a->n_head / a->n_kv_head, el = (int)be_dtype_size(j->dt);
    float *s = j->scr + (size_t)ith * a->max_span;
    size_t total = (size_t)a->B * a->L * a->n_head;
    size_t w0 = total * ith / nth, w1 = total * (ith + 1) / nth;
    for (size_t w = w0; w < w1; w++) {
        int h = (int)(w % a->n_head), i = (int)(w / a->n_head % a->L), b = (int)(w / a->n_head / a->L);
        float *o = j->out + w * hd;
        memset(o, 0, sizeof(float) * hd);
        if (i >= a->len[b]) continue;
        const int32_t *pt = a->pt_host + (size_t)a->seq[b] * a->n_pt;
        int p = a->pos0[b] + i, r[4], n = 0;
        be_span(p, a->window, a->keep, a->run0[b], &r[0], &r[1], &r[2]);
        r[3] = p + 1;
        const float *qq = j->q + w * hd;
        float mx = -INFINITY, sum = 0;
        for (int g = 0; g < 4; g += 2)
            for (int t = r[g]; t < r[g + 1]; t++, n++) {
                size_t off = (size_t)be_kv_off(pt, a->page, a->n_kv_head, hd, h / grp, t, el) / el;
                s[n] = kv_dot(j->k, j->dt, off, qq, hd) * a->scale;
                if (a->softcap > 0) s[n] = be_softcap(s[n], a->softcap);
                if (s[n] > mx) mx = s[n];
            }
        for (int t = 0; t < n; t++) sum += (s[t] = expf(s[t] - mx));
        float inv = 1.0f / sum;
        n = 0;
        for (int g = 0; g < 4; g += 2)
            for (int t = r[g]; t < r[g + 1]; t++, n++) {
                float pw = s[n] * inv;
                size_t off = (size_t)be_kv_off(pt, a->page, a->n_kv_head, hd, h / grp, t, el) / el;
                if (j->dt == BE_F32) { const float *vv = (const float *)j->v + off; for (int d = 0; d < hd; d++) o[d] += pw * vv[d]; }
                else for (int d = 0; d < hd; d++) o[d] += pw * be_kv_get(j->v, j->dt, off + d);
            }
    }
}

static void cpu_attention(be_ctx *c, const be_attn *a, const float *q, const void *k, const void *v, be_dtype dt, float *out) {
    /* waking the pool costs microseconds: tiny attentions (small models, short
     * contexts) run on the calling thread */
    double work = (double)a->B * a->L * a->n_head * a->head_dim * (a->max_span > 0 ? a->max_span : 1);
    if (work >= 65536.0 && !c->batch_inv && cpu_attention_gemm(c, a, q, k, v, dt, out) == 0) return;
    size_t need = (size_t)c->n_threads * (a->max_span > 0 ? a->max_span : 1);
    if (c->att_n < need) {
        float *p = realloc(c->att, need * sizeof(float));
        if (!p) { be_ref_attention(a, q, k, v, dt, out); return; }
        c->att = p;
        c->att_n = need;
    }
    att_job j = {a, q, k, v, dt, out, c->att};
    if (work < 65536.0) att_task(&j, 0, 1);
    else cpu_pool_run(c->pool, att_task, &j);
}

/* quantized KV: the writes are the reference; attention is attention-kvq.c */
static void cpu_kvq_write(be_ctx *c, const be_attn *a, const float *src, const be_kvq *pool) {
    (void)c;
    be_ref_kvq_write(a, src, pool);
}

/* be_ops.score: the reference per row, rows split over the pool (each row's
 * result depends on that row alone, so the split changes no bits) */
typedef struct score_job {
    const float *z;
    int n, V;
    const int32_t *tgt;
    const be_score_base *base;
    uint16_t *codes;
    size_t cs;
    be_score_row *out;
} score_job;

/* worker ith's share [*i0, *i1) of n rows */
static void row_share(int n, int ith, int nth, int *i0, int *i1) {
    *i0 = (int)((int64_t)n * ith / nth);
    *i1 = (int)((int64_t)n * (ith + 1) / nth);
}

static void score_task(void *arg, int ith, int nth) {
    const score_job *j = arg;
    int i0, i1;
    row_share(j->n, ith, nth, &i0, &i1);
    for (int i = i0; i < i1; i++)
        be_ref_score_row(j->z + (size_t)i * j->V, j->V, j->tgt[i], j->base, j->base ? j->base->idx[i] : 0,
                         j->codes ? j->codes + (size_t)i * j->cs : NULL, &j->out[i]);
}

static void cpu_score(be_ctx *c, const float *z, int n, int V, const int32_t *tgt, const be_score_base *base,
                      uint16_t *codes, size_t code_stride, be_score_row *out) {
    if (n <= 0) return;
    score_job j = {z, n, V, tgt, base, codes, code_stride, out};
    if (n > 1) cpu_pool_run(c->pool, score_task, &j);
    else score_task(&j, 0, 1);
}

/* be_ops.sample: the definition per row, rows split over the pool */
typedef struct sample_job {
    float *z;
    int n, V;
    const be_sample_row *p;
    const be_logit_edit *edits;
    be_sample_out *out;
} sample_job;

static void sample_task(void *arg, int ith, int nth) {
    const sample_job *j = arg;
    int i0, i1;
    row_share(j->n, ith, nth, &i0, &i1);
    for (int i = i0; i < i1; i++) be_ref_sample_row(j->z + (size_t)i * j->V, j->V, &j->p[i], j->edits, &j->out[i]);
}

static void cpu_sample(be_ctx *c, float *z, int n, int V, const be_sample_row *p, const be_logit_edit *edits, int n_edits,
                       be_sample_out *out) {
    (void)n_edits;
    if (n <= 0) return;
    sample_job j = {z, n, V, p, edits, out};
    if (n > 1) cpu_pool_run(c->pool, sample_task, &j);
    else sample_task(&j, 0, 1);
}

/* MemAvailable from /proc/meminfo (page cache counts as available), else free pages */
static size_t cpu_mem_available(be_ctx *c) {
    (void)c;
    FILE *f = fopen("/proc/meminfo", "r");
    char line[256];
    unsigned long long kb = 0;
    while (f && fgets(line, sizeof line, f))
        if (sscanf(line, "MemAvailable: %llu kB", &kb) == 1) break;
    if (f) fclose(f);
    if (kb) return (size_t)kb * 1024;
    long pages = sysconf(_SC_AVPHYS_PAGES), sz = sysconf(_SC_PAGESIZE);
    return pages > 0 && sz > 0 ? (size_t)pages * (size_t)sz : (size_t)1 << 30;
}

static const be_ops cpu_ops = {
    .name = "cpu",
    .ctx_new = cpu_ctx_new,
    .ctx_free = cpu_ctx_free,
    .n_threads = cpu_n_threads,
    .alloc = cpu_alloc,
    .free = cpu_free,
    .to_host = cpu_copy,
    .from_host = cpu_copy,
    .copy = cpu_copy,
    .mat_prepare = cpu_mat_prepare,
    .mat_release = cpu_mat_release,
    .embed = cpu_embed,
    .matmul = cpu_matmul,
    .rmsnorm = cpu_rmsnorm,
    .rope = cpu_rope,
    .glu = cpu_glu,
    .add = cpu_add,
    .scale = cpu_scale,
    .softcap = cpu_softcap,
    .gather = cpu_gather,
    .kv_write = cpu_kv_write,
    .attention = cpu_attention,
    .matmul_multi = cpu_matmul_multi,
    .mem_available = cpu_mem_available,
    .batch_invariant = cpu_batch_invariant,
    .prefill_act = cpu_prefill_act,
    .score = cpu_score,
    .sample = cpu_sample,
    .kvq_write = cpu_kvq_write,
    .kvq_attention = cpu_kvq_attention,
};

const be_ops *be_cpu(void) { return &cpu_ops; }

#ifndef CINFER_CUDA
const be_ops *be_cuda(void) { return NULL; }
#endif
