/*
 * ctx.c — contexts and the forward contract: embed (times the arch's scale)
 * -> decoder blocks (the caches attend and mask) -> gather only the requested
 * positions -> final norm -> LM head (-> final softcap) in chunks of OUT_CHUNK rows, so [B, L, vocab] is never
 * materialised. Buffers grow to the largest batch seen and are reused; a
 * decode step allocates nothing.
 */
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <string.h>
#include "engine/engine.h"
#include "util.h"


#define OUT_CHUNK 64
enum { OUT_LAST, OUT_ALL, OUT_LIST };

cinfer_status ctx_fail(cinfer_ctx *c, cinfer_status s, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(c->err, sizeof c->err, fmt, ap);
    va_end(ap);
    return s;
}

void cinfer_ctx_free(cinfer_ctx *c) {
    if (!c) return;
    const be_ops *be = c->m->be;
    for (int g = 0; g < c->n_groups; g++) kv_group_free(c->groups[g]);
    free(c->groups);
    free(c->layer_group);
    free(c->layer_cache);
    free(c->kvq_bits);
    free(c->kvq_group);
    if (c->bc) {
        be->free(c->bc, c->x);
        be->free(c->bc, c->scratch);
        be->free(c->bc, c->xo);
        be->free(c->bc, c->lo);
        free(c->out_idx);
        be->ctx_free(c->bc);
    }
    free(c->pos);
    free(c->ids);
    free(c->rows);
    free(c);
}

/* the cache policy of layer l: the model's window, or --max-kv-size's
 * rotating window with 4 sink tokens (a model window no longer than it wins) */
static void layer_policy(const cinfer_ctx *c, int l, int *window, int *keep) {
    int w = arch_layer_window(c->m->arch, &c->m->cfg, l);
    *window = w;
    *keep = 0;
    if (c->max_kv > 0 && (!w || w > c->max_kv)) {
        *window = c->max_kv;
        *keep = c->max_kv > 4 ? 4 : c->max_kv - 1;
    }
}

/* one group per distinct layer policy; each layer's storage joins its group */
static cinfer_status build_groups(cinfer_ctx *c, char *err, size_t n) {
    const model_config *cfg = &c->m->cfg;
    c->groups = calloc((size_t)cfg->n_layer, sizeof *c->groups);
    c->layer_group = calloc((size_t)cfg->n_layer, sizeof *c->layer_group);
    c->layer_cache = calloc((size_t)cfg->n_layer, sizeof *c->layer_cache);
    if (!c->groups || !c->layer_group || !c->layer_cache) return cf_err(err, n, CINFER_ENOMEM, "out of memory");
    for (int l = 0; l < cfg->n_layer; l++) {
        int w, k, gk;
        layer_policy(c, l, &w, &k);
        kv_group *g = NULL;
        for (int i = 0; i < c->n_groups && !g; i++)
            if (kv_group_window(c->groups[i], &gk) == w && gk == k) g = c->groups[i];
        if (!g) {
            g = kv_group_new(c->m->be, c->bc, &c->budget, c->n_seq, c->kv_page, w, k);
            if (!g) return cf_err(err, n, CINFER_ENOMEM, "out of memory");
            c->groups[c->n_groups++] = g;
        }
        kv_cache *kc = ctx_kvq_layer(c, l);
        if (!kc || kv_group_add(g, kc)) return cf_err(err, n, CINFER_ENOMEM, "out of memory");
        c->layer_group[l] = g;
        c->layer_cache[l] = kc;
    }
    return CINFER_OK;
}

