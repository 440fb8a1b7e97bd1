/*
 * generate.c — the generation loop: prefill the prompt, then sample, stream
 * the completed text, feed the token back, until an eos id or max_tokens.
 * Timing is split as mlx_lm.generate reports it (prompt tok/s, generation
 * tok/s, peak memory). All buffers are allocated before the first token.
 */
#include <stdlib.h>
#include <string.h>
#include "engine/engine.h"
#include "util.h"

static int is_eos(const cinfer_model *m, int32_t t) {
    for (int i = 0; i < m->cfg.n_eos; i++)
        if (m->cfg.eos[i] == t) return 1;
    return 0;
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

cinfer_status cinfer_generate(cinfer_ctx *c, const int32_t *prompt, int n_prompt, const cinfer_sampler_params *sp,
                              int max_tokens, cinfer_token_cb cb, void *user, cinfer_gen_stats *stats) {
    cinfer_model *m = c->m;
    cinfer_gen_stats gs = {0};
    if (n_prompt < 1 || !prompt || max_tokens < 0) {
        snprintf(c->err, sizeof c->err, "generate: need a prompt of at least one token and max_tokens >= 0");
        return CINFER_EINVAL;
    }
    int V = m->cfg.n_vocab;
    cinfer_sampler_params dp = cinfer_sampler_defaults();
    cinfer_sampler *s = NULL;
    float *logits = malloc(sizeof(float) * V);
    int32_t *hist = malloc(sizeof(int32_t) * ((size_t)n_prompt + max_tokens + 1));
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
    int nh = n_prompt;
    /* plain greedy on a backend with a device argmax: copy back tokens, not logits */
    const cinfer_sampler_params *pp = sp ? sp : &dp;
    int dev_greedy = m->be->argmax && pp->temp == 0.0f && pp->rep_penalty == 1.0f;
    int32_t next = 0;
    double t0 = cf_now();
    st = prefill(c, prompt, n_prompt, dev_greedy, logits, &next);
    gs.prompt_tokens = n_prompt;
    gs.prompt_s = cf_now() - t0;
    double t1 = cf_now();
    while (!st && gs.gen_tokens < max_tokens) {
        int32_t tok = dev_greedy ? next : cinfer_sampler_sample(s, logits, hist, nh);
        hist[nh++] = tok;
        gs.gen_tokens++;
        if (is_eos(m, tok)) { gs.stopped_by_eos = 1; break; }
        const char *text = ds ? cinfer_detok_stream_push(ds, tok) : NULL;
        if (cb && cb(tok, text, user)) break;
        if (gs.gen_tokens == max_tokens) break;
        st = dev_greedy ? ctx_eval_greedy(c, &tok, 1, &next) : cinfer_eval(c, &tok, 1, 0, logits);
    }
    if (!st && ds && cb) {
        const char *rest = cinfer_detok_stream_flush(ds);
        if (rest && *rest) cb(-1, rest, user);
    }
    gs.gen_s = cf_now() - t1;
out:
    gs.peak_rss = cf_peak_rss();
    if (stats) *stats = gs;
    cinfer_detok_stream_free(ds);
    cinfer_sampler_free(s);
    free(logits);
    free(hist);
    return st;
}
