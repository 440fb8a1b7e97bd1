/*
 * score.c — the chunked scoring forward and two scores on it: perplexity
 * (mlx_lm.perplexity's evaluation) and response log-probs (prompt/response
 * pairs, DPO style).
 *
 * Rows are fed through the forward in chunks of W positions, each chunk
 * continuing the cache of the one before, and the LM head runs only at the
 * positions scored: so [B, L, vocab] never exists, only [B*W, vocab], and it
 * stays in the backend: be_ops.score reduces each row there (on CUDA only a
 * few numbers a position cross to the host). W comes from the backend's free
 * memory (score_chunk_width). Padded rows (logprobs) carry their own lengths;
 * a row that is done feeds zero tokens. Per position (be_ref_score_row):
 * CE = logsumexp(z) - z[target] in float32, the exp sum in double; totals in
 * double. Perplexity's SE is the delta method
 * with the ddof-1 sample std of the losses, computed in two passes.
 * References: mlx_lm/perplexity.py (0.32), mlx-bun src/eval/perplexity.ts.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include "engine/score.h"
#include "util.h"

/* CINFER_SCORE_CHUNK=N forces chunks of N positions: the tests run the multi-chunk path
 * (pos0 > 0 for every row of a batch) on rows shorter than the natural width. */
static int forced_chunk(void) {
    const char *e = getenv("CINFER_SCORE_CHUNK");
    int n = e ? atoi(e) : 0;
    return n > 0 ? n : 0;
}

cinfer_status score_chunk_width(cinfer_ctx *c, int B, int cap, size_t extra, int *W, char *err, size_t en) {
    const cinfer_model *m = c->m;
    int forced = forced_chunk();
    size_t w;
    if (forced) w = cap > 0 && forced > cap ? (size_t)cap : (size_t)forced;
    else {
        size_t avail = m->be->mem_available ? m->be->mem_available(c->bc) / 4 : 0;
        size_t budget = avail < SCORE_OUT_BYTES ? SCORE_OUT_BYTES : avail > SCORE_MAX_BYTES ? SCORE_MAX_BYTES : avail;
        size_t per = (size_t)m->cfg.n_vocab * sizeof(float) + extra +
                     ((size_t)m->cfg.hidden + arch_scratch_floats(m->arch, &m->cfg, 1)) * sizeof(float);
        size_t rows = budget / per;
        if (rows < 64) rows = 64;
        w = rows / (size_t)(B > 0 ? B : 1);
        if (w < 8) w = 8;
        if (cap > 0 && w > (size_t)cap) w = (size_t)cap;
        if (w < 1) w = 1;
    }
    *W = (int)w;
    if (ctx_reserve_out(c, (size_t)B * w)) return cf_err(err, en, CINFER_ENOMEM, "%s", cinfer_ctx_error(c));
    return CINFER_OK;
}

void score_plan_free(score_plan *p) {
    free(p->ids_c);
    free(p->lens_c);
    free(p->pairs);
    free(p->out_b);
    free(p->tgt);
    memset(p, 0, sizeof *p);
}

cinfer_status score_plan_init(score_plan *p, const int32_t *ids, int B, int L, const int *n_in, const int *lo, int W) {
    memset(p, 0, sizeof *p);
    p->B = B; p->L = L; p->ids = ids; p->n_in = n_in; p->lo = lo; p->W = W;
    p->s = -W;
    for (int b = 0; b < B; b++) if (n_in[b] > p->max_n) p->max_n = n_in[b];
    size_t bw = (size_t)B * W;
    p->ids_c = malloc(bw * sizeof *p->ids_c);
    p->lens_c = malloc(2 * (size_t)B * sizeof *p->lens_c);
    p->pairs = malloc(2 * bw * sizeof *p->pairs);
    p->out_b = malloc(2 * bw * sizeof *p->out_b);
    p->tgt = malloc(bw * sizeof *p->tgt);
    if (!p->ids_c || !p->lens_c || !p->pairs || !p->out_b || !p->tgt) { score_plan_free(p); return CINFER_ENOMEM; }
    p->pos0 = p->lens_c + B;
    p->out_p = p->out_b + bw;
    return CINFER_OK;
}