static cinfer_status kv_options(cinfer_ctx *c, const cinfer_ctx_opts *o, char *err, size_t n) {
    c->kv_dt = o && o->kv_f16 ? BE_F16 : BE_F32;
    const char *dt = o ? o->kv_dtype : NULL;
    if (dt && !be_dtype_from_name(dt, &c->kv_dt))
        return cf_err(err, n, CINFER_EINVAL, "KV dtype '%s' is not one of f32, f16, bf16", dt);
    c->n_seq = o && o->max_seqs ? o->max_seqs : 64;
    c->kv_page = o && o->kv_page ? o->kv_page : 128;
    c->max_kv = o ? o->max_kv_size : 0;
    c->prefill_step = o && o->prefill_step_size ? o->prefill_step_size : 2048;
    if (c->prefill_step < 1) return cf_err(err, n, CINFER_EINVAL, "prefill_step_size %d < 1", c->prefill_step);
    if (c->n_seq < 1 || c->n_seq > 65536) return cf_err(err, n, CINFER_EINVAL, "max_seqs %d outside [1, 65536]", c->n_seq);
    if (c->kv_page < 1 || c->kv_page > 65536 || (c->kv_page & (c->kv_page - 1)))
        return cf_err(err, n, CINFER_EINVAL, "KV page size %d is not a power of two in [1, 65536]", c->kv_page);
    if (c->max_kv < 0 || c->max_kv == 1)
        return cf_err(err, n, CINFER_EINVAL, "max_kv_size %d: must be 0 (off) or at least 2", c->max_kv);
    const be_ops *be = c->m->be;
    size_t avail = be->mem_available ? be->mem_available(c->bc) : (size_t)4 << 30;
    c->budget.limit = o && o->kv_memory ? o->kv_memory : avail / 4 * 3;
    return CINFER_OK;
}

/* cinfer_ctx_opts.prefill_act -> be_ops.prefill_act */
static cinfer_status prefill_act_option(cinfer_ctx *c, const cinfer_ctx_opts *o, char *err, size_t n) {
    const char *v = o ? o->prefill_act : NULL;
    int mode = !v || !strcmp(v, "auto") ? BE_ACT_AUTO : !strcmp(v, "f32") ? BE_ACT_F32 : !strcmp(v, "bf16") ? BE_ACT_BF16 : -1;
    if (mode < 0) return cf_err(err, n, CINFER_EINVAL, "prefill_act '%s': auto, f32 or bf16", v);
    if (mode == BE_ACT_AUTO) return CINFER_OK;
    if (!c->m->be->prefill_act)
        return cf_err(err, n, CINFER_EINVAL, "prefill_act '%s' is a CPU setting; the %s backend has its own precision "
                      "(batch_invariant keeps its activations f32)", v, c->m->be->name);
    c->m->be->prefill_act(c->bc, mode);
    return CINFER_OK;
}

cinfer_status cinfer_ctx_new(cinfer_model *m, const cinfer_ctx_opts *o, cinfer_ctx **out, char *err, size_t n) {
    *out = NULL;
    cinfer_ctx *c = calloc(1, sizeof *c);
    if (!c) return cf_err(err, n, CINFER_ENOMEM, "out of memory");
    c->m = m;
    int nt = o && o->n_threads > 0 ? o->n_threads : m->n_threads;
    if (m->be->ctx_new(&c->bc, nt)) { free(c); return cf_err(err, n, CINFER_EBACKEND, "%s backend failed to start", m->be->name); }
    cinfer_status st = kv_options(c, o, err, n);
    if (!st) st = ctx_kvq_options(c, o, err, n);
    if (!st) st = build_groups(c, err, n);
    if (!st && o && o->batch_invariant && m->be->batch_invariant) m->be->batch_invariant(c->bc, 1);
    if (!st) st = prefill_act_option(c, o, err, n);
    if (st) {
        cinfer_ctx_free(c);
        return st;
    }
    *out = c;
    return CINFER_OK;
}

const char *cinfer_ctx_error(const cinfer_ctx *c) { return c ? c->err : "NULL context"; }

size_t cinfer_ctx_memory_bytes(const cinfer_ctx *c) {
    const model_config *cfg = &c->m->cfg;
    size_t b = c->m->st.total_bytes + cinfer_ctx_cache_bytes(c);
    if (c->cap_tokens)
        b += c->cap_tokens * (cfg->hidden * sizeof(float) + sizeof *c->pos + sizeof *c->ids) +
             arch_scratch_floats(c->m->arch, cfg, (int)c->cap_tokens) * sizeof(float);
    if (c->xo) b += c->cap_out * cfg->hidden * sizeof(float);
    if (c->lo) b += c->cap_out * cfg->n_vocab * sizeof(float);
    return b;
}

