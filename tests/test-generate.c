/*
 * test-generate.c — the generation loop and the sampler: stories260k greedy
 * text from BOS equals transformers' (fixture), streamed text equals the
 * whole decode, seeds reproduce; the sampler's temperature, top-k, top-p,
 * min-p, repetition penalty (negative logits, window) and their combinations
 * draw from the analytic distributions of tests/fixtures/sampler.json
 * (NumPy, transformers' processor rules; chi-square over 1e5 seeded draws),
 * and its generator gives xoshiro256** known answers.
 */
#include <jansson.h>
#include "check.h"
#include "golden.h"
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

/* draws n samples from fixed logits (history hist[nh] for the penalty) and returns counts */
static void draw_hist(const cinfer_sampler_params *p, const float *logits, int V, int n, const int32_t *hist, int nh, int *counts) {
    cinfer_sampler *s = NULL;
    float *tmp = malloc(sizeof(float) * V);
    memset(counts, 0, sizeof(int) * V);
    if (cinfer_sampler_new(p, V, &s)) { free(tmp); return; }
    for (int i = 0; i < n; i++) {
        memcpy(tmp, logits, sizeof(float) * V);
        int32_t t = cinfer_sampler_sample(s, tmp, hist, nh);
        if (t >= 0 && t < V) counts[t]++;
    }
    cinfer_sampler_free(s);
    free(tmp);
}

/* a JSON array of numbers -> floats */
static int json_floats(json_t *a, float *out, int cap) {
    int n = 0;
    size_t i;
    json_t *v;
    json_array_foreach(a, i, v) if (n < cap) out[n++] = (float)json_number_value(v);
    return n;
}

/* Every case of tests/fixtures/sampler.json (tests/reference/make_sampler_fixtures.py: the exact
 * distribution after transformers' logits processors, computed with NumPy): 1e5 seeded draws, a
 * chi-square test over the kept tokens at the 1e-3 level, and no draw of a dropped token. Seeded,
 * so the outcome is fixed: the test cannot flake. */
#define N_DRAWS 100000
static void test_distributions(json_t *fx) {
    float lg[64];
    int V = json_floats(json_object_get(fx, "logits"), lg, 64), cnt[64];
    size_t k;
    json_t *c;
    json_array_foreach(json_object_get(fx, "cases"), k, c) {
        cinfer_sampler_params p = cinfer_sampler_defaults();
        p.temp = (float)json_number_value(json_object_get(c, "temp"));
        p.top_k = (int)json_integer_value(json_object_get(c, "top_k"));
        p.top_p = (float)json_number_value(json_object_get(c, "top_p"));
        p.min_p = (float)json_number_value(json_object_get(c, "min_p"));
        p.rep_penalty = (float)json_number_value(json_object_get(c, "rep_penalty"));
        p.rep_last_n = (int)json_integer_value(json_object_get(c, "rep_last_n"));
        p.seed = 1000 + k;
        int32_t hist[64];
        int nh = golden_ids(json_object_get(c, "history"), hist, 64);
        draw_hist(&p, lg, V, N_DRAWS, hist, nh, cnt);
        double chi2 = 0;
        int stray = 0, kept = 0;
        for (int i = 0; i < V; i++) {
            double pr = json_number_value(json_array_get(json_object_get(c, "probs"), i)), e = pr * N_DRAWS;
            if (pr > 0) { chi2 += (cnt[i] - e) * (cnt[i] - e) / e; kept++; }
            else stray += cnt[i];
        }
        double crit = json_number_value(json_object_get(c, "chi2_crit"));
        CHECK(kept == json_integer_value(json_object_get(c, "kept")) && !stray && chi2 <= crit,
              "%s: %d draws follow the analytic distribution (chi2 %.1f <= %.1f, %d df; %d draws of dropped tokens)",
              json_string_value(json_object_get(c, "name")), N_DRAWS, chi2, crit, kept - 1, stray);
    }
}

/* The generator as documented (xoshiro256** seeded through splitmix64): with 256 equal logits the
 * token is floor(u * 256) for the generator's u, so the first 32 tokens are known answers. */