void score_plan_skip(score_plan *p, const int *start) {
    p->start = start;
    p->s0 = p->max_n;
    for (int b = 0; b < p->B; b++) p->s0 = start[b] < p->s0 ? start[b] : p->s0;
}

int score_plan_next(score_plan *p) {
    p->s = p->s < 0 ? p->s0 : p->s + p->W;
    if (p->s >= p->max_n) return 0;
    p->w = p->max_n - p->s < p->W ? p->max_n - p->s : p->W;
    p->n_out = 0;
    for (int b = 0; b < p->B; b++) {
        int a = p->start && p->start[b] > p->s ? p->start[b] : p->s;   /* the row's first position fed in this chunk */
        if (a > p->n_in[b]) a = p->n_in[b];
        int n = (p->s + p->w < p->n_in[b] ? p->s + p->w : p->n_in[b]) - a;
        n = n < 0 ? 0 : n;
        p->lens_c[b] = n;
        p->pos0[b] = a;
        for (int i = 0; i < p->w; i++) p->ids_c[(size_t)b * p->w + i] = i < n ? p->ids[(size_t)b * p->L + a + i] : 0;
        for (int i = 0; i < n; i++) {
            if (a + i < p->lo[b]) continue;
            p->pairs[2 * p->n_out] = b;
            p->pairs[2 * p->n_out + 1] = i;
            p->out_b[p->n_out] = b;
            p->out_p[p->n_out] = a + i;
            p->tgt[p->n_out] = p->ids[(size_t)b * p->L + a + i + 1];
            p->n_out++;
        }
    }
    return 1;
}

cinfer_status score_plan_forward(cinfer_ctx *c, const score_plan *p, const be_score_base *base, uint16_t *codes,
                                 size_t code_stride, be_score_row *out, char *err, size_t en) {
    int ctx_len = c->m->cfg.max_pos;
    if (p->max_n > ctx_len)   /* positions past the model's context score garbage: refuse */
        return cf_err(err, en, CINFER_EINVAL, "a row feeds %d positions but the model's context holds %d "
                      "(max_position_embeddings): use shorter rows (--sequence-length <= %d)", p->max_n, ctx_len, ctx_len + 1);
    if (p->s == 0 && !p->start) cinfer_ctx_reset(c);
    ctx_score_req sr = {p->tgt, base, codes, code_stride, out, p->materialize, p->rows_only};
    cinfer_status st = ctx_forward_score(c, p->ids_c, p->B, p->w, p->lens_c, p->pos0, p->pairs, p->n_out, &sr);
    if (st) return cf_err(err, en, st, "%s", cinfer_ctx_error(c));
    return CINFER_OK;
}

/* ----------------------------------------------------------- perplexity */

static cinfer_status check_rows(const cinfer_ctx *c, const int32_t *rows, int n_rows, int L, int batch, char *err, size_t en) {
    if (!c || !rows || n_rows < 1 || L < 2 || batch < 1)
        return cf_err(err, en, CINFER_EINVAL, "scoring needs rows >= 1 (got %d), length >= 2 (got %d), batch >= 1 (got %d)", n_rows, L, batch);
    int V = c->m->cfg.n_vocab;
    for (size_t i = 0; i < (size_t)n_rows * L; i++)
        if (rows[i] < 0 || rows[i] >= V)
            return cf_err(err, en, CINFER_EINVAL, "row %zu holds token %d outside the vocabulary [0, %d)", i / L, (int)rows[i], V);
    return CINFER_OK;
}

