/*
 * ctx.c — contexts and the forward contract: embed -> decoder blocks (the
 * caches attend and mask) -> gather only the requested positions -> final
 * norm -> LM head in chunks of OUT_CHUNK rows, so [B, L, vocab] is never
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

static cinfer_status ctx_fail(cinfer_ctx *c, cinfer_status s, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static cinfer_status ctx_fail(cinfer_ctx *c, cinfer_status s, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(c->err, sizeof c->err, fmt, ap);
    va_end(ap);
    return s;
}

void cinfer_ctx_free(cinfer_ctx *c) {
    if (!c) return;
    const be_ops *be = c->m->be;
    if (c->caches)
        for (int l = 0; l < c->m->cfg.n_layer; l++)
            if (c->caches[l]) c->caches[l]->vt->free(c->caches[l]);
    free(c->caches);
    if (c->bc) {
        be->free(c->bc, c->x);
        be->free(c->bc, c->scratch);
        be->free(c->bc, c->xo);
        be->free(c->bc, c->lo);
        be->ctx_free(c->bc);
    }
    free(c->pos);
    free(c->ids);
    free(c->rows);
    free(c);
}

cinfer_status cinfer_ctx_new(cinfer_model *m, const cinfer_ctx_opts *o, cinfer_ctx **out, char *err, size_t n) {
    *out = NULL;
    cinfer_ctx *c = calloc(1, sizeof *c);
    if (!c) return cf_err(err, n, CINFER_ENOMEM, "out of memory");
    c->m = m;
    int nt = o && o->n_threads > 0 ? o->n_threads : m->n_threads;
    if (m->be->ctx_new(&c->bc, nt)) { free(c); return cf_err(err, n, CINFER_EBACKEND, "%s backend failed to start", m->be->name); }
    c->caches = calloc((size_t)m->cfg.n_layer, sizeof *c->caches);
    be_dtype kdt = o && o->kv_f16 ? BE_F16 : BE_F32;
    for (int l = 0; c->caches && l < m->cfg.n_layer; l++) {
        c->caches[l] = kv_full_new(m->be, c->bc, m->cfg.n_kv_head, m->cfg.head_dim, kdt, m->cfg.sliding_window);
        if (!c->caches[l]) break;
    }
    if (!c->caches || !c->caches[m->cfg.n_layer - 1]) {
        cinfer_ctx_free(c);
        return cf_err(err, n, CINFER_ENOMEM, "out of memory");
    }
    *out = c;
    return CINFER_OK;
}

const char *cinfer_ctx_error(const cinfer_ctx *c) { return c ? c->err : "NULL context"; }


void cinfer_ctx_trim(cinfer_ctx *c, int n) {
    for (int l = 0; l < c->m->cfg.n_layer; l++) c->caches[l]->vt->trim(c->caches[l], -1, n < 0 ? 0 : n);
}

void cinfer_ctx_reset(cinfer_ctx *c) { cinfer_ctx_trim(c, 0); }

int cinfer_ctx_pos(const cinfer_ctx *c) { return c->caches[0]->vt->row_len(c->caches[0], 0); }

size_t cinfer_ctx_cache_bytes(const cinfer_ctx *c) {
    size_t s = 0;
    for (int l = 0; l < c->m->cfg.n_layer; l++) s += c->caches[l]->vt->bytes(c->caches[l]);
    return s;
}

size_t cinfer_ctx_memory_bytes(const cinfer_ctx *c) {
    const model_config *cfg = &c->m->cfg;
    size_t b = c->m->st.total_bytes + cinfer_ctx_cache_bytes(c);
    if (c->cap_tokens)
        b += c->cap_tokens * (cfg->hidden * sizeof(float) + sizeof *c->pos + sizeof *c->ids) +
             block_scratch_floats(cfg, (int)c->cap_tokens) * sizeof(float);
    if (c->xo) b += (size_t)OUT_CHUNK * cfg->hidden * sizeof(float);
    if (c->lo) b += (size_t)OUT_CHUNK * cfg->n_vocab * sizeof(float);
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
        c->scratch = be->alloc(c->bc, block_scratch_floats(cfg, (int)T) * sizeof(float));
        c->pos = malloc(T * sizeof *c->pos);
        c->ids = malloc(T * sizeof *c->ids);
        c->cap_tokens = (!c->x || !c->scratch || !c->pos || !c->ids) ? 0 : T;
        if (!c->cap_tokens) return ctx_fail(c, CINFER_ENOMEM, "out of memory for a batch of %zu tokens", T);
    }
    if (!c->xo || !c->lo) {   /* each on its own: one may have failed on an earlier call */
        if (!c->xo) c->xo = be->alloc(c->bc, (size_t)OUT_CHUNK * cfg->hidden * sizeof(float));
        if (!c->lo) c->lo = be->alloc(c->bc, (size_t)OUT_CHUNK * cfg->n_vocab * sizeof(float));
        if (!c->xo || !c->lo) return ctx_fail(c, CINFER_ENOMEM, "out of memory for the logits buffers");
    }
    if (B > c->cap_rows) {
        free(c->rows);
        c->rows = malloc(sizeof(int) * (size_t)B * 2);
        if (!c->rows) { c->cap_rows = 0; return ctx_fail(c, CINFER_ENOMEM, "out of memory"); }
        c->cap_rows = B;
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

/* logits [rows][vocab] to the host, or (argmax != NULL, a backend with an
 * argmax op) only each row's greedy token */
static cinfer_status forward(cinfer_ctx *c, const int32_t *ids, int B, int L, const int *lens, const int *pos0_in,
                             int mode, const int *out_rows, int n_out, float *logits, int32_t *argmax) {
    cinfer_model *m = c->m;
    const model_config *cfg = &m->cfg;
    const be_ops *be = m->be;
    c->err[0] = 0;
    if (B < 1 || L < 1 || !ids) return ctx_fail(c, CINFER_EINVAL, "forward: need B >= 1 and L >= 1 (got %d, %d)", B, L);
    size_t T = (size_t)B * L;
    cinfer_status st = reserve(c, T, B);
    if (st) return st;
    int *len = c->rows, *pos0 = c->rows + B;
    for (int b = 0; b < B; b++) {
        len[b] = lens ? lens[b] : L;
        if (len[b] < 0 || len[b] > L) return ctx_fail(c, CINFER_EINVAL, "forward: row %d has length %d outside [0, %d]", b, len[b], L);
        if (mode == OUT_LAST && len[b] < 1) return ctx_fail(c, CINFER_EINVAL, "forward: row %d is empty", b);
        int have = c->caches[0]->vt->row_len(c->caches[0], b);
        pos0[b] = pos0_in ? pos0_in[b] : have;
        if (pos0[b] < 0 || pos0[b] > have)
            return ctx_fail(c, CINFER_EINVAL, "forward: row %d starts at position %d but holds %d cached tokens", b, pos0[b], have);
        for (int i = 0; i < L; i++) {
            int32_t id = i < len[b] ? ids[(size_t)b * L + i] : 0;
            if (id < 0 || id >= cfg->n_vocab)
                return ctx_fail(c, CINFER_EINVAL, "forward: token id %d outside the vocabulary [0, %d)", (int)id, cfg->n_vocab);
            c->ids[(size_t)b * L + i] = id;
            c->pos[(size_t)b * L + i] = pos0[b] + i;
        }
    }
    /* small forwards (decode) are bracketed so a device backend may replay them as a graph */
    int step = be->step_begin && T <= 8;
    if (step) be->step_begin(c->bc);
    be->embed(c->bc, &m->w.tok_embd, c->ids, (int)T, c->x);
    block_batch bb = {B, L, pos0, len, c->pos};
    st = block_forward(be, c->bc, cfg, &m->w, c->caches, &bb, c->x, c->scratch);
    if (st) {
        if (step) be->step_end(c->bc);
        return ctx_fail(c, st, "forward: the KV cache refused the batch (%s: batch shape changed with cached tokens, or out of memory)", cinfer_status_str(st));
    }
    if (!logits && !argmax) {
        if (step) be->step_end(c->bc);
        return backend_status(c);
    }
    int total = mode == OUT_LAST ? B : mode == OUT_ALL ? (int)T : n_out;
    int rows[OUT_CHUNK];
    for (int r0 = 0; r0 < total; r0 += OUT_CHUNK) {
        int nr = total - r0 < OUT_CHUNK ? total - r0 : OUT_CHUNK;
        for (int i = 0; i < nr; i++) {
            int k = r0 + i;
            if (mode == OUT_LAST) rows[i] = k * L + len[k] - 1;
            else if (mode == OUT_ALL) rows[i] = k;
            else {
                int b = out_rows[2 * k], p = out_rows[2 * k + 1];
                if (b < 0 || b >= B || p < 0 || p >= len[b])
                    return ctx_fail(c, CINFER_EINVAL, "forward: output (row %d, position %d) is not a true position of the batch", b, p);
                rows[i] = b * L + p;
            }
        }
        be->gather(c->bc, c->x, cfg->hidden, rows, nr, c->xo);
        be->rmsnorm(c->bc, c->xo, nr, cfg->hidden, &m->w.out_norm, 0.0f, cfg->eps, c->xo);
        be->matmul(c->bc, c->xo, nr, &m->w.lm_head, NULL, c->lo);
        if (step) { be->step_end(c->bc); step = 0; }
        if (argmax) be->argmax(c->bc, c->lo, nr, cfg->n_vocab, argmax + r0);
        else be->to_host(c->bc, logits + (size_t)r0 * cfg->n_vocab, c->lo, (size_t)nr * cfg->n_vocab * sizeof(float));
    }
    return backend_status(c);
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

cinfer_status cinfer_forward(cinfer_ctx *c, const int32_t *ids, int B, int L, const int *lens, const int *pos0,
                             const int *out_rows, int n_out, float *logits) {
    if (out_rows && n_out < 0) return ctx_fail(c, CINFER_EINVAL, "forward: n_out %d < 0", n_out);
    cinfer_status st = forward(c, ids, B, L, lens, pos0, out_rows ? OUT_LIST : OUT_LAST, out_rows, n_out, logits, NULL);
    return finite_logits(c, st, logits, out_rows ? (size_t)n_out : (size_t)B);
}

cinfer_status cinfer_eval(cinfer_ctx *c, const int32_t *ids, int n, int all, float *logits) {
    cinfer_status st = forward(c, ids, 1, n, NULL, NULL, all ? OUT_ALL : OUT_LAST, NULL, 0, logits, NULL);
    return finite_logits(c, st, logits, all ? (size_t)n : 1);
}

cinfer_status ctx_eval_greedy(cinfer_ctx *c, const int32_t *ids, int n, int32_t *tok) {
    if (!c->m->be->argmax) return ctx_fail(c, CINFER_EUNSUPPORTED, "forward: the %s backend has no argmax", c->m->be->name);
    return forward(c, ids, 1, n, NULL, NULL, OUT_LAST, NULL, 0, NULL, tok);
}
