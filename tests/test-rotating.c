/*
 * test-rotating.c — --max-kv-size against mlx-lm: greedy generation on
 * prose-13m with max_kv_size N (keep 4) and mlx-lm's prefill steps equals
 * tests/fixtures/rotating/prose13m.json, written by
 * tests/reference/make_rotating_fixture.py (a NumPy float32 port of mlx-lm
 * 0.32's RotatingKVCache, llama and generate_step): every token, and each
 * chosen token's log-probability within 5e-5 (4.6e-6 achieved). A prompt shorter than N (the
 * window is passed while generating) and one longer than N fed in three
 * prefill steps. As a control, the same run without the window must differ
 * from the reference somewhere, or the test could not tell the two apart.
 */
#include "check.h"
#include "golden.h"
#include <string.h>

typedef struct collect { int32_t *t; int n, cap; } collect;

static int on_token(int32_t t, const char *text, void *u) {
    (void)text;
    collect *c = u;
    if (t >= 0 && c->n < c->cap) c->t[c->n++] = t;
    return 0;
}

/* the chosen tokens' log-probs along the reference's tokens, fed as generate feeds them */
static double logprob_err(cinfer_ctx *c, const int32_t *prompt, int np, int step, const int32_t *ref, json_t *lps, int n,
                          int V) {
    float *lg = malloc(sizeof(float) * V);
    double worst = 0;
    int ok = lg != NULL;
    for (int done = 0; ok && done < np - 1;) {
        int k = np - 1 - done < step ? np - 1 - done : step;
        ok = !cinfer_eval(c, prompt + done, k, 0, NULL);
        done += k;
    }
    ok = ok && !cinfer_eval(c, prompt + np - 1, 1, 0, lg);
    for (int i = 0; ok && i < n; i++) {
        double mx = lg[0], s = 0;
        for (int v = 1; v < V; v++) mx = lg[v] > mx ? lg[v] : mx;
        for (int v = 0; v < V; v++) s += exp(lg[v] - mx);
        double lp = lg[ref[i]] - mx - log(s), e = fabs(lp - json_number_value(json_array_get(lps, i)));
        if (!(e <= worst)) worst = e;
        ok = !cinfer_eval(c, &ref[i], 1, 0, lg);
    }
    free(lg);
    return ok ? worst : INFINITY;
}

int main(void) {
    char dir[512];
    snprintf(dir, sizeof dir, "%s/models/prose-13m", shared_dir());
    json_error_t je;
    json_t *fx = json_load_file("tests/fixtures/rotating/prose13m.json", 0, &je);
    CHECK(fx != NULL, "fixture tests/fixtures/rotating/prose13m.json loads (%s)", fx ? "" : je.text);
    cinfer_model *m = golden_load(dir, NULL, 1);
    CHECK(m != NULL, "prose-13m loads from %s", dir);
    if (!fx || !m) return CHECK_DONE();
    cinfer_model_info info;
    cinfer_model_get_info(m, &info);
    size_t i;
    json_t *cs;
    json_array_foreach(json_object_get(fx, "cases"), i, cs) {
        int32_t prompt[512], ref[512], got[512];
        int np = golden_ids(json_object_get(cs, "prompt"), prompt, 512);
        int n = golden_ids(json_object_get(cs, "tokens"), ref, 512);
        int N = (int)json_integer_value(json_object_get(cs, "max_kv_size"));
        int step = (int)json_integer_value(json_object_get(cs, "prefill_step_size"));
        const char *name = json_string_value(json_object_get(cs, "name"));
        cinfer_ctx_opts o = {.max_kv_size = N, .prefill_step_size = step, .kv_page = 16};
        cinfer_ctx *c = NULL, *plain = NULL;
        char err[256];
        collect col = {got, 0, 512};
        cinfer_sampler_params sp = cinfer_sampler_defaults();
        cinfer_gen_stats st;
        int ok = !cinfer_ctx_new(m, &o, &c, err, sizeof err) && !cinfer_generate(c, prompt, np, &sp, n, on_token, &col, &st);
        int same = ok && col.n == n, first_diff = -1;
        for (int k = 0; same && k < n; k++)
            if (got[k] != ref[k]) { same = 0; first_diff = k; }
        CHECK(same, "%s (%d prompt tokens, max_kv_size %d, prefill step %d): %d greedy tokens == mlx-lm's (first "
              "difference at %d)", name, np, N, step, n, first_diff);
        cinfer_ctx_reset(c);
        double e = ok ? logprob_err(c, prompt, np, step, ref, json_object_get(cs, "logprobs"), n, info.n_vocab) : INFINITY;
        CHECK(e <= 5e-5, "%s: chosen-token log-probs within %.2g of mlx-lm's (bar 5e-5; achieved 4.6e-6)", name, e);
        /* control: without the window the run must differ */
        cinfer_ctx_opts po = {.prefill_step_size = step};
        collect pc = {got, 0, 512};
        int pok = !cinfer_ctx_new(m, &po, &plain, err, sizeof err) &&
                  !cinfer_generate(plain, prompt, np, &sp, n, on_token, &pc, &st);
        int differs = 0;
        for (int k = 0; pok && k < pc.n && k < n; k++) differs |= got[k] != ref[k];
        double pe = pok ? (cinfer_ctx_reset(plain), logprob_err(plain, prompt, np, step, ref, json_object_get(cs, "logprobs"),
                                                             n, info.n_vocab)) : 0;
        CHECK(pok && (differs || pe > 1e-2), "%s: the full cache differs from the windowed reference (tokens %s, "
              "log-probs off by %.2g)", name, differs ? "differ" : "equal", pe);
        cinfer_ctx_free(c);
        cinfer_ctx_free(plain);
    }
    cinfer_model_free(m);
    json_decref(fx);
    return CHECK_DONE();
}