cinfer_status cinfer_perplexity(cinfer_ctx *c, const int32_t *rows, int n_rows, int L, int batch, float *nll,
                                cinfer_progress_cb cb, void *user, cinfer_ppl_result *out, char *err, size_t en) {
    cinfer_status st = check_rows(c, rows, n_rows, L, batch, err, en);
    if (st) return st;
    memset(out, 0, sizeof *out);
    int B0 = batch < n_rows ? batch : n_rows;
    int64_t N = (int64_t)n_rows * (L - 1);
    float *own = nll ? NULL : malloc(sizeof(float) * (size_t)N);
    float *loss = nll ? nll : own;
    int *n_in = malloc(sizeof(int) * 2 * (size_t)B0), W = 0;
    if ((st = score_chunk_width(c, B0, L - 1, 0, &W, err, en))) { free(own); free(n_in); return st; }
    be_score_row *res = malloc(sizeof *res * (size_t)B0 * W);
    if (!loss || !n_in || !res) { free(own); free(n_in); free(res); return cf_err(err, en, CINFER_ENOMEM, "out of memory for scoring buffers"); }
    int *lo = n_in + B0;
    double t0 = cf_now();
    int64_t done = 0;
    for (int r0 = 0; !st && r0 < n_rows; r0 += B0) {
        int B = n_rows - r0 < B0 ? n_rows - r0 : B0;
        for (int b = 0; b < B; b++) { n_in[b] = L - 1; lo[b] = 0; }
        const int32_t *ids = rows + (size_t)r0 * L;
        score_plan p;
        if (score_plan_init(&p, ids, B, L, n_in, lo, W)) { st = cf_err(err, en, CINFER_ENOMEM, "out of memory"); break; }
        while (!st && score_plan_next(&p)) {
            st = score_plan_forward(c, &p, NULL, NULL, 0, res, err, en);
            for (int i = 0; !st && i < p.n_out; i++) loss[(size_t)(r0 + p.out_b[i]) * (L - 1) + p.out_p[i]] = -res[i].lp;
            done += p.n_out;
            if (!st && cb && cb(done, N, user)) st = cf_err(err, en, CINFER_EINVAL, "stopped");
        }
        score_plan_free(&p);
    }
    out->seconds = cf_now() - t0;
    if (!st) {
        double s = 0, s2 = 0;
        for (int64_t i = 0; i < N; i++) s += loss[i];
        double mean = s / N;
        for (int64_t i = 0; i < N; i++) s2 += (loss[i] - mean) * (loss[i] - mean);
        out->mean_loss = mean;
        out->std_loss = N > 1 ? sqrt(s2 / (N - 1)) : 0;
        out->perplexity = exp(mean);
        out->standard_error = out->perplexity * out->std_loss / sqrt((double)N);
        out->tokens = N;
        out->rows = n_rows;
    }
    free(own);
    free(n_in);
    free(res);
    return st;
}

/* ------------------------------------------------------ response logprobs */

cinfer_status cinfer_response_logprobs(cinfer_ctx *c, const cinfer_lp_seq *seqs, int n, int batch, double *sum,
                                       float *per_token, cinfer_progress_cb cb, void *user, char *err, size_t en) {
    return cinfer_response_logprobs_tier(c, NULL, seqs, n, batch, sum, per_token, cb, user, NULL, err, en);
}

/* with a tier: each row's prompt but its last token comes through cinfer_tier_prefill (restored, or fed and
 * stored), so the plan feeds only the prompt's last token and the response */
static cinfer_status tier_rows(cinfer_ctx *c, cinfer_tier *t, const cinfer_lp_seq *q, int B, int *start, int64_t *cached,
                               char *err, size_t en) {
    cinfer_ctx_reset(c);
    for (int b = 0; b < B; b++) {
        int k = 0;
        if (cinfer_tier_prefill(t, c, b, q[b].prompt, q[b].n_prompt, &k))
            return cf_err(err, en, CINFER_EIO, "--cache-dir: %s", cinfer_tier_error(t));
        start[b] = q[b].n_prompt - 1;
        if (cached) *cached += k;
    }
    return CINFER_OK;
}