/* grows the token buffers to T tokens and B rows */
static cinfer_status reserve(cinfer_ctx *c, size_t T, int B) {
    const be_ops *be = c->m->be;
    const model_config *cfg = &c->m->cfg;
    if (T > INT_MAX) return ctx_fail(c, CINFER_EINVAL, "forward: a batch of %zu tokens is too large (at most %d)", T, INT_MAX);
    if (T > c->cap_tokens) {
        be->free(c->bc, c->x);
        be->free(c->bc, c->scratch);
        free(c->pos);
        free(c->ids);
        c->x = be->alloc(c->bc, T * cfg->hidden * sizeof(float));
        c->scratch = be->alloc(c->bc, arch_scratch_floats(c->m->arch, cfg, (int)T) * sizeof(float));
        c->pos = malloc(T * sizeof *c->pos);
        c->ids = malloc(T * sizeof *c->ids);
        c->cap_tokens = (!c->x || !c->scratch || !c->pos || !c->ids) ? 0 : T;
        if (!c->cap_tokens) return ctx_fail(c, CINFER_ENOMEM, "out of memory for a batch of %zu tokens", T);
    }
    if (!c->xo || !c->lo || !c->out_idx) {   /* each on its own: one may have failed on an earlier call */
        if (c->cap_out < OUT_CHUNK) c->cap_out = OUT_CHUNK;
        if (!c->xo) c->xo = be->alloc(c->bc, c->cap_out * cfg->hidden * sizeof(float));
        if (!c->lo) c->lo = be->alloc(c->bc, c->cap_out * cfg->n_vocab * sizeof(float));
        if (!c->out_idx) c->out_idx = malloc(c->cap_out * sizeof *c->out_idx);
        if (!c->xo || !c->lo || !c->out_idx) return ctx_fail(c, CINFER_ENOMEM, "out of memory for the logits buffers");
    }
    if (B > c->cap_rows) {
        free(c->rows);
        c->rows = malloc(sizeof(int) * (size_t)B * 3);
        if (!c->rows) { c->cap_rows = 0; return ctx_fail(c, CINFER_ENOMEM, "out of memory"); }
        c->cap_rows = B;
    }
    return CINFER_OK;
}

cinfer_status ctx_reserve_out(cinfer_ctx *c, size_t rows) {
    if (rows <= c->cap_out && c->xo && c->lo && c->out_idx) return CINFER_OK;
    const be_ops *be = c->m->be;
    const model_config *cfg = &c->m->cfg;
    be->free(c->bc, c->xo);
    be->free(c->bc, c->lo);
    free(c->out_idx);
    c->xo = c->lo = NULL;
    c->out_idx = NULL;
    c->cap_out = rows > OUT_CHUNK ? rows : OUT_CHUNK;
    c->xo = be->alloc(c->bc, c->cap_out * cfg->hidden * sizeof(float));
    c->lo = be->alloc(c->bc, c->cap_out * cfg->n_vocab * sizeof(float));
    c->out_idx = malloc(c->cap_out * sizeof *c->out_idx);
    if (!c->xo || !c->lo || !c->out_idx) {
        char msg[256];
        if (be->status) be->status(c->bc, msg, sizeof msg);   /* a failed allocation leaves the backend usable */
        return ctx_fail(c, CINFER_ENOMEM, "out of memory for logits buffers of %zu rows", rows);
    }
    return CINFER_OK;
}

/* a device backend records its first failure; report it as the forward's */
static cinfer_status backend_status(cinfer_ctx *c) {
    const be_ops *be = c->m->be;
    char msg[256];
    if (be->status && be->status(c->bc, msg, sizeof msg))
        return ctx_fail(c, CINFER_EBACKEND, "forward: %s backend failure: %s", be->name, msg);
    return CINFER_OK;
}

/* prepares the step in every group; on failure the groups prepared so far are undone */
static cinfer_status prepare_groups(cinfer_ctx *c, int B, const int *seq, const int *pos0, const int *len) {
    char msg[400];
    for (int g = 0; g < c->n_groups; g++) {
        cinfer_status st = kv_group_prepare(c->groups[g], B, seq, pos0, len, msg, sizeof msg);
        if (st) {
            while (g-- > 0) kv_group_abort(c->groups[g]);
            return ctx_fail(c, st, "forward: %s", msg);
        }
    }
    return CINFER_OK;
}

