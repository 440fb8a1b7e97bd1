/*
 * score-kl.c — KL divergence of a model against a base model, as llama.cpp's
 * `llama-perplexity --kl-divergence` reports it (tools/perplexity/
 * perplexity.cpp: log_softmax, kl_divergence), over every scored position of
 * the same rows perplexity scores (not llama.cpp's second-half-of-chunk).
 *
 * Per position (be_ops.score, be_ref_score_row: on the backend, from logits
 * that never leave it), with the model's logits z and the base's log-probs lb:
 *   nll = lse(z) - z[tok];  KLD = sum_{lb_i > -16} exp(lb_i) (lb_i - (z_i - lse(z)))
 *   dp = p_model(tok) - p_base(tok);  same top = argmax z == argmax lb.
 * Statistics: llama.cpp's mean_and_uncertainty / covariance / percentile.
 *
 * The base comes from a live context (both models in memory, stepped over
 * the same chunks) or from a file (format below, little-endian, mmap'd and
 * read by record index so it does not depend on batch or chunk sizes):
 *   header 64 bytes: "CINFKLB1", u32 version 1, u32 64, i32 n_vocab, i32 L,
 *     i32 n_rows, u32 record bytes, u64 records (n_rows * (L-1)), zeros;
 *   i32 tokens [n_rows][L], zero padding to a multiple of 64;
 *   records [n_rows][L-1]: f32 scale, f32 min, f32 nll_base (exact),
 *     i32 argmax (exact), u16 q[n_vocab] (+2 zero bytes if n_vocab is odd).
 * q is llama.cpp's code of the log-probs: min = max(min lp, max lp - 16),
 * scale = (max lp - min) / 65535, q = round((lp - min) / scale) for lp > min.
 */
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#include "engine/score.h"
#include "util.h"

#define KLB_MAGIC "CINFKLB1"
#define KLB_HDR 64

struct cinfer_kl_base {
    unsigned char *map;   /* the whole file */
    size_t size;
    int V, L, n_rows;
    size_t rec_bytes, rec_off;
    const int32_t *tokens;/* [n_rows][L] in the map */
};

static size_t rec_bytes_of(int V) { return 16 + 2 * (size_t)V + (V & 1 ? 2 : 0); }

/* ---------------------------------------------------------- per position */

typedef struct {
    double nll, nll2, nllb, nllb2, nll_nllb, kld, kld2, dp, dp2, dp4;
    int64_t same, n;
    float *kl_v, *dp_v;   /* [N] for percentiles */
} kl_acc;

/* one position's statistics from the model's reduced row (be_score_row, with
 * kld against the base) and the base's exact nll and argmax */
static void kl_position(kl_acc *a, const be_score_row *r, float nll_base, int argmax_base, cinfer_kl_token *pt) {
    float nll = -r->lp;
    double kld = r->kld;
    float dp = expf(-nll) - expf(-nll_base);
    int same = r->argmax == argmax_base;
    a->nll += nll; a->nll2 += (double)nll * nll;
    a->nllb += nll_base; a->nllb2 += (double)nll_base * nll_base;
    a->nll_nllb += (double)nll * nll_base;
    a->kld += kld; a->kld2 += kld * kld;
    a->dp += dp; a->dp2 += (double)dp * dp; a->dp4 += (double)dp * dp * dp * dp;
    a->same += same;
    a->kl_v[a->n] = (float)kld;
    a->dp_v[a->n] = dp;
    a->n++;
    if (pt) { pt->kld = (float)kld; pt->nll_model = nll; pt->nll_base = nll_base; pt->dp = dp; pt->same_top = same; }
}

/* a chunk's *pend positions: the model's rows (first taken from kept's backend, which kept them:
 * ctx_score_take), the base's exact nll and argmax (its forward's, taken likewise from kept_base's backend,
 * or a file's record headers) */