cinfer_status cinfer_response_logprobs_tier(cinfer_ctx *c, cinfer_tier *tier, const cinfer_lp_seq *seqs, int n, int batch,
                                            double *sum, float *per_token, cinfer_progress_cb cb, void *user,
                                            int64_t *cached, char *err, size_t en) {
    if (cached) *cached = 0;
    if (!c || n < 0 || (n > 0 && (!seqs || !sum)) || batch < 1) return cf_err(err, en, CINFER_EINVAL, "logprobs: bad arguments");
    int V = c->m->cfg.n_vocab;
    int64_t total = 0;
    for (int k = 0; k < n; k++) {
        const cinfer_lp_seq *q = &seqs[k];
        if (q->n_prompt < 1 || q->n_response < 0 || !q->prompt || (q->n_response && !q->response))
            return cf_err(err, en, CINFER_EINVAL, "sequence %d: need a prompt of at least one token (got %d) and a response", k, q->n_prompt);
        if (q->n_prompt > INT32_MAX / 2 - q->n_response) return cf_err(err, en, CINFER_EINVAL, "sequence %d too long", k);
        for (int i = 0; i < q->n_prompt + q->n_response; i++) {
            int32_t t = i < q->n_prompt ? q->prompt[i] : q->response[i - q->n_prompt];
            if (t < 0 || t >= V) return cf_err(err, en, CINFER_EINVAL, "sequence %d holds token %d outside the vocabulary [0, %d)", k, (int)t, V);
        }
        total += q->n_response;
    }
    int B0 = batch < n ? batch : (n ? n : 1);
    int64_t *off = malloc(sizeof *off * (size_t)(n + 1));
    int *n_in = malloc(sizeof(int) * 3 * (size_t)B0);
    if (!off || !n_in) { free(off); free(n_in); return cf_err(err, en, CINFER_ENOMEM, "out of memory"); }
    off[0] = 0;
    for (int k = 0; k < n; k++) off[k + 1] = off[k] + seqs[k].n_response;
    int *lo = n_in + B0;
    cinfer_status st = CINFER_OK;
    int64_t done = 0;
    for (int k0 = 0; !st && k0 < n; k0 += B0) {
        int B = n - k0 < B0 ? n - k0 : B0, L = 1;
        for (int b = 0; b < B; b++) {
            const cinfer_lp_seq *q = &seqs[k0 + b];
            int len = q->n_prompt + q->n_response;
            L = len > L ? len : L;
            n_in[b] = len - 1;
            lo[b] = q->n_prompt - 1;
            sum[k0 + b] = 0;
        }
        int32_t *ids = calloc((size_t)B * L, sizeof *ids), W = 0;
        if ((st = score_chunk_width(c, B, L, 0, &W, err, en))) { free(ids); break; }
        be_score_row *res = malloc(sizeof *res * (size_t)B * W);
        score_plan p = {0};
        if (!ids || !res || score_plan_init(&p, ids, B, L, n_in, lo, W)) st = cf_err(err, en, CINFER_ENOMEM, "out of memory");
        if (!st && tier && !(st = tier_rows(c, tier, seqs + k0, B, lo + B0, cached, err, en))) score_plan_skip(&p, lo + B0);
        for (int b = 0; !st && b < B; b++) {
            const cinfer_lp_seq *q = &seqs[k0 + b];
            memcpy(ids + (size_t)b * L, q->prompt, sizeof *ids * q->n_prompt);
            if (q->n_response) memcpy(ids + (size_t)b * L + q->n_prompt, q->response, sizeof *ids * q->n_response);
        }
        while (!st && score_plan_next(&p)) {
            st = score_plan_forward(c, &p, NULL, NULL, 0, res, err, en);
            for (int i = 0; !st && i < p.n_out; i++) {
                int b = p.out_b[i], pos = p.out_p[i];
                float lp = res[i].lp;
                sum[k0 + b] += lp;
                if (per_token) per_token[off[k0 + b] + pos - lo[b]] = lp;
            }
            done += p.n_out;
            if (!st && cb && cb(done, total, user)) st = cf_err(err, en, CINFER_EINVAL, "stopped");
        }
        score_plan_free(&p);
        free(ids);
        free(res);
    }
    free(off);
    free(n_in);
    return st;
}