static void test_rng(json_t *fx) {
    float flat[256] = {0};
    size_t k;
    json_t *c;
    int32_t first[4][32];
    json_array_foreach(json_object_get(fx, "rng"), k, c) {
        cinfer_sampler_params p = cinfer_sampler_defaults();
        p.temp = 1.0f;
        const char *sd = json_string_value(json_object_get(c, "seed"));
        p.seed = sd ? strtoull(sd, NULL, 10) : 0;
        int32_t want[32];
        golden_ids(json_object_get(c, "tokens"), want, 32);
        cinfer_sampler *s = NULL;
        int same = !cinfer_sampler_new(&p, 256, &s);
        for (int i = 0; same && i < 32; i++) {
            float tmp[256];
            memcpy(tmp, flat, sizeof tmp);
            int32_t t = cinfer_sampler_sample(s, tmp, NULL, 0);
            if (k < 4) first[k][i] = t;
            if (t != want[i]) { same = 0; printf("# seed %llu draw %d: %d, want %d\n", (unsigned long long)p.seed, i, t, want[i]); }
        }
        cinfer_sampler_free(s);
        CHECK(same, "seed %llu: the first 32 draws are xoshiro256** (splitmix64 seeding) known answers", (unsigned long long)p.seed);
    }
    int differ = k >= 2 && memcmp(first[0], first[1], sizeof first[0]) && memcmp(first[1], first[2], sizeof first[0]);
    CHECK(differ, "different seeds give different draws");
}