static cinfer_status take_pending(kl_acc *a, cinfer_ctx *kept, cinfer_ctx *kept_base, be_score_row *resm, be_score_row *resb,
                                  const int64_t *at, int *pend, cinfer_kl_token *pt, int64_t *done, int64_t N,
                                  cinfer_progress_cb cb, void *user, char *err, size_t en) {
    int n = *pend;
    *pend = 0;
    if (!n) return CINFER_OK;
    cinfer_status st = kept ? ctx_score_take(kept, n, resm) : CINFER_OK;
    if (st) return cf_err(err, en, st, "%s", cinfer_ctx_error(kept));
    if (kept_base && (st = ctx_score_take(kept_base, n, resb))) return cf_err(err, en, st, "%s", cinfer_ctx_error(kept_base));
    for (int i = 0; i < n; i++) kl_position(a, &resm[i], -resb[i].lp, resb[i].argmax, pt ? pt + at[i] : NULL);
    *done += n;
    return cb && cb(*done, N, user) ? cf_err(err, en, CINFER_EINVAL, "stopped") : CINFER_OK;
}

/* ---------------------------------------------------------- statistics */

static void mean_unc(double sum, double sum2, int64_t n, double *mean, double *unc) {
    *mean = sum / n;
    double v = sum2 / n - *mean * *mean;
    *unc = v > 0 && n > 10 ? sqrt(v / (n - 1)) : 0;
}

static double covariance(double a, double b, double ab, int64_t n) {
    return n < 10 ? 0 : (ab / n - (a / n) * (b / n)) / (n - 1);
}

static int cmp_f(const void *x, const void *y) {
    float a = *(const float *)x, b = *(const float *)y;
    return (a > b) - (a < b);
}

/* a float's bits as an unsigned key in the floats' order (negatives' bits flipped, positives' sign bit set), and back */
static uint32_t f_key(uint32_t u) { return u ^ (u >> 31 ? 0xffffffffu : 0x80000000u); }
static float f_unkey(uint32_t k) {
    k ^= k >> 31 ? 0x80000000u : 0xffffffffu;
    float f;
    memcpy(&f, &k, sizeof f);
    return f;
}

/* a[n] keys ascending: an LSD radix sort, four passes of 8 bits through tmp[n] (the keys end in a) */
static void sort_keys(uint32_t *a, int64_t n, uint32_t *tmp) {
    uint32_t *b = tmp;
    for (int sh = 0; sh < 32; sh += 8) {
        int64_t cnt[257] = {0};
        for (int64_t i = 0; i < n; i++) cnt[((a[i] >> sh) & 255) + 1]++;
        for (int d = 0; d < 256; d++) cnt[d + 1] += cnt[d];
        for (int64_t i = 0; i < n; i++) b[cnt[(a[i] >> sh) & 255]++] = a[i];
        uint32_t *t = a; a = b; b = t;
    }
}

/* llama.cpp's percentile of the sorted v[n]: linear between the ranks around f (n - 1) */
static void pct_ranks(int64_t n, double f, int64_t r[2], double *w) {
    double p = f <= 0 ? 0 : f >= 1 ? (double)(n - 1) : f * (double)(n - 1);
    r[0] = (int64_t)p;
    r[1] = r[0] + 1 < n ? r[0] + 1 : n - 1;
    *w = f <= 0 || f >= 1 ? 0 : p - (double)r[0];
}

#define PCT_NB 65536   /* buckets: a key's top 16 bits */