static void finish_groups(cinfer_ctx *c, int ok) {
    for (int g = 0; g < c->n_groups; g++) {
        if (ok) kv_group_commit(c->groups[g]);
        else kv_group_abort(c->groups[g]);
    }
}

/* the (row, position) of each logits row: the hidden-state row it reads */
static cinfer_status out_row(cinfer_ctx *c, int mode, int k, int B, int L, const int *len, const int *out_rows, int *row) {
    if (mode == OUT_LAST) *row = k * L + len[k] - 1;
    else if (mode == OUT_ALL) *row = k;
    else {
        int b = out_rows[2 * k], p = out_rows[2 * k + 1];
        if (b < 0 || b >= B || p < 0 || p >= len[b])
            return ctx_fail(c, CINFER_EINVAL, "forward: output (row %d, position %d) is not a true position of the batch", b, p);
        *row = b * L + p;
    }
    return CINFER_OK;
}

/* what a forward returns, one of: logits [rows][vocab] to the host; argmax: each row's greedy token
 * (a backend with an argmax op); sr: the score op's statistics; smp: the sample op's picks; head: the LM
 * head runs with nothing reduced or copied (a benchmark's forward) */
typedef struct sample_req {
    const be_sample_row *p;   /* [rows] */
    const be_logit_edit *edits;
    int n_edits;
    be_sample_out *out;       /* [rows] */
} sample_req;
typedef struct fwd_out {
    float *logits;
    int32_t *argmax;
    const ctx_score_req *sr;
    const sample_req *smp;
    int head;
    int keep;   /* a chained greedy step: the argmax stays on the device (ids NULL: the last kept one is the input) */
} fwd_out;

/* one forward of B rows of L tokens, its outputs as o asks. Everything is validated and every page
 * reserved before the first op runs. */
