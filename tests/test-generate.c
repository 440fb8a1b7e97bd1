/*
 * test-generate.c — the generation loop and the sampler: stories260k greedy
 * text from BOS equals transformers' (fixture), streamed text equals the
 * whole decode, seeds reproduce, and each sampling filter keeps exactly the
 * tokens its definition keeps.
 */
#include <jansson.h>
#include "check.h"
#include "cinfer.h"

typedef struct acc { char buf[4096]; size_t n; int count; } acc;

static int collect(int32_t tok, const char *text, void *user) {
    acc *a = user;
    (void)tok;
    if (text) {
        size_t k = strlen(text);
        if (a->n + k < sizeof a->buf) { memcpy(a->buf + a->n, text, k + 1); a->n += k; }
    }
    a->count++;
    return 0;
}

static void test_story(void) {
    char dir[512], err[512];
    snprintf(dir, sizeof dir, "%s/models/stories260k", shared_dir());
    json_t *ref = json_load_file("tests/fixtures/models/stories260k-ref/reference.json", 0, NULL);
    cinfer_model *m = NULL;
    cinfer_ctx *c = NULL;
    int ok = ref && !cinfer_model_load(dir, NULL, &m, err, sizeof err) && !cinfer_ctx_new(m, NULL, &c, err, sizeof err);
    CHECK(ok && cinfer_model_tokenizer(m), "stories260k loads with its tokenizer (%s)", ok ? "ok" : err);
    if (ok && cinfer_model_tokenizer(m)) {
        const char *want = json_string_value(json_object_get(ref, "greedy_text"));
        int32_t bos = 1;
        acc a = {.n = 0};
        cinfer_gen_stats st;
        cinfer_sampler_params sp = cinfer_sampler_defaults();
        cinfer_status s = cinfer_generate(c, &bos, 1, &sp, 60, collect, &a, &st);
        CHECK(s == CINFER_OK && st.gen_tokens == 60 && st.prompt_tokens == 1, "generate 60 tokens from BOS");
        CHECK(want && !strcmp(a.buf, want), "greedy story equals transformers':\n  got  '%s'\n  want '%s'", a.buf, want ? want : "?");
        /* same seed, same text; the sampled text differs from greedy at temp 1 */
        cinfer_sampler_params sp2 = cinfer_sampler_defaults();
        sp2.temp = 1.0f;
        sp2.seed = 42;
        acc b1 = {.n = 0}, b2 = {.n = 0};
        cinfer_ctx_reset(c);
        cinfer_generate(c, &bos, 1, &sp2, 40, collect, &b1, &st);
        cinfer_ctx_reset(c);
        cinfer_generate(c, &bos, 1, &sp2, 40, collect, &b2, &st);
        CHECK(b1.n > 0 && !strcmp(b1.buf, b2.buf), "seed 42 twice gives the same text");
        CHECK(strcmp(b1.buf, a.buf), "temperature 1 sampling departs from greedy");
        CHECK(cinfer_ctx_pos(c) == 1 + st.gen_tokens - (st.stopped_by_eos || st.gen_tokens == 40 ? 1 : 0),
              "the cache holds the prompt and the fed tokens (%d)", cinfer_ctx_pos(c));
    }
    cinfer_ctx_free(c);
    cinfer_model_free(m);
    json_decref(ref);
}

/* draws n samples from fixed logits and returns counts */
static void draw(const cinfer_sampler_params *p, const float *logits, int V, int n, int *counts) {
    cinfer_sampler *s = NULL;
    float *tmp = malloc(sizeof(float) * V);
    memset(counts, 0, sizeof(int) * V);
    if (cinfer_sampler_new(p, V, &s)) { free(tmp); return; }
    for (int i = 0; i < n; i++) {
        memcpy(tmp, logits, sizeof(float) * V);
        int32_t t = cinfer_sampler_sample(s, tmp, NULL, 0);
        if (t >= 0 && t < V) counts[t]++;
    }
    cinfer_sampler_free(s);
    free(tmp);
}

static void test_sampler(void) {
    /* probabilities 0.4, 0.3, 0.15, 0.1, 0.05 (as logits) */
    const double pr[5] = {0.4, 0.3, 0.15, 0.1, 0.05};
    float lg[5];
    for (int i = 0; i < 5; i++) lg[i] = (float)log(pr[i]);
    int cnt[5], N = 20000;
    cinfer_sampler_params p = cinfer_sampler_defaults();
    draw(&p, lg, 5, 10, cnt);
    CHECK(cnt[0] == 10, "greedy always picks the argmax");
    p.temp = 1.0f;
    p.seed = 7;
    draw(&p, lg, 5, N, cnt);
    int fit = 1;
    for (int i = 0; i < 5; i++) fit &= fabs(cnt[i] / (double)N - pr[i]) < 4 * sqrt(pr[i] * (1 - pr[i]) / N) + 1e-3;
    CHECK(fit, "temp 1 frequencies follow softmax (%d %d %d %d %d of %d)", cnt[0], cnt[1], cnt[2], cnt[3], cnt[4], N);
    p.top_k = 2;
    draw(&p, lg, 5, N, cnt);
    CHECK(cnt[2] + cnt[3] + cnt[4] == 0 && fabs(cnt[0] / (double)N - 4.0 / 7) < 0.02, "top-k 2 keeps the two best, renormalised (%d %d)", cnt[0], cnt[1]);
    p.top_k = 0;
    p.top_p = 0.8f;   /* 0.4 + 0.3 + 0.15 = 0.85 reaches 0.8: three tokens */
    draw(&p, lg, 5, N, cnt);
    CHECK(cnt[3] + cnt[4] == 0 && cnt[2] > 0, "top-p 0.8 keeps the smallest set reaching 0.8 (%d %d %d %d %d)", cnt[0], cnt[1], cnt[2], cnt[3], cnt[4]);
    p.top_p = 1.0f;
    p.min_p = 0.3f;   /* keep p >= 0.12: tokens 0, 1, 2 */
    draw(&p, lg, 5, N, cnt);
    CHECK(cnt[3] + cnt[4] == 0 && cnt[2] > 0, "min-p 0.3 drops tokens below 0.3 x the top (%d %d %d %d %d)", cnt[0], cnt[1], cnt[2], cnt[3], cnt[4]);
    p.min_p = 0;
    p.temp = 0;
    p.rep_penalty = 2.0f;
    cinfer_sampler *s = NULL;
    float l2[3] = {2.0f, 1.5f, -1.0f};
    int32_t hist[2] = {0, 0};
    cinfer_sampler_new(&p, 3, &s);
    int32_t t = s ? cinfer_sampler_sample(s, l2, hist, 2) : -1;
    CHECK(t == 1 && l2[0] == 1.0f, "repetition penalty divides a repeated positive logit once (picked %d, logit %.2f)", t, l2[0]);
    cinfer_sampler_free(s);
    cinfer_sampler_params bad = cinfer_sampler_defaults();
    bad.top_p = 0;
    CHECK(cinfer_sampler_new(&bad, 5, &s) == CINFER_EINVAL, "top-p 0 is refused");
}

int main(void) {
    test_story();
    test_sampler();
    return CHECK_DONE();
}