void kl_percentiles(float *v, int64_t n, const double *f, int nf, double *out) {
    int64_t *cnt = calloc(PCT_NB + 1, sizeof *cnt), r[2];
    uint32_t *u = (uint32_t *)(void *)v, *g = malloc(sizeof *g * (size_t)n);
    unsigned char *want = calloc(PCT_NB, 1);
    double w;
    if (!cnt || !g || !want || nf > KL_PCT_MAX) {   /* out of memory (or more fractions than it lists): sorted in place */
        qsort(v, (size_t)n, sizeof(float), cmp_f);
        for (int i = 0; i < nf; i++) {
            pct_ranks(n, f[i], r, &w);
            out[i] = (1 - w) * v[r[0]] + w * v[r[1]];
        }
        free(cnt);
        free(g);
        free(want);
        return;
    }
    for (int64_t i = 0; i < n; i++) {
        u[i] = f_key(u[i]);
        cnt[(u[i] >> 16) + 1]++;
    }
    for (int b = 0; b < PCT_NB; b++) cnt[b + 1] += cnt[b];   /* cnt[b]: bucket b's first rank */
    /* the buckets that hold a wanted rank (at most 2 nf), ascending, and where each starts among the gathered */
    int wb[2 * KL_PCT_MAX], nw = 0;
    int64_t at[2 * KL_PCT_MAX];
    for (int i = 0; i < nf; i++) {
        pct_ranks(n, f[i], r, &w);
        for (int j = 0; j < 2; j++) {
            int lo = 0, hi = PCT_NB - 1;   /* the last bucket whose first rank is <= r */
            while (lo < hi) {
                int mid = (lo + hi + 1) / 2;
                if (cnt[mid] <= r[j]) lo = mid;
                else hi = mid - 1;
            }
            int k = 0;
            while (k < nw && wb[k] < lo) k++;
            if (k < nw && wb[k] == lo) continue;
            memmove(wb + k + 1, wb + k, sizeof *wb * (size_t)(nw - k));
            wb[k] = lo;
            nw++;
        }
    }
    int64_t gm = 0;
    for (int k = 0; k < nw; k++) {
        want[wb[k]] = 1;
        at[k] = gm;
        gm += cnt[wb[k] + 1] - cnt[wb[k]];
    }
    /* only those buckets' keys, sorted (v's keys no longer needed: its space is the sort's) */
    for (int64_t i = 0, j = 0; i < n; i++)
        if (want[u[i] >> 16]) g[j++] = u[i];
    sort_keys(g, gm, u);
    for (int i = 0; i < nf; i++) {
        pct_ranks(n, f[i], r, &w);
        double x[2];
        for (int j = 0; j < 2; j++) {
            int k = 0;
            while (cnt[wb[k] + 1] <= r[j]) k++;
            x[j] = f_unkey(g[at[k] + (r[j] - cnt[wb[k]])]);
        }
        out[i] = (1 - w) * x[0] + w * x[1];
    }
    free(cnt);
    free(g);
    free(want);
}

static void kl_finish(kl_acc *a, cinfer_kl_stats *o) {
    int64_t n = a->n;
    memset(o, 0, sizeof *o);
    o->tokens = n;
    if (n < 1) return;
    double lq, uq, lb, ub;
    mean_unc(a->nll, a->nll2, n, &lq, &uq);
    mean_unc(a->nllb, a->nllb2, n, &lb, &ub);
    double cov = covariance(a->nll, a->nllb, a->nll_nllb, n);
    o->ppl_model = exp(lq); o->ppl_model_unc = o->ppl_model * uq;
    o->ppl_base = exp(lb); o->ppl_base_unc = o->ppl_base * ub;
    o->cor_ln_ppl = uq > 0 && ub > 0 ? cov / (uq * ub) : 0;
    o->ln_ratio = lq - lb;
    double v = uq * uq + ub * ub - 2 * cov;
    o->ln_ratio_unc = v > 0 ? sqrt(v) : 0;
    o->ratio = exp(o->ln_ratio); o->ratio_unc = o->ratio * o->ln_ratio_unc;
    o->diff = o->ppl_model - o->ppl_base;
    v = o->ppl_model_unc * o->ppl_model_unc + o->ppl_base_unc * o->ppl_base_unc - 2 * o->ppl_model * o->ppl_base * cov;
    o->diff_unc = v > 0 ? sqrt(v) : 0;
    mean_unc(a->kld, a->kld2, n, &o->mean_kld, &o->kld_unc);
    mean_unc(a->dp, a->dp2, n, &o->mean_dp, &o->dp_unc);
    double ms, mu;
    mean_unc(a->dp2, a->dp4, n, &ms, &mu);
    o->rms_dp = sqrt(ms);
    o->rms_dp_unc = o->rms_dp > 0 ? 0.5 / o->rms_dp * mu : 0;
    o->same_top = (double)a->same / n;
    o->same_top_unc = n > 1 ? sqrt(o->same_top * (1 - o->same_top) / (n - 1)) : 0;
    static const double kf[11] = {1, .999, .99, .95, .90, .5, .10, .05, .01, .001, 0};
    static const double df[13] = {1, .999, .99, .95, .90, .75, .5, .25, .10, .05, .01, .001, 0};
    kl_percentiles(a->kl_v, n, kf, 11, o->kld_q);
    kl_percentiles(a->dp_v, n, df, 13, o->dp_q);
}