static cinfer_status forward(cinfer_ctx *c, const int32_t *ids, int B, int L, const int *seqs, const int *lens,
                             const int *pos0_in, int mode, const int *out_rows, int n_out, const fwd_out *o) {
    float *logits = o->logits;
    int32_t *argmax = o->argmax;
    const ctx_score_req *sr = o->sr;
    const sample_req *smp = o->smp;
    cinfer_model *m = c->m;
    const model_config *cfg = &m->cfg;
    const be_ops *be = m->be;
    c->err[0] = 0;
    if (B < 1 || L < 1 || (!ids && !(o->keep && B == 1 && L == 1)))
        return ctx_fail(c, CINFER_EINVAL, "forward: need B >= 1 and L >= 1 (got %d, %d) and token ids", B, L);
    if (mode == OUT_LIST && (n_out < 0 || (n_out > 0 && !out_rows)))
        return ctx_fail(c, CINFER_EINVAL, "forward: %d output positions requested", n_out);
    size_t T = (size_t)B * L;
    cinfer_status st = reserve(c, T, B);
    if (st) return st;
    int *len = c->rows, *pos0 = c->rows + B, *seq = c->rows + 2 * B;
    for (int b = 0; b < B; b++) {
        seq[b] = seqs ? seqs[b] : b;
        if (seq[b] < 0 || seq[b] >= c->n_seq)
            return ctx_fail(c, CINFER_EINVAL, "forward: row %d names sequence %d; the context holds sequences 0..%d%s", b,
                            seq[b], c->n_seq - 1, seqs ? "" : " (raise max_seqs for larger batches)");
        len[b] = lens ? lens[b] : L;
        if (len[b] < 0 || len[b] > L) return ctx_fail(c, CINFER_EINVAL, "forward: row %d has length %d outside [0, %d]", b, len[b], L);
        if (mode == OUT_LAST && len[b] < 1) return ctx_fail(c, CINFER_EINVAL, "forward: row %d is empty", b);
        int have = cinfer_seq_len(c, seq[b]);
        pos0[b] = pos0_in ? pos0_in[b] : have;
        if (pos0[b] < 0 || pos0[b] > have)
            return ctx_fail(c, CINFER_EINVAL, "forward: row %d starts at position %d but sequence %d holds %d tokens", b,
                            pos0[b], seq[b], have);
        for (int i = 0; i < L; i++) {
            int32_t id = ids && i < len[b] ? ids[(size_t)b * L + i] : 0;   /* (no ids: the device's) */
            if (id < 0 || id >= cfg->n_vocab)
                return ctx_fail(c, CINFER_EINVAL, "forward: token id %d outside the vocabulary [0, %d)", (int)id, cfg->n_vocab);
            c->ids[(size_t)b * L + i] = id;
            c->pos[(size_t)b * L + i] = pos0[b] + i;
        }
    }
    int total = mode == OUT_LAST ? B : mode == OUT_ALL ? (int)T : n_out, *rows = c->out_idx, oc = (int)c->cap_out;
    for (int k = 0; k < total && mode == OUT_LIST; k++)
        if ((st = out_row(c, mode, k, B, L, len, out_rows, rows))) return st;
    if ((st = prepare_groups(c, B, seq, pos0, len))) return st;
    /* small forwards and decode steps of any batch (one token per row) are bracketed so a
     * device backend may replay them as a graph */
    int step = be->step_begin && (T <= 8 || L == 1);
    if (step) be->step_begin(c->bc);
    be->embed(c->bc, &m->w.tok_embd, ids ? c->ids : NULL, (int)T, c->x);
    if (cfg->embed_scale > 0) be->scale(c->bc, c->x, T * (size_t)cfg->hidden, cfg->embed_scale);
    block_batch bb = {B, L, pos0, len, c->pos};
    arch_forward(m->arch, be, c->bc, cfg, &m->w, c->layer_group, c->layer_cache, &bb, c->x, c->scratch);
    /* a scoring forward without codes reduces its logits where the backend computes them, when it can */
    int fold = sr && !sr->codes && !sr->materialize && ctx_head_folds(c, sr->base);
    if (sr && sr->rows_only && (!fold || total > oc))
        return ctx_fail(c, CINFER_EINVAL, "forward: %d rows only, but the head %s", total,
                        fold ? "needs more than one pass of the logits buffers" : "does not fold into the score op");
    c->head_folded = fold;
    for (int r0 = 0; r0 < total && (logits || argmax || o->keep || sr || smp || o->head); r0 += oc) {
        int nr = total - r0 < oc ? total - r0 : oc;
        for (int i = 0; i < nr; i++) out_row(c, mode, r0 + i, B, L, len, out_rows, &rows[i]);
        be->gather(c->bc, c->x, cfg->hidden, rows, nr, c->xo);
        be->rmsnorm(c->bc, c->xo, nr, cfg->hidden, &m->w.out_norm, cfg->norm_add, cfg->eps, c->xo);
        if (sr && sr->rows_only) break;
        if (!fold) be->matmul(c->bc, c->xo, nr, &m->w.lm_head, NULL, c->lo);
        if (!fold && cfg->final_softcap > 0) be->softcap(c->bc, c->lo, (size_t)nr * cfg->n_vocab, cfg->final_softcap);
        if (step && !argmax && !o->keep) { be->step_end(c->bc); step = 0; }
        be_score_base sb;
        if (sr && sr->base) { sb = *sr->base; sb.idx += r0; }
        if (argmax || o->keep) {   /* in the step: a backend may issue it with the step's graph (its rows are written by step_end) */
            be->argmax(c->bc, c->lo, nr, cfg->n_vocab, o->keep ? NULL : argmax + r0);
            if (step) { be->step_end(c->bc); step = 0; }
        } else if (smp) be->sample(c->bc, c->lo, nr, cfg->n_vocab, smp->p + r0, smp->edits, smp->n_edits, smp->out + r0);
        else if (fold) be->score_head(c->bc, c->xo, nr, &m->w.lm_head, sr->tgt + r0, sr->base ? &sb : NULL, sr->out + r0);
        else if (sr)
            be->score(c->bc, c->lo, nr, cfg->n_vocab, sr->tgt + r0, sr->base ? &sb : NULL,
                      sr->codes ? sr->codes + (size_t)r0 * sr->code_stride : NULL, sr->code_stride, sr->out + r0);
        else if (logits)
            be->to_host(c->bc, logits + (size_t)r0 * cfg->n_vocab, c->lo, (size_t)nr * cfg->n_vocab * sizeof(float));
    }
    if (step) be->step_end(c->bc);
    st = backend_status(c);
    finish_groups(c, st == CINFER_OK);
    return st ? st : ctx_kvq_convert(c, 0);
}

