/*
 * generate.c — the generation loop: prefill the prompt, then sample, stream
 * the completed text, feed the token back, until an eos id, max_tokens, the
 * caller's stop or the context limit. Timing is split as mlx_lm.generate
 * reports it (prompt tok/s, generation tok/s, peak memory). All buffers are
 * allocated before the first token.
 *
 * The log-prob of a chosen id is what mlx-lm's generate_step yields:
 * log-softmax of the logits after the logits processors (the repetition
 * penalty), before temperature and the top-k/top-p/min-p filters. Asking for
 * it keeps the logits on the host (no device argmax shortcut).
 *
 * The context limit: a sequence never holds more than max_position_embeddings
 * positions (prompt + generated). A prompt that does not fit is refused before
 * any work; generation stops at the limit with CINFER_FINISH_CONTEXT. A
 * context whose cache rotates (--max-kv-size) lifts the stop, as mlx-lm
 * does; gen_opts.max_context sets another limit (-1 = none).
 */
#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include "engine/engine.h"
#include "util.h"

static int is_eos(const cinfer_model *m, const cinfer_gen_opts *o, int32_t t) {
    for (int i = 0; i < m->cfg.n_eos; i++)
        if (m->cfg.eos[i] == t) return 1;
    for (int i = 0; o && i < o->n_extra_eos; i++)
        if (o->extra_eos[i] == t) return 1;
    return 0;
}

/* log-softmax of logits[tok] over V entries, the normaliser summed in double */
static float log_prob(const float *logits, int V, int32_t tok) {
    float mx = logits[0];
    for (int i = 1; i < V; i++) mx = logits[i] > mx ? logits[i] : mx;
    double sum = 0;
    for (int i = 0; i < V; i++) sum += exp((double)logits[i] - mx);
    return (float)((double)logits[tok] - mx - log(sum));
}

cinfer_gen_opts cinfer_gen_defaults(void) {
    cinfer_gen_opts o = {0};
    o.max_tokens = 100;
    return o;
}

/* positions the sequence may reach: the model's, unless the caller lifts it
 * or the context's cache rotates (--max-kv-size: mlx-lm lets it run on) */
static long context_limit(const cinfer_ctx *c, const cinfer_gen_opts *o) {
    if (o->max_context < 0 || c->max_kv > 0) return -1;
    return o->max_context > 0 ? o->max_context : c->m->cfg.max_pos;
}

/* the prompt as mlx-lm's generate_step feeds it: all but the last token in
 * steps of prefill_step tokens, then the last token alone, whose logits (or
 * greedy token) start the generation. With a rotating window the step shape
 * decides what each query sees, so this is what makes --max-kv-size match. */
static cinfer_status prefill(cinfer_ctx *c, const int32_t *prompt, int n, int dev_greedy, float *logits, int32_t *next) {
    for (int done = 0; done < n - 1;) {
        int k = n - 1 - done < c->prefill_step ? n - 1 - done : c->prefill_step;
        cinfer_status st = cinfer_eval(c, prompt + done, k, 0, NULL);
        if (st) return st;
        done += k;
    }
    return dev_greedy ? ctx_eval_greedy(c, prompt + n - 1, 1, next) : cinfer_eval(c, prompt + n - 1, 1, 0, logits);
}

/* one generated token's bookkeeping (cinfer_generate_ex): history, end of sequence, the callback with its
 * text, the limits; non-zero ends the generation */
typedef struct gen_run {
    cinfer_ctx *c;
    const cinfer_gen_opts *o;
    cinfer_gen_stats *gs;
    const float *logits;      /* the step's logits (log-probs), NULL: on the device */
    int32_t *hist;
    long *nh, hist_cap, max_tokens, room;
    cinfer_detok_stream *ds;
    cinfer_token_lp_cb cb;
    void *user;
} gen_run;

static int gen_take(void *user, int32_t tok) {
    gen_run *g = user;
    const cinfer_gen_opts *o = g->o;
    cinfer_gen_stats *gs = g->gs;
    float lp = o->logprobs && g->logits ? log_prob(g->logits, g->c->m->cfg.n_vocab, tok) : NAN;   /* logits hold the penalised values */
    if (*g->nh < g->hist_cap) g->hist[(*g->nh)++] = tok;
    gs->gen_tokens++;
    if (is_eos(g->c->m, o, tok)) {
        gs->stopped_by_eos = 1;
        gs->finish_reason = CINFER_FINISH_STOP;
        if (g->cb && o->report_eos) g->cb(tok, "", lp, g->user);
        return 1;
    }
    const char *text = g->ds ? cinfer_detok_stream_push(g->ds, tok) : NULL;
    if (g->cb && g->cb(tok, text, lp, g->user)) { gs->finish_reason = CINFER_FINISH_STOP; return 1; }
    if (gs->gen_tokens == g->max_tokens) return 1;
    if (g->room >= 0 && gs->gen_tokens >= g->room) { gs->finish_reason = CINFER_FINISH_CONTEXT; return 1; }
    return 0;
}