/* ---------------------------------------------------------- base files */

void cinfer_kl_base_free(cinfer_kl_base *b) {
    if (!b) return;
    if (b->map) munmap(b->map, b->size);
    free(b);
}

const int32_t *cinfer_kl_base_rows(const cinfer_kl_base *b, int *n_rows, int *L, int *n_vocab) {
    if (n_rows) *n_rows = b->n_rows;
    if (L) *L = b->L;
    if (n_vocab) *n_vocab = b->V;
    return b->tokens;
}

cinfer_status cinfer_kl_base_open(const char *path, cinfer_kl_base **out, char *err, size_t en) {
    *out = NULL;
    int fd = open(path, O_RDONLY);
    if (fd < 0) return cf_err(err, en, CINFER_EIO, "%s: %s", path, strerror(errno));
    struct stat sb;
    if (fstat(fd, &sb) || !S_ISREG(sb.st_mode)) { close(fd); return cf_err(err, en, CINFER_EIO, "%s: not a regular file", path); }
    size_t size = (size_t)sb.st_size;
    if (size < KLB_HDR) { close(fd); return cf_err(err, en, CINFER_EFORMAT, "%s: %zu bytes, too short for a base log-prob file", path, size); }
    void *map = mmap(NULL, size, PROT_READ, MAP_PRIVATE, fd, 0);
    close(fd);
    if (map == MAP_FAILED) return cf_err(err, en, CINFER_EIO, "%s: mmap failed", path);
    cinfer_kl_base *b = calloc(1, sizeof *b);
    if (!b) { munmap(map, size); return cf_err(err, en, CINFER_ENOMEM, "out of memory"); }
    b->map = map;
    b->size = size;
    const unsigned char *h = map;
    uint32_t ver, hb, rb;
    int32_t V, L, nr;
    uint64_t nrec;
    memcpy(&ver, h + 8, 4); memcpy(&hb, h + 12, 4); memcpy(&V, h + 16, 4); memcpy(&L, h + 20, 4);
    memcpy(&nr, h + 24, 4); memcpy(&rb, h + 28, 4); memcpy(&nrec, h + 32, 8);
    const char *why = NULL;
    if (memcmp(h, KLB_MAGIC, 8)) why = "bad magic (not written by cinfer kl --save-base)";
    else if (ver != 1 || hb != KLB_HDR) why = "unknown version";
    else if (memcmp(h + 40, (const unsigned char[KLB_HDR - 40]){0}, KLB_HDR - 40)) why = "reserved header bytes are not zero";
    else if (V < 2 || L < 2 || nr < 1 || V > (1 << 24) || L > (1 << 24)) why = "bad vocabulary, length or row count";
    else if (rb != rec_bytes_of(V) || nrec != (uint64_t)nr * (L - 1)) why = "record size or count disagrees with the header";
    else {
        size_t tok = (size_t)nr * L * 4;
        b->rec_off = (KLB_HDR + tok + 63) / 64 * 64;
        size_t need;
        if (!cf_mul_ok((size_t)nrec, rb, &need) || need > SIZE_MAX - b->rec_off || b->rec_off + need != size)
            why = "file size disagrees with the header (truncated?)";
    }
    if (why) { cinfer_kl_base_free(b); return cf_err(err, en, CINFER_EFORMAT, "%s: %s", path, why); }
    b->V = V; b->L = L; b->n_rows = nr; b->rec_bytes = rb;
    b->tokens = (const int32_t *)(const void *)(h + KLB_HDR);
    for (size_t i = 0; i < (size_t)nr * L; i++)
        if (b->tokens[i] < 0 || b->tokens[i] >= V) { cinfer_kl_base_free(b); return cf_err(err, en, CINFER_EFORMAT, "%s: token %zu outside the vocabulary", path, i); }
    *out = b;
    return CINFER_OK;
}