/* NaN/Inf logits mean the weights or activations overflowed: an error, never
 * a silent `<unk>` or `nan` downstream */
static cinfer_status finite_logits(cinfer_ctx *c, cinfer_status st, const float *logits, size_t rows) {
    if (st || !logits) return st;
    size_t V = (size_t)c->m->cfg.n_vocab;
    for (size_t i = 0; i < rows * V; i++)
        if (!isfinite(logits[i]))
            return ctx_fail(c, CINFER_EFORMAT, "forward: the logits of output row %zu hold %s (token %zu): the model's "
                            "weights or activations are not finite", i / V, isnan(logits[i]) ? "NaN" : "Inf", i % V);
    return CINFER_OK;
}

cinfer_status cinfer_forward_seqs(cinfer_ctx *c, const int32_t *ids, int B, int L, const int *seqs, const int *lens,
                                  const int *pos0, const int *out_rows, int n_out, float *logits) {
    cinfer_status st = forward(c, ids, B, L, seqs, lens, pos0, out_rows ? OUT_LIST : OUT_LAST, out_rows, n_out, &(fwd_out){.logits = logits});
    return finite_logits(c, st, logits, out_rows ? (size_t)(n_out > 0 ? n_out : 0) : (size_t)B);
}

cinfer_status cinfer_forward(cinfer_ctx *c, const int32_t *ids, int B, int L, const int *lens, const int *pos0,
                             const int *out_rows, int n_out, float *logits) {
    return cinfer_forward_seqs(c, ids, B, L, NULL, lens, pos0, out_rows, n_out, logits);
}

cinfer_status cinfer_eval(cinfer_ctx *c, const int32_t *ids, int n, int all, float *logits) {
    cinfer_status st = forward(c, ids, 1, n, NULL, NULL, NULL, all ? OUT_ALL : OUT_LAST, NULL, 0, &(fwd_out){.logits = logits});
    return finite_logits(c, st, logits, all ? (size_t)n : 1);
}

/* NaN/Inf logits make a non-finite lse: as finite_logits */
static cinfer_status finite_scores(cinfer_ctx *c, const ctx_score_req *sr, int n_out) {
    for (int i = 0; i < n_out; i++)
        if (!isfinite(sr->out[i].lse))
            return ctx_fail(c, CINFER_EFORMAT, "forward: the logits of output row %d hold %s (their log-sum-exp is %g): "
                            "the model's weights or activations are not finite", i, isnan(sr->out[i].lse) ? "NaN" : "Inf",
                            (double)sr->out[i].lse);
    return CINFER_OK;
}

cinfer_status ctx_forward_score(cinfer_ctx *c, const int32_t *ids, int B, int L, const int *lens, const int *pos0,
                                const int *out_rows, int n_out, const ctx_score_req *sr) {
    if (!c->m->be->score) return ctx_fail(c, CINFER_EUNSUPPORTED, "forward: the %s backend has no score op", c->m->be->name);
    if (!out_rows && n_out) return ctx_fail(c, CINFER_EINVAL, "forward: %d output positions without a list", n_out);
    cinfer_status st = forward(c, ids, B, L, NULL, lens, pos0, OUT_LIST, out_rows, n_out, &(fwd_out){.sr = sr, .head = 1});
    return st || !sr || sr->rows_only ? st : finite_scores(c, sr, n_out);
}

int ctx_head_folds(const cinfer_ctx *c, const be_score_base *base) {
    const be_ops *be = c->m->be;
    return be->score_head && c->m->cfg.final_softcap <= 0 && be->score_head(c->bc, NULL, 0, &c->m->w.lm_head, NULL, base, NULL);
}