static void test_sampler(void) {
    json_t *fx = json_load_file("tests/fixtures/sampler.json", 0, NULL);
    CHECK(fx != NULL, "tests/fixtures/sampler.json loads");
    if (fx) { test_distributions(fx); test_rng(fx); }
    json_decref(fx);
    /* probabilities 0.4, 0.3, 0.15, 0.1, 0.05 (as logits) */
    const double pr[5] = {0.4, 0.3, 0.15, 0.1, 0.05};
    float lg[5];
    for (int i = 0; i < 5; i++) lg[i] = (float)log(pr[i]);
    int cnt[5];
    cinfer_sampler_params p = cinfer_sampler_defaults();
    draw_hist(&p, lg, 5, 10, NULL, 0, cnt);
    CHECK(cnt[0] == 10, "greedy always picks the argmax");
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

/* The sampler sorts only the prefix its filters can keep (select_first, a probability threshold). A
 * plain sampler that sorts the whole vocabulary (the order: logit descending, then id; the same
 * xoshiro256** draws) must pick the same token: 300 draws per case over 32,000 logits with ties,
 * -inf and a peaked head, for top-k, top-p, min-p and their combinations. (For top-p / min-p without
 * top-k the normalising sum is taken in id order, not in sorted order: a draw can differ only when it
 * falls within a few ulps of a bucket's edge, which these draws never do.) */
static uint64_t ref_rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }
static double ref_unit(uint64_t *q) {
    uint64_t r = ref_rotl(q[1] * 5, 7) * 9, t = q[1] << 17;
    q[2] ^= q[0]; q[3] ^= q[1]; q[1] ^= q[2]; q[0] ^= q[3]; q[2] ^= t; q[3] = ref_rotl(q[3], 45);
    return (double)(r >> 11) * (1.0 / 9007199254740992.0);
}
static const float *ref_l;
static int ref_cmp(const void *a, const void *b) {
    float x = ref_l[*(const int32_t *)a], y = ref_l[*(const int32_t *)b];
    return x < y ? 1 : x > y ? -1 : (*(const int32_t *)a - *(const int32_t *)b);
}
/* the plain sampler's kept candidates (sorted ids, probabilities, count): the whole vocabulary sorted */
static int ref_keep(const float *l, int V, const cinfer_sampler_params *p, int32_t *idx, float *prob) {
    int best = 0;
    for (int i = 1; i < V; i++) if (l[i] > l[best]) best = i;
    float inv_t = 1.0f / p->temp;
    int n = p->top_k > 0 && p->top_k < V ? p->top_k : V;
    for (int i = 0; i < V; i++) idx[i] = i;
    ref_l = l;
    qsort(idx, (size_t)V, sizeof *idx, ref_cmp);
    double mx = l[best] * inv_t, sum = 0;
    for (int i = 0; i < n; i++) sum += (prob[i] = (float)exp(l[idx[i]] * inv_t - mx));
    for (int i = 0; i < n; i++) prob[i] = (float)(prob[i] / sum);
    if (p->top_p < 1.0f) { double acc = 0; int k = 0; while (k < n && acc < p->top_p) acc += prob[k++]; n = k > 0 ? k : 1; }
    if (p->min_p > 0) { float fl = p->min_p * prob[0]; int k = 1; while (k < n && prob[k] >= fl) k++; n = k; }
    return n;
}
/* and its draw from them */
static int32_t ref_draw(const int32_t *idx, const float *prob, int n, uint64_t *q) {
    double tot = 0, acc = 0;
    for (int i = 0; i < n; i++) tot += prob[i];
    double r = ref_unit(q) * tot;
    for (int i = 0; i < n; i++) { acc += prob[i]; if (r < acc) return idx[i]; }
    return idx[n - 1];
}
static void test_sampler_vs_sort(void) {
    enum { V = 32000, DRAWS = 300 };
    float *l = malloc(sizeof(float) * V), *work = malloc(sizeof(float) * V), *prob = malloc(sizeof(float) * V);
    int32_t *idx = malloc(sizeof(int32_t) * V);
    uint64_t x = 12345;
    for (int i = 0; i < V; i++) {   /* a peaked head, a long tail, ties and a few -inf */
        x = x * 6364136223846793005ull + 1442695040888963407ull;
        float u = (float)((x >> 40) & 0xffffff) / 16777216.0f;
        l[i] = i % 997 == 0 ? -INFINITY : i % 101 == 0 ? 3.0f : 8.0f * u * u * u - 2.0f;
    }
    l[7] = 9.0f; l[8] = 8.5f; l[9] = 8.5f;
    static const struct { float temp, top_p, min_p; int top_k; } cases[] = {
        {0.7f, 0.9f, 0, 0}, {1.3f, 0.5f, 0, 0}, {1.0f, 0.999f, 0, 0}, {1.0f, 1.0f, 0.05f, 0}, {0.8f, 0.95f, 0.02f, 0},
        {1.0f, 1.0f, 0, 40}, {0.9f, 0.9f, 0, 50}, {1.2f, 0.8f, 0.1f, 200}, {2.0f, 0.99f, 0, 0}};
    int same = 0, total = 0;
    for (size_t c = 0; c < sizeof cases / sizeof *cases; c++) {
        cinfer_sampler_params p = cinfer_sampler_defaults();
        p.temp = cases[c].temp; p.top_p = cases[c].top_p; p.min_p = cases[c].min_p; p.top_k = cases[c].top_k; p.seed = 77 + c;
        cinfer_sampler *s = NULL;
        if (cinfer_sampler_new(&p, V, &s)) continue;
        uint64_t q[4], sd = p.seed;
        for (int i = 0; i < 4; i++) {   /* splitmix64 seeding, as documented */
            uint64_t z = (sd += 0x9e3779b97f4a7c15ull);
            z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
            z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
            q[i] = z ^ (z >> 31);
        }
        int kept = ref_keep(l, V, &p, idx, prob);
        for (int d = 0; d < DRAWS; d++) {
            memcpy(work, l, sizeof(float) * V);
            int32_t a = cinfer_sampler_sample(s, work, NULL, 0), b = ref_draw(idx, prob, kept, q);
            same += a == b;
            total++;
        }
        cinfer_sampler_free(s);
    }
    CHECK(total > 0 && same == total, "the sampler's partial sort picks what a full sort of 32,000 logits picks: %d/%d draws "
          "(top-k, top-p, min-p and combinations, ties and -inf)", same, total);
    free(l); free(work); free(prob); free(idx);
}

int main(void) {
    test_story();
    test_sampler();
    test_sampler_vs_sort();
    return CHECK_DONE();
}