static int pwrite_all(int fd, const void *p, size_t n, off_t off) {
    const char *c = p;
    while (n) {
        ssize_t w = pwrite(fd, c, n, off);
        if (w <= 0) return -1;
        c += w; n -= (size_t)w; off += w;
    }
    return 0;
}

/* ---------------------------------------------------------- the runs */

typedef struct {
    cinfer_ctx *model, *base;   /* model NULL: saving the base */
    cinfer_kl_base *file;
    int fd;                     /* saving: the output */
    size_t rec_off;
} kl_run;

/* The rows in batches of B0, each fed in chunks of W positions; per chunk the
 * base's logits (live) stay in its context's buffer and the model's score op
 * reads them there (or, LM heads folded, the base's normed rows stay and the
 * model's score op computes the base's logits beside its own), or the batch's records (file) are uploaded once per batch;
 * saving, the base's 16-bit codes are made on the backend, in place in
 * records that come back whole. */
static cinfer_status run_rows(kl_run *r, const int32_t *rows, int n_rows, int L, int batch, kl_acc *acc,
                              cinfer_kl_token *per_token, cinfer_progress_cb cb, void *user, char *err, size_t en) {
    cinfer_ctx *any = r->model ? r->model : r->base;
    const be_ops *be = any->m->be;
    int V = any->m->cfg.n_vocab, B0 = batch < n_rows ? batch : n_rows, W = 0, Wb = 0;
    size_t rb = rec_bytes_of(V);
    /* backend bytes per position besides the model's logits: the base's logits (live) or its
     * record (file, saving) */
    size_t extra = r->base && r->model ? (size_t)V * sizeof(float) : rb;
    cinfer_status st = score_chunk_width(any, B0, L - 1, extra, &W, err, en);
    if (!st && r->base && r->model && r->base != r->model) st = score_chunk_width(r->base, B0, L - 1, extra, &Wb, err, en);
    if (st) return st;
    if (Wb && Wb < W) W = Wb;
    /* a live base: both LM heads folded into the score op (the model's tile reads the base's rows
     * through its head, be_score_base.x) or neither (the base's logits stay in its buffer) */
    int materialize = 0;
    if (r->base && r->model) {
        be_score_base probe = {0};
        probe.x = r->base->xo;
        probe.w = &r->base->m->w.lm_head;
        materialize = !(ctx_head_folds(r->base, NULL) && ctx_head_folds(r->model, &probe));
    }
    /* two contexts, both heads folded: both forwards are issued before either is scored, and the two run
     * together on the device (small models' forwards leave most of it idle); CINFER_KL_DEFER=0: not */
    int defer = r->base && r->model && r->base != r->model && !materialize && cf_knob_on("CINFER_KL_DEFER");
    /* and the model's score is not waited for before the next chunk's forward is issued (its results kept
     * by the backend until then) */
    cinfer_ctx *kept = defer && r->model->m->be->score_take ? r->model : NULL;
    /* and, where the backend can order the two contexts, the base's forward goes first: its chain (forward,
     * score, then the model's score, which needs the base's lse) is the chunk's critical path. It overwrites
     * the base's rows, so it starts after the model's last score, which reads them. CINFER_KL_BASE_FIRST=0: not */
    int base_first = defer && be->order_after && cf_knob_on("CINFER_KL_BASE_FIRST");
    /* there, the base's results stay with the backend too: the model's score reads the base's lse where it is
     * (be_score_base.lse_of, ordered after the base's score), so the host waits for neither score mid-chunk */
    cinfer_ctx *kept_base = base_first && kept && r->base->m->be->score_take ? r->base : NULL;
    /* backend records: the batch's (file) or the chunk's (saving) */
    size_t n_rec = r->file ? (size_t)B0 * (L - 1) : r->fd >= 0 ? (size_t)B0 * W : 0;
    unsigned char *drec = n_rec ? be->alloc(any->bc, n_rec * rb) : NULL;
    unsigned char *hrec = r->fd >= 0 ? malloc((size_t)B0 * W * rb) : NULL;
    be_score_row *resb = malloc(sizeof *resb * (size_t)B0 * W), *resm = malloc(sizeof *resm * (size_t)B0 * W);
    float *lseb = malloc(sizeof(float) * (size_t)B0 * W);
    int32_t *idx = malloc(sizeof(int32_t) * (size_t)B0 * W);
    int64_t *at = malloc(sizeof(int64_t) * (size_t)B0 * W);   /* each output's index among all positions */
    int *n_in = malloc(sizeof(int) * 2 * (size_t)B0), pend = 0;
    if ((n_rec && !drec) || (r->fd >= 0 && !hrec) || !resb || !resm || !lseb || !idx || !at || !n_in)
        st = cf_err(err, en, CINFER_ENOMEM, "out of memory for KL buffers");
    int64_t N = (int64_t)n_rows * (L - 1), done = 0;
    for (int r0 = 0; !st && r0 < n_rows; r0 += B0) {
        int B = n_rows - r0 < B0 ? n_rows - r0 : B0;
        int *lo = n_in + B0;
        for (int b = 0; b < B; b++) { n_in[b] = L - 1; lo[b] = 0; }
        const int32_t *ids = rows + (size_t)r0 * L;
        const unsigned char *frec = r->file ? r->file->map + r->file->rec_off + (size_t)r0 * (L - 1) * rb : NULL;
        if (r->file) be->from_host(any->bc, drec, frec, (size_t)B * (L - 1) * rb);   /* once per batch */
        score_plan p;
        if (score_plan_init(&p, ids, B, L, n_in, lo, W)) { st = cf_err(err, en, CINFER_ENOMEM, "out of memory"); break; }
        p.materialize = materialize;
        while (!st && score_plan_next(&p)) {
            for (int i = 0; i < p.n_out; i++) idx[i] = r->file ? p.out_b[i] * (L - 1) + p.out_p[i] : i;
            if (defer) {   /* the forwards issued together (the model's scored after the base's) */
                p.rows_only = 1;
                if (base_first) {
                    be->order_after(r->base->bc, r->model->bc);
                    st = score_plan_forward(r->base, &p, NULL, NULL, 0, resb, err, en);
                }
                if (!st) st = score_plan_forward(r->model, &p, NULL, NULL, 0, resm, err, en);
                p.rows_only = 0;
                /* the last chunk's positions, taken while this one's forward runs (its results waited for
                 * first, when the backend kept them: the model's score ran before this forward) */
                if (!st) st = take_pending(acc, kept, kept_base, resm, resb, at, &pend, per_token, &done, N, cb, user, err, en);
            }
            if (!st && r->base) {
                uint16_t *codes = r->fd >= 0 ? (uint16_t *)(void *)(drec + 16) : NULL;
                if (base_first) {   /* its rows are in: its score */
                    ctx_score_req sr = {p.tgt, NULL, NULL, 0, kept_base ? NULL : resb, 0, 0};
                    if ((st = ctx_score_again(r->base, p.n_out, &sr))) st = cf_err(err, en, st, "%s", cinfer_ctx_error(r->base));
                } else st = score_plan_forward(r->base, &p, NULL, codes, rb / 2, resb, err, en);
                for (int i = 0; !st && !kept_base && i < p.n_out; i++) lseb[i] = resb[i].lse;
            }
            if (!st && r->fd >= 0) {   /* the codes came back with the records: fill in the headers, write */
                be->to_host(any->bc, hrec, drec, (size_t)p.n_out * rb);
                for (int i = 0; i < p.n_out; i++) {
                    unsigned char *h = hrec + (size_t)i * rb;
                    float nll = -resb[i].lp;
                    int32_t am = resb[i].argmax;
                    memcpy(h, &resb[i].code_scale, 4);
                    memcpy(h + 4, &resb[i].code_min, 4);
                    memcpy(h + 8, &nll, 4);
                    memcpy(h + 12, &am, 4);
                }
                for (int i = 0; !st && i < p.n_out;) {   /* each row's positions are consecutive records */
                    int j = i;
                    while (j < p.n_out && p.out_b[j] == p.out_b[i]) j++;
                    int64_t at = (int64_t)(r0 + p.out_b[i]) * (L - 1) + p.out_p[i];
                    if (pwrite_all(r->fd, hrec + (size_t)i * rb, (size_t)(j - i) * rb, (off_t)(r->rec_off + (size_t)at * rb)))
                        st = cf_err(err, en, CINFER_EIO, "writing the base log-probs failed: %s", strerror(errno));
                    i = j;
                }
            }
            if (!st && r->model) {
                be_score_base sb = {0};
                if (r->base && r->base->head_folded) {
                    sb.x = r->base->xo;
                    sb.w = &r->base->m->w.lm_head;
                    sb.lse = lseb;
                    sb.lse_of = kept_base ? r->base->bc : NULL;
                }
                else if (r->base) { sb.z = r->base->lo; sb.lse = lseb; }
                else { sb.rec = drec; sb.rec_bytes = rb; }
                sb.idx = idx;
                if (r->model != r->base && !defer) st = score_plan_forward(r->model, &p, &sb, NULL, 0, resm, err, en);
                else {   /* its rows (deferred), or against itself its logits or rows, are still in its buffers */
                    if (kept_base) be->order_after(r->model->bc, r->base->bc);   /* the base's kept lse, then read */
                    ctx_score_req sr = {p.tgt, &sb, NULL, 0, kept ? NULL : resm, 0, 0};
                    if ((st = ctx_score_again(r->model, p.n_out, &sr))) st = cf_err(err, en, st, "%s", cinfer_ctx_error(r->model));
                }
                for (int i = 0; i < p.n_out; i++) at[i] = (int64_t)(r0 + p.out_b[i]) * (L - 1) + p.out_p[i];
                for (int i = 0; !r->base && i < p.n_out; i++) {   /* a file's nll and argmax: exact in the record's header */
                    float nllb;
                    memcpy(&nllb, frec + (size_t)idx[i] * rb + 8, 4);
                    memcpy(&resb[i].argmax, frec + (size_t)idx[i] * rb + 12, 4);
                    resb[i].lp = -nllb;
                }
                /* the chunk's positions: taken now, or (a live base, deferred) beside the next chunk's forward */
                pend = st ? 0 : p.n_out;
                if (!st && !defer) st = take_pending(acc, NULL, NULL, resm, resb, at, &pend, per_token, &done, N, cb, user, err, en);
                continue;
            }
            done += p.n_out;   /* saving: no positions to take */
            if (!st && cb && cb(done, N, user)) st = cf_err(err, en, CINFER_EINVAL, "stopped");
        }
        score_plan_free(&p);
    }
    if (!st) st = take_pending(acc, kept, kept_base, resm, resb, at, &pend, per_token, &done, N, cb, user, err, en);
    be->free(any->bc, drec);
    free(hrec);
    free(resb);
    free(resm);
    free(lseb);
    free(idx);
    free(at);
    free(n_in);
    return st;
}