cinfer_status ctx_score_again(cinfer_ctx *c, int n_out, const ctx_score_req *sr) {
    const be_ops *be = c->m->be;
    if ((size_t)n_out > c->cap_out || !c->lo) return ctx_fail(c, CINFER_EINVAL, "score: %d rows, the logits buffer holds %zu", n_out, c->cap_out);
    if (!sr->out && !(c->head_folded && be->score_take))
        return ctx_fail(c, CINFER_EINVAL, "score: results left with the backend need a folded head and a backend that keeps them");
    if (c->head_folded) be->score_head(c->bc, c->xo, n_out, &c->m->w.lm_head, sr->tgt, sr->base, sr->out);
    else be->score(c->bc, c->lo, n_out, c->m->cfg.n_vocab, sr->tgt, sr->base, sr->codes, sr->code_stride, sr->out);
    cinfer_status st = backend_status(c);
    return st || !sr->out ? st : finite_scores(c, sr, n_out);
}

cinfer_status ctx_score_take(cinfer_ctx *c, int n_out, be_score_row *out) {
    if (c->m->be->score_take(c->bc, out, n_out)) {
        cinfer_status st = backend_status(c);
        return st ? st : ctx_fail(c, CINFER_EBACKEND, "score: no results to take");
    }
    ctx_score_req sr = {.out = out};
    return finite_scores(c, &sr, n_out);
}

cinfer_status ctx_decode_greedy(cinfer_ctx *c, const int32_t *ids, int B, const int *seqs, int32_t *tok) {
    if (!c->m->be->argmax) return ctx_fail(c, CINFER_EUNSUPPORTED, "forward: the %s backend has no argmax", c->m->be->name);
    return forward(c, ids, B, 1, seqs, NULL, NULL, OUT_LAST, NULL, 0, &(fwd_out){.argmax = tok});
}

cinfer_status ctx_eval_greedy(cinfer_ctx *c, const int32_t *ids, int n, int32_t *tok) {
    if (!c->m->be->argmax) return ctx_fail(c, CINFER_EUNSUPPORTED, "forward: the %s backend has no argmax", c->m->be->name);
    return forward(c, ids, 1, n, NULL, NULL, NULL, OUT_LAST, NULL, 0, &(fwd_out){.argmax = tok});
}

/* chained greedy steps: the backend keeps results, and a step issued past the stop can be dropped (trimmed:
 * no rotating window, no sliding layer, no quantization of the cache still to come) */
static int can_chain(cinfer_ctx *c) {
    const be_ops *be = c->m->be;
    if (!be->argmax_take || be->argmax_take(c->bc, NULL) || c->max_kv > 0 || c->kvq_pending) return 0;
    for (int l = 0; l < c->m->cfg.n_layer; l++)
        if (arch_layer_window(c->m->arch, &c->m->cfg, l) > 0) return 0;
    return 1;
}

cinfer_status ctx_greedy_run(cinfer_ctx *c, int32_t tok, long n, int (*on_token)(void *user, int32_t tok), void *user) {
    const be_ops *be = c->m->be;
    if (!can_chain(c)) {
        for (long i = 0; i < n; i++) {
            cinfer_status st = ctx_eval_greedy(c, &tok, 1, &tok);
            if (st) return st;
            if (on_token(user, tok)) break;
        }
        return CINFER_OK;
    }
    fwd_out keep = {.keep = 1};
    long issued = 0, taken = 0;
    int stop = 0;
    cinfer_status st = n > 0 ? forward(c, &tok, 1, 1, NULL, NULL, NULL, OUT_LAST, NULL, 0, &keep) : CINFER_OK;
    issued += n > 0 && !st;
    while (!st && !stop && taken < issued) {
        if (issued < n) {   /* the next step first, its token the device's: it runs while this one is read back */
            st = forward(c, NULL, 1, 1, NULL, NULL, NULL, OUT_LAST, NULL, 0, &keep);
            issued += !st;
            if (st) break;
        }
        int32_t t;
        if (be->argmax_take(c->bc, &t)) { st = backend_status(c); break; }
        taken++;
        stop = on_token(user, t);
    }
    /* a step issued past the stop (or before an error): waited for, its position dropped */
    const long extra = issued - taken;
    for (int32_t t; taken < issued && !be->argmax_take(c->bc, &t); taken++) {}
    if (!st && taken < issued) st = backend_status(c);
    if (extra > 0) {
        cinfer_status tr = cinfer_seq_trim(c, 0, cinfer_seq_len(c, 0) - (int)extra);
        if (!st) st = tr;
    }
    return st;
}