cinfer_status cinfer_generate_ex(cinfer_ctx *c, const int32_t *prompt, int n_prompt, const cinfer_sampler_params *sp,
                                 const cinfer_gen_opts *go, cinfer_token_lp_cb cb, void *user, cinfer_gen_stats *stats) {
    cinfer_model *m = c->m;
    cinfer_gen_stats gs = {0};
    cinfer_gen_opts dgo = cinfer_gen_defaults();
    const cinfer_gen_opts *o = go ? go : &dgo;
    if (stats) *stats = gs;
    if (n_prompt < 1 || !prompt || o->max_tokens < -1 || (o->n_extra_eos > 0 && !o->extra_eos)) {
        snprintf(c->err, sizeof c->err, "generate: need a prompt of at least one token and max_tokens >= -1");
        return CINFER_EINVAL;
    }
    long limit = context_limit(c, o), have = cinfer_ctx_pos(c);
    if (limit >= 0 && have + n_prompt > limit) {
        snprintf(c->err, sizeof c->err,
                 "generate: the prompt (%d tokens%s) does not fit the model's context of %ld positions "
                 "(max_position_embeddings)", n_prompt, have ? ", after the cached ones" : "", limit);
        if (have) snprintf(c->err + strlen(c->err), sizeof c->err - strlen(c->err), ": %ld cached", have);
        return CINFER_EINVAL;
    }
    /* tokens that can still be generated: until the limit, or max_tokens */
    long room = limit >= 0 ? limit - have - n_prompt : -1;
    long max_tokens = o->max_tokens;
    int V = m->cfg.n_vocab;
    cinfer_sampler_params dp = cinfer_sampler_defaults();
    cinfer_sampler *s = NULL;
    float *logits = malloc(sizeof(float) * V);
    long hist_cap = (long)n_prompt + (max_tokens >= 0 ? max_tokens : room >= 0 ? room : 1 << 20) + 1;
    int32_t *hist = malloc(sizeof(int32_t) * (size_t)hist_cap);
    cinfer_detok_stream *ds = m->tok ? cinfer_detok_stream_new(m->tok, 1) : NULL;
    cinfer_status st = cinfer_sampler_new(sp ? sp : &dp, V, &s);
    if (st) snprintf(c->err, sizeof c->err, "generate: invalid sampling parameters");
    if (!st && (!logits || !hist || (m->tok && !ds))) {
        st = CINFER_ENOMEM;
        snprintf(c->err, sizeof c->err, "generate: out of memory");
    }
    if (st) goto out;
    memcpy(hist, prompt, sizeof(int32_t) * n_prompt);
    /* the stream sees the prompt first, so the continuation's text joins it
     * as whole decoding would (SentencePiece drops only the text's first space) */
    for (int i = 0; ds && i < n_prompt; i++) cinfer_detok_stream_push(ds, prompt[i]);
    long nh = n_prompt;
    /* plain greedy on a backend with a device argmax: copy back tokens, not logits */
    const cinfer_sampler_params *pp = sp ? sp : &dp;
    int dev_greedy = m->be->argmax && pp->temp == 0.0f && pp->rep_penalty == 1.0f && !o->logprobs;
    int32_t next = 0;
    gs.finish_reason = CINFER_FINISH_LENGTH;
    double t0 = cf_now();
    st = prefill(c, prompt, n_prompt, dev_greedy, logits, &next);
    gs.prompt_tokens = n_prompt;
    gs.prompt_s = cf_now() - t0;
    double t1 = cf_now();
    gen_run g = {c, o, &gs, dev_greedy ? NULL : logits, hist, &nh, hist_cap, max_tokens, room, ds, cb, user};
    while (!st && (max_tokens < 0 || gs.gen_tokens < max_tokens)) {
        if (room >= 0 && gs.gen_tokens >= room) { gs.finish_reason = CINFER_FINISH_CONTEXT; break; }
        int32_t tok = dev_greedy ? next : cinfer_sampler_sample(s, logits, hist, (int)nh);
        if (gen_take(&g, tok)) break;
        if (dev_greedy) {   /* the rest on the device, each step's token read back behind the next step */
            long n = max_tokens < 0 ? LONG_MAX : max_tokens - gs.gen_tokens;
            if (room >= 0 && room - gs.gen_tokens < n) n = room - gs.gen_tokens;
            st = ctx_greedy_run(c, tok, n, gen_take, &g);
            break;
        }
        st = cinfer_eval(c, &tok, 1, 0, logits);
    }
    if (!st && ds && cb && gs.finish_reason != CINFER_FINISH_STOP) {
        const char *rest = cinfer_detok_stream_flush(ds);
        if (rest && *rest) cb(-1, rest, NAN, user);
    }
    gs.gen_s = cf_now() - t1;
out:
    gs.peak_rss = cf_peak_rss();
    gs.kv_bytes = cinfer_ctx_cache_bytes(c);
    gs.peak_memory = cinfer_ctx_memory_bytes(c);
    if (stats) *stats = gs;
    cinfer_detok_stream_free(ds);
    cinfer_sampler_free(s);
    free(logits);
    free(hist);
    return st;
}

typedef struct plain_cb { cinfer_token_cb cb; void *user; } plain_cb;

static int call_plain(int32_t tok, const char *text, float lp, void *user) {
    (void)lp;
    plain_cb *p = user;
    return p->cb ? p->cb(tok, text, p->user) : 0;
}

cinfer_status cinfer_generate(cinfer_ctx *c, const int32_t *prompt, int n_prompt, const cinfer_sampler_params *sp,
                              int max_tokens, cinfer_token_cb cb, void *user, cinfer_gen_stats *stats) {
    if (max_tokens < 0) {
        snprintf(c->err, sizeof c->err, "generate: need a prompt of at least one token and max_tokens >= 0");
        return CINFER_EINVAL;
    }
    cinfer_gen_opts o = cinfer_gen_defaults();
    o.max_tokens = max_tokens;
    plain_cb p = {cb, user};
    return cinfer_generate_ex(c, prompt, n_prompt, sp, &o, call_plain, &p, stats);
}