static cinfer_status check_rows(int V, const int32_t *rows, int n_rows, int L, int batch, char *err, size_t en) {
    if (!rows || n_rows < 1 || L < 2 || batch < 1)
        return cf_err(err, en, CINFER_EINVAL, "KL needs rows >= 1 (got %d), length >= 2 (got %d), batch >= 1 (got %d)", n_rows, L, batch);
    for (size_t i = 0; i < (size_t)n_rows * L; i++)
        if (rows[i] < 0 || rows[i] >= V)
            return cf_err(err, en, CINFER_EINVAL, "row %zu holds token %d outside the vocabulary [0, %d)", i / L, (int)rows[i], V);
    return CINFER_OK;
}

cinfer_status cinfer_kl_save_base(cinfer_ctx *base, const int32_t *rows, int n_rows, int L, int batch, const char *path,
                                  cinfer_progress_cb cb, void *user, char *err, size_t en) {
    if (!base || !path) return cf_err(err, en, CINFER_EINVAL, "KL save: no base context or path");
    int V = base->m->cfg.n_vocab;
    cinfer_status st = check_rows(V, rows, n_rows, L, batch, err, en);
    if (st) return st;
    char *target = NULL;
    if ((st = cf_write_target(path, &target, err, en))) return st;
    char *tmp = malloc(strlen(target) + 16);
    if (!tmp) { free(target); return cf_err(err, en, CINFER_ENOMEM, "out of memory"); }
    sprintf(tmp, "%s.part", target);
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd < 0) { st = cf_err(err, en, CINFER_EIO, "%s: %s", tmp, strerror(errno)); free(tmp); free(target); return st; }
    unsigned char h[KLB_HDR] = {0};
    uint32_t ver = 1, hb = KLB_HDR, rb = (uint32_t)rec_bytes_of(V);
    int32_t v32 = V, l32 = L, n32 = n_rows;
    uint64_t nrec = (uint64_t)n_rows * (L - 1);
    memcpy(h, KLB_MAGIC, 8); memcpy(h + 8, &ver, 4); memcpy(h + 12, &hb, 4); memcpy(h + 16, &v32, 4);
    memcpy(h + 20, &l32, 4); memcpy(h + 24, &n32, 4); memcpy(h + 28, &rb, 4); memcpy(h + 32, &nrec, 8);
    size_t tok = (size_t)n_rows * L * 4, rec_off = (KLB_HDR + tok + 63) / 64 * 64;
    if (pwrite_all(fd, h, KLB_HDR, 0) || pwrite_all(fd, rows, tok, KLB_HDR) ||
        ftruncate(fd, (off_t)(rec_off + (size_t)nrec * rb)))
        st = cf_err(err, en, CINFER_EIO, "%s: %s", tmp, strerror(errno));
    kl_run r = {NULL, base, NULL, fd, rec_off};
    if (!st) st = run_rows(&r, rows, n_rows, L, batch, NULL, NULL, cb, user, err, en);
    if (!st && fsync(fd)) st = cf_err(err, en, CINFER_EIO, "%s: %s", tmp, strerror(errno));
    if (close(fd) && !st) st = cf_err(err, en, CINFER_EIO, "%s: %s", tmp, strerror(errno));
    if (!st && cf_rename_durable(tmp, target)) st = cf_err(err, en, CINFER_EIO, "%s: %s", path, strerror(errno));
    if (st) unlink(tmp);
    free(tmp);
    free(target);
    return st;
}