/* cinfer_decode_sampled: the rows' parameters checked and put in the backend's form, then one decode
 * forward whose logits the sample op reduces where they are */
cinfer_status cinfer_decode_sampled(cinfer_ctx *c, const int32_t *ids, int B, const int *seqs,
                                    const cinfer_row_sampling *rows, cinfer_row_pick *out) {
    if (!c->m->be->sample) return ctx_fail(c, CINFER_EUNSUPPORTED, "decode: the %s backend has no sample op", c->m->be->name);
    if (B < 1 || !rows || !out) return ctx_fail(c, CINFER_EINVAL, "decode: need B >= 1 rows with parameters and picks");
    int V = c->m->cfg.n_vocab, n_ed = 0;
    for (int b = 0; b < B; b++) {
        const cinfer_row_sampling *r = &rows[b];
        if (!(r->temp >= 0 && r->temp < INFINITY) || r->top_k < 0 || !(r->top_p > 0 && r->top_p <= 1) ||
            !(r->min_p >= 0 && r->min_p <= 1) || !(r->u >= 0 && r->u < 1) || r->n_top < -1 || r->n_top > CINFER_MAX_TOP ||
            r->n_edits < 0 || (r->n_edits && !r->edits))
            return ctx_fail(c, CINFER_EINVAL, "decode: row %d has invalid sampling parameters (temp %g, top_k %d, top_p %g, "
                            "min_p %g, u %g, n_top %d, %d edits)", b, (double)r->temp, r->top_k, (double)r->top_p,
                            (double)r->min_p, r->u, r->n_top, r->n_edits);
        for (int e = 0; e < r->n_edits; e++)
            if (r->edits[e].token < 0 || r->edits[e].token >= V || !isfinite(r->edits[e].value))
                return ctx_fail(c, CINFER_EINVAL, "decode: row %d edits token %d by %g (vocabulary [0, %d), finite values)", b,
                                (int)r->edits[e].token, (double)r->edits[e].value, V);
        if (n_ed > INT32_MAX - r->n_edits) return ctx_fail(c, CINFER_EINVAL, "decode: too many logit edits");
        n_ed += r->n_edits;
    }
    be_sample_row *p = malloc(sizeof *p * (size_t)B);
    be_sample_out *o = malloc(sizeof *o * (size_t)B);
    be_logit_edit *ed = n_ed ? malloc(sizeof *ed * (size_t)n_ed) : NULL;
    cinfer_status st = CINFER_OK;
    if (!p || !o || (n_ed && !ed)) st = ctx_fail(c, CINFER_ENOMEM, "decode: out of memory");
    for (int b = 0, k = 0; !st && b < B; b++) {
        const cinfer_row_sampling *r = &rows[b];
        p[b] = (be_sample_row){r->temp > 0 ? 1.0f / r->temp : 0, r->top_k, r->top_p, r->min_p, r->u, k, r->n_edits, r->n_top};
        for (int e = 0; e < r->n_edits; e++, k++)
            ed[k] = (be_logit_edit){r->edits[e].token, r->edits[e].mul ? BE_EDIT_PENALTY : BE_EDIT_ADD, r->edits[e].value};
    }
    sample_req sq = {p, ed, n_ed, o};
    if (!st) st = forward(c, ids, B, 1, seqs, NULL, NULL, OUT_LAST, NULL, 0, &(fwd_out){.smp = &sq});
    for (int b = 0; !st && b < B; b++)   /* as finite_logits: overflowed weights or activations are an error */
        if (!isfinite(o[b].zmax))
            st = ctx_fail(c, CINFER_EFORMAT, "decode: the logits of row %d are not finite (largest %g): the model's weights "
                          "or activations are not finite", b, (double)o[b].zmax);
    for (int b = 0; !st && b < B; b++) {
        out[b].token = o[b].tok;
        out[b].logprob = o[b].lp;
        memcpy(out[b].top_id, o[b].top_id, sizeof out[b].top_id);
        memcpy(out[b].top_logprob, o[b].top_lp, sizeof out[b].top_logprob);
    }
    free(p);
    free(o);
    free(ed);
    return st;
}