cinfer_status cinfer_kl(cinfer_ctx *model, cinfer_ctx *base, cinfer_kl_base *file, const int32_t *rows, int n_rows,
                        int L, int batch, cinfer_kl_token *per_token, cinfer_progress_cb cb, void *user,
                        cinfer_kl_stats *out, char *err, size_t en) {
    if (!model || !out || !base == !file) return cf_err(err, en, CINFER_EINVAL, "KL needs a model and exactly one of a base context or a base file");
    int V = model->m->cfg.n_vocab;
    int Vb = base ? base->m->cfg.n_vocab : file->V;
    if (V != Vb)
        return cf_err(err, en, CINFER_EINVAL, "the models have different vocabularies (base %d tokens, model %d): KL needs the same token ids", Vb, V);
    if (file) { rows = file->tokens; n_rows = file->n_rows; L = file->L; }
    cinfer_status st = check_rows(V, rows, n_rows, L, batch, err, en);
    if (st) return st;
    int64_t N = (int64_t)n_rows * (L - 1);
    kl_acc acc = {0};
    acc.kl_v = malloc(sizeof(float) * (size_t)N);
    acc.dp_v = malloc(sizeof(float) * (size_t)N);
    if (!acc.kl_v || !acc.dp_v) st = cf_err(err, en, CINFER_ENOMEM, "out of memory for %lld KL values", (long long)N);
    kl_run r = {model, base, file, -1, 0};
    if (!st) st = run_rows(&r, rows, n_rows, L, batch, &acc, per_token, cb, user, err, en);
    if (!st) kl_finish(&acc, out);
    free(acc.kl_v);
    free(acc.dp_v);
    return st;
}
