/*
 * test-score.c — scoring against references: NumPy permutations and the
 * mlx-bun shuffle, mlx_lm's load_data rows, perplexity / KL statistics /
 * response log-probs equal to a PyTorch computation of the same definitions
 * on the same rows (tests/reference/make_score_fixtures.py ->
 * tests/fixtures/score/reference.json), relative error <= 1e-4, and again in
 * forced 3-position chunks (CINFER_SCORE_CHUNK); chat-format data rows equal
 * to transformers' apply_chat_template (make_data_fixtures.py ->
 * cli-reference.json). Also: KL of a
 * model with itself, padded batch == alone, --save-base round trip, and bad
 * input (empty/short/malformed data, different vocabularies, bad base file).
 */
#include <jansson.h>
#include <limits.h>
#include <sys/stat.h>
#include <unistd.h>
#include "check.h"
#include "cinfer.h"
#include "golden.h"
#include "engine/score.h"

#define REF "tests/fixtures/score/reference.json"
#define CLI_REF "tests/fixtures/score/cli-reference.json"

static cinfer_model *load(const char *name) {
    char dir[512], err[1024];
    if (!strcmp(name, "stories260k")) snprintf(dir, sizeof dir, "%s/models/stories260k", shared_dir());
    else if (!strncmp(name, "score/", 6)) snprintf(dir, sizeof dir, "tests/fixtures/%s", name);
    else snprintf(dir, sizeof dir, "tests/fixtures/models/%s", name);
    cinfer_model *m = NULL;
    if (cinfer_model_load(dir, NULL, &m, err, sizeof err)) printf("# load %s: %s\n", dir, err);
    return m;
}

static cinfer_ctx *ctx_of(cinfer_model *m) {
    cinfer_ctx *c = NULL;
    char err[256];
    if (m && cinfer_ctx_new(m, NULL, &c, err, sizeof err)) printf("# ctx: %s\n", err);
    return c;
}

/* rows [[...], ...] -> malloc'd ids, sets R and L */
static int32_t *rows_of(json_t *a, int *R, int *L) {
    *R = (int)json_array_size(a);
    *L = *R ? (int)json_array_size(json_array_get(a, 0)) : 0;
    int32_t *ids = malloc(sizeof *ids * (size_t)(*R ? *R : 1) * (*L ? *L : 1));
    for (int r = 0; r < *R; r++)
        for (int i = 0; i < *L; i++) ids[(size_t)r * *L + i] = (int32_t)json_integer_value(json_array_get(json_array_get(a, r), i));
    return ids;
}

static double num(json_t *o, const char *k) { return json_number_value(json_object_get(o, k)); }

static void write_file(const char *path, const char *text) {
    FILE *f = fopen(path, "w");
    if (f) { fputs(text, f); fclose(f); }
}

/* "" or ", 3-position chunks": the scoring tests run twice, the second time with CINFER_SCORE_CHUNK */
static const char *mode = "";
#define LP_BATCH_TOL 1e-5
/* against PyTorch, relative: perplexity / SE / mean and std of the loss, achieved <= 2.6e-7
 * (llama-f32); each position's loss or log-prob (relative to max(1, |x|)), achieved <= 7.6e-6
 * (stories260k in 3-position chunks; 4.8e-6 for log-probs) */
#define PPL_TOL 1e-6
#define NLL_TOL 2.5e-5

static double rel_err(double a, double b) { return fabs(a - b) / fmax(fabs(b), 1e-300); }

static int close_to(double a, double b, double floor) { return fabs(a - b) <= 1e-4 * fabs(b) + floor; }

/* --------------------------------------------------------------- shuffles */

static void test_shuffles(json_t *ref) {
    json_t *ps = json_object_get(ref, "permutations"), *p;
    size_t k;
    int bad = 0, n_cases = 0;
    json_array_foreach(ps, k, p) {
        uint32_t seed = (uint32_t)json_integer_value(json_object_get(p, "seed"));
        int n = (int)json_integer_value(json_object_get(p, "n"));
        int32_t *perm = malloc(sizeof *perm * n);
        cinfer_shuffle_perm(CINFER_SHUFFLE_NUMPY, seed, n, perm);
        json_t *head = json_object_get(p, "head"), *tail = json_object_get(p, "tail");
        int ok = 1;
        for (size_t i = 0; i < json_array_size(head); i++) ok &= perm[i] == json_integer_value(json_array_get(head, i));
        size_t nt = json_array_size(tail);
        for (size_t i = 0; i < nt; i++) ok &= perm[n - nt + i] == json_integer_value(json_array_get(tail, i));
        long long w = 0;
        for (int i = 0; i < n; i++) w += (long long)perm[i] * (i + 1);
        ok &= w == json_integer_value(json_object_get(p, "weighted"));
        if (!ok) { bad++; printf("# numpy permutation seed %u n %d differs\n", seed, n); }
        n_cases++;
        free(perm);
    }
    CHECK(n_cases > 20 && !bad, "numpy shuffle == np.random.seed(s); np.random.permutation(n) (%d seeds x lengths, %d differ)", n_cases, bad);

    json_t *mb = json_load_file("tests/fixtures/score/mulberry32.json", 0, NULL);
    bad = 0;
    n_cases = 0;
    json_array_foreach(json_object_get(mb, "cases"), k, p) {
        int n = (int)json_integer_value(json_object_get(p, "n"));
        int32_t *perm = malloc(sizeof *perm * n);
        cinfer_shuffle_perm(CINFER_SHUFFLE_MULBERRY32, (uint32_t)json_integer_value(json_object_get(p, "seed")), n, perm);
        json_t *want = json_object_get(p, "perm");
        for (size_t i = 0; i < json_array_size(want); i++)
            if (perm[i] != json_integer_value(json_array_get(want, i))) { bad++; break; }
        n_cases++;
        free(perm);
    }
    CHECK(mb && n_cases >= 20 && !bad, "mulberry32 shuffle == mlx-bun's (%d cases, %d differ)", n_cases, bad);
    /* packing: np.random.seed(1); np.random.permutation(3) = [0, 2, 1] -> stream a c b = 1 2 6 7 8 9 (enough for 2
     * rows of 3, so b is never visited) */
    int32_t a[] = {1, 2}, b[] = {3, 4, 5}, cc[] = {6, 7, 8, 9};
    const int32_t *sm[] = {a, b, cc};
    int lens[] = {2, 3, 4}, nr = 0;
    cinfer_data_opts o = {3, 2, 1, CINFER_SHUFFLE_NUMPY};
    int32_t *rows = NULL, want[6] = {1, 2, 6, 7, 8, 9};
    cinfer_status st = cinfer_pack_rows(sm, lens, 3, &o, &rows, &nr, NULL, 0);
    CHECK(!st && nr == 2 && !memcmp(rows, want, sizeof want), "pack_rows: samples in permutation order, cut into 2 rows of 3");
    free(rows);
    json_decref(mb);
}

/* ----------------------------------------------------------------- data */

static void test_data(json_t *ref) {
    cinfer_model *m = load("stories260k");
    json_t *d = json_object_get(ref, "data");
    int R, L;
    int32_t *want = rows_of(json_object_get(d, "rows"), &R, &L);
    cinfer_data_opts o = cinfer_data_defaults();
    o.seq_len = (int)num(d, "seq_len");
    o.num_samples = (int)num(d, "num_samples");
    o.seed = (uint32_t)num(d, "seed");
    int32_t *rows = NULL;
    int n = 0;
    char err[512] = "";
    cinfer_status st = m ? cinfer_load_rows(cinfer_model_tokenizer(m), -1, "tests/fixtures/score/data.jsonl", &o, &rows, &n, err, sizeof err) : CINFER_EIO;
    int same = !st && n == R && L == o.seq_len && !memcmp(rows, want, sizeof *rows * (size_t)R * L);
    CHECK(same, "data.jsonl -> %d rows of %d == mlx_lm load_data with tokenizers + np.random.permutation (%s)", n, L, st ? err : "");
    free(rows);
    /* -1: every full row, no crash */
    o.num_samples = -1;
    st = m ? cinfer_load_rows(cinfer_model_tokenizer(m), -1, "tests/fixtures/score/data.jsonl", &o, &rows, &n, err, sizeof err) : CINFER_EIO;
    CHECK(!st && n > R, "--num-samples -1 takes every full row (%d > %d)", n, R);
    free(rows);
    free(want);
    cinfer_model_free(m);
}

/* {"messages"}, {"prompt","completion"} and {"tokens"} lines -> the ids mlx_lm's datasets build with
 * transformers' apply_chat_template (tests/reference/make_data_fixtures.py -> cli-reference.json
 * "chat_data": the template, the lines, the ids of each line); {"tokens"} as is */
static void test_chat_data(void) {
    json_t *ref = json_load_file(CLI_REF, 0, NULL), *cd = json_object_get(ref, "chat_data");
    CHECK(cd != NULL, "%s holds chat_data", CLI_REF);
    if (!cd) { json_decref(ref); return; }
    char dir[64], path[128], src[512], jl[128];
    snprintf(dir, sizeof dir, "/tmp/cinfer-score-%d-chat", (int)getpid());
    if (mkdir(dir, 0755)) { CHECK(0, "mkdir %s", dir); json_decref(ref); return; }
    const char *files[] = {"config.json", "model.safetensors", "tokenizer.json"};
    /* links to the real model through absolute paths */
    for (int i = 0; i < 3; i++) {
        snprintf(src, sizeof src, "%s/models/stories260k/%s", shared_dir(), files[i]);
        snprintf(path, sizeof path, "%s/%s", dir, files[i]);
        char *abs = realpath(src, NULL);
        if (abs && symlink(abs, path)) printf("# symlink %s failed\n", path);
        free(abs);
    }
    snprintf(path, sizeof path, "%s/tokenizer_config.json", dir);
    json_dump_file(json_object_get(cd, "tokenizer_config"), path, 0);
    snprintf(jl, sizeof jl, "%s/data.jsonl", dir);
    FILE *f = fopen(jl, "w");
    size_t k;
    json_t *v;
    json_array_foreach(json_object_get(cd, "lines"), k, v) {
        char *line = json_dumps(v, JSON_COMPACT);
        if (f && line) fprintf(f, "%s\n", line);
        free(line);
    }
    if (f) fclose(f);
    /* the stream: every line's ids in file order */
    int32_t want[1024];
    int nw = 0;
    json_array_foreach(json_object_get(cd, "ids"), k, v) nw += golden_ids(v, want + nw, 1024 - nw);
    char err[512] = "";
    cinfer_model *m = NULL;
    cinfer_model_load(dir, NULL, &m, err, sizeof err);
    const cinfer_tokenizer *t = m ? cinfer_model_tokenizer(m) : NULL;
    cinfer_data_opts o = cinfer_data_defaults();
    o.seq_len = 4;
    o.num_samples = -1;
    o.shuffle = CINFER_SHUFFLE_NONE;
    int32_t *rows = NULL;
    int n = 0;
    cinfer_status st = t ? cinfer_load_rows(t, -1, jl, &o, &rows, &n, err, sizeof err) : CINFER_EINVAL;
    int same = !st && n == nw / 4 && nw > 100;
    for (int i = 0; same && i < n * 4; i++)
        if (rows[i] != want[i]) { same = 0; printf("# chat data: id %d is %d, transformers %d\n", i, rows[i], want[i]); }
    CHECK(same, "chat data: messages / prompt+completion through transformers' apply_chat_template, tokens as is "
          "(%d rows of 4 from %d ids) %s", n, nw, err);
    free(rows);
    cinfer_model_free(m);
    const char *rm[] = {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json", "data.jsonl"};
    for (int i = 0; i < 5; i++) { snprintf(path, sizeof path, "%s/%s", dir, rm[i]); unlink(path); }
    rmdir(dir);
    json_decref(ref);
}

/* ----------------------------------------------------------- perplexity */

static void test_perplexity(json_t *ref) {
    json_t *c;
    size_t k;
    json_array_foreach(json_object_get(ref, "perplexity"), k, c) {
        const char *name = json_string_value(json_object_get(c, "model"));
        cinfer_model *m = load(name);
        cinfer_ctx *x = ctx_of(m);
        int R, L;
        int32_t *rows = rows_of(json_object_get(c, "rows"), &R, &L);
        float *nll = malloc(sizeof(float) * R * (L - 1)), *nll1 = malloc(sizeof(float) * R * (L - 1));
        cinfer_ppl_result r, r1;
        char err[512] = "";
        int ok = x && !cinfer_perplexity(x, rows, R, L, 2, nll, NULL, NULL, &r, err, sizeof err);
        CHECK(ok, "%s%s: perplexity runs (%s)", name, mode, err);
        if (ok) {
            double e = 0;
            json_t *rn = json_object_get(c, "nll");
            for (int i = 0; i < R * (L - 1); i++) {
                double b = json_number_value(json_array_get(rn, i)), d = fabs(nll[i] - b) / fmax(fabs(b), 1);
                e = d > e ? d : e;
            }
            double ep = fmax(fmax(rel_err(r.perplexity, num(c, "perplexity")), rel_err(r.standard_error, num(c, "standard_error"))),
                             fmax(rel_err(r.mean_loss, num(c, "mean_loss")), rel_err(r.std_loss, num(c, "std_loss"))));
            CHECK(ep <= PPL_TOL && r.tokens == (int64_t)num(c, "tokens") && e <= NLL_TOL,
                  "%s%s: perplexity %.6f +- %.6f == PyTorch %.6f +- %.6f (statistics max rel %.1e, tol %.0e; per-token max rel %.1e, "
                  "tol %.1e)", name, mode,
                  r.perplexity, r.standard_error, num(c, "perplexity"), num(c, "standard_error"), ep, PPL_TOL, e, NLL_TOL);
            /* batch 1 vs batch R: same numbers */
            ok = !cinfer_perplexity(x, rows, R, L, 1, nll1, NULL, NULL, &r1, err, sizeof err);
            double d = 0;
            for (int i = 0; ok && i < R * (L - 1); i++) d = fmax(d, fabs(nll[i] - nll1[i]));
            CHECK(ok && d <= 1e-5 * fmax(1, r.mean_loss), "%s%s: rows scored alone == in a batch (max |diff| %.1e)", name, mode, d);
        }
        free(nll);
        free(nll1);
        free(rows);
        cinfer_ctx_free(x);
        cinfer_model_free(m);
    }
}

/* --------------------------------------------------------------------- KL */

static int kl_matches(const char *what, const cinfer_kl_stats *s, json_t *c) {
    struct { const char *k; double v, floor; } f[] = {
        {"ppl_model", s->ppl_model, 0}, {"ppl_base", s->ppl_base, 0}, {"ppl_model_unc", s->ppl_model_unc, 1e-9},
        {"ppl_base_unc", s->ppl_base_unc, 1e-9}, {"cor_ln_ppl", s->cor_ln_ppl, 1e-6}, {"ln_ratio", s->ln_ratio, 1e-7},
        {"ln_ratio_unc", s->ln_ratio_unc, 1e-6}, {"ratio", s->ratio, 0}, {"ratio_unc", s->ratio_unc, 1e-6},
        {"diff", s->diff, 1e-5 * s->ppl_base}, {"diff_unc", s->diff_unc, 1e-4 * s->ppl_base_unc + 1e-9},
        {"mean_kld", s->mean_kld, 1e-7}, {"kld_unc", s->kld_unc, 1e-7},
        {"mean_dp", s->mean_dp, 1e-7}, {"dp_unc", s->dp_unc, 1e-7}, {"rms_dp", s->rms_dp, 1e-7}, {"rms_dp_unc", s->rms_dp_unc, 1e-6},
        {"same_top", s->same_top, 0}, {"same_top_unc", s->same_top_unc, 1e-9}};
    int bad = 0;
    for (size_t i = 0; i < sizeof f / sizeof *f; i++)
        if (!close_to(f[i].v, num(c, f[i].k), f[i].floor)) { bad++; printf("# %s: %s %.9g vs reference %.9g\n", what, f[i].k, f[i].v, num(c, f[i].k)); }
    for (int i = 0; i < 11; i++) {
        double b = json_number_value(json_array_get(json_object_get(c, "kld_q"), i));
        if (!close_to(s->kld_q[i], b, 1e-6)) { bad++; printf("# %s: kld_q[%d] %.9g vs %.9g\n", what, i, s->kld_q[i], b); }
    }
    for (int i = 0; i < 13; i++) {
        double b = json_number_value(json_array_get(json_object_get(c, "dp_q"), i));
        if (!close_to(s->dp_q[i], b, 1e-6)) { bad++; printf("# %s: dp_q[%d] %.9g vs %.9g\n", what, i, s->dp_q[i], b); }
    }
    if (s->tokens != (int64_t)num(c, "tokens")) bad++;
    return bad;
}

static void test_kl(json_t *ref) {
    json_t *c;
    size_t k;
    json_array_foreach(json_object_get(ref, "kl"), k, c) {
        const char *bn = json_string_value(json_object_get(c, "base")), *mn = json_string_value(json_object_get(c, "model"));
        cinfer_model *mb = load(bn), *mm = load(mn);
        cinfer_ctx *cb = ctx_of(mb), *cm = ctx_of(mm);
        int R, L;
        int32_t *rows = rows_of(json_object_get(c, "rows"), &R, &L);
        cinfer_kl_stats s;
        char err[512] = "", what[128];
        snprintf(what, sizeof what, "KL(%s || %s)%s", bn, mn, mode);
        cinfer_kl_token *pt = malloc(sizeof *pt * R * (L - 1));
        int ok = cb && cm && !cinfer_kl(cm, cb, NULL, rows, R, L, 2, pt, NULL, NULL, &s, err, sizeof err);
        CHECK(ok, "%s runs (%s)", what, err);
        if (!ok) goto next;
        int bad = kl_matches(what, &s, c);
        double e = 0;
        for (int i = 0; i < R * (L - 1); i++) {
            double b = json_number_value(json_array_get(json_object_get(c, "kld"), i));
            e = fmax(e, fabs(pt[i].kld - b) - 1e-4 * fabs(b));
        }
        CHECK(!bad && e <= 1e-5, "%s: every statistic == PyTorch/llama.cpp definitions (mean KLD %.6f vs %.6f, same top %.4f, "
              "PPL %.4f / %.4f; per-token KLD excess error %.1e)", what, s.mean_kld, num(c, "mean_kld"), s.same_top,
              s.ppl_model, s.ppl_base, e);
        if (!strcmp(bn, mn))
            CHECK(s.mean_kld == 0 && s.kld_q[0] == 0 && s.same_top == 1 && s.rms_dp == 0,
                  "%s: a model against itself: KLD exactly 0 (max %g), same top 100%% (%.4f)", what, s.kld_q[0], s.same_top);
        /* --save-base then --base-logprobs */
        char path[64];
        snprintf(path, sizeof path, "/tmp/cinfer-test-score-%d.klb", (int)getpid());
        cinfer_kl_base *file = NULL;
        cinfer_kl_stats f;
        ok = !cinfer_kl_save_base(cb, rows, R, L, 3, path, NULL, NULL, err, sizeof err) &&
             !cinfer_kl_base_open(path, &file, err, sizeof err) &&
             !cinfer_kl(cm, NULL, file, NULL, 0, 0, 1, NULL, NULL, NULL, &f, err, sizeof err);
        CHECK(ok, "%s: --save-base / --base-logprobs run (%s)", what, err);
        if (ok) {
            double dk = fabs(f.mean_kld - s.mean_kld), dq = 0;
            for (int i = 0; i < 11; i++) dq = fmax(dq, fabs(f.kld_q[i] - s.kld_q[i]));
            /* batch sizes differ between the runs (3/1 vs 2): the forwards agree to float rounding, not bits */
            CHECK(fabs(f.ppl_base / s.ppl_base - 1) <= 1e-6 && fabs(f.ppl_model / s.ppl_model - 1) <= 1e-6 &&
                  f.same_top == s.same_top && fabs(f.mean_dp - s.mean_dp) <= 1e-7 &&
                  dk <= 1.22e-4 * (1 + s.mean_kld) && dq <= 2.5e-4 * (1 + s.kld_q[0]),
                  "%s: base file == base in memory (PPLs, same top, dp to 1e-6; |mean KLD diff| %.2e, percentiles %.2e, bound 1.22e-4 nats/entry)",
                  what, dk, dq);
        }
        cinfer_kl_base_free(file);
        unlink(path);
    next:
        free(pt);
        free(rows);
        cinfer_ctx_free(cb);
        cinfer_ctx_free(cm);
        cinfer_model_free(mb);
        cinfer_model_free(mm);
    }
}

/* ------------------------------------------------------------- logprobs */

/* logprobs through a prefix tier (--cache-dir): a cold run (prompts fed alone and stored) and a warm run
 * (every prompt restored from disk) score as PyTorch does, as the run without a tier does (within the
 * batch tolerance: the prompts are fed in other forwards), and the warm run equals the cold one bit for bit */
static void tier_logprobs(const char *name, cinfer_model *m, cinfer_ctx *x, const cinfer_lp_seq *s, int n, int tot,
                          json_t *cases, const double *sb, const float *pb) {
    char dir[64] = "/tmp/cinfer-score-tier-XXXXXX", err[512] = "", cmd[128];
    cinfer_tier *t = NULL;
    if (!mkdtemp(dir) || cinfer_tier_open(dir, m, NULL, &t, err, sizeof err)) { CHECK(0, "%s: open a tier (%s)", name, err); return; }
    double *sc = malloc(sizeof(double) * 2 * n), *sw = sc + n;
    float *pc = malloc(sizeof(float) * 2 * (size_t)tot), *pw = pc + tot;
    int64_t cc = -1, cw = -1, want = 0;
    for (int i = 0; i < n; i++) want += s[i].n_prompt - 1;
    int ok = !cinfer_response_logprobs_tier(x, t, s, n, n, sc, pc, NULL, NULL, &cc, err, sizeof err) &&
             !cinfer_response_logprobs_tier(x, t, s, n, n, sw, pw, NULL, NULL, &cw, err, sizeof err);
    double e = 0, d = 0;
    for (int i = 0, k = 0; ok && i < n; i++) {
        d = fmax(d, fabs(sc[i] - sb[i]) / fmax(1, fabs(sb[i])));
        for (int j = 0; j < s[i].n_response; j++, k++) {
            double b = json_number_value(json_array_get(json_object_get(json_array_get(cases, i), "per_token"), j));
            e = fmax(e, fabs(pc[k] - b) / fmax(1, fabs(b)));
            d = fmax(d, fabs(pc[k] - pb[k]) / fmax(1, fabs(pb[k])));
        }
    }
    CHECK(ok && e <= NLL_TOL && d <= LP_BATCH_TOL, "%s%s: logprobs with a prefix tier == PyTorch (max rel %.1e, tol %.1e) and "
          "== without it (%.1e, tol %.0e) (%s)", name, mode, e, NLL_TOL, d, LP_BATCH_TOL, err);
    CHECK(ok && cw == want && !memcmp(sc, sw, sizeof(double) * n) && !memcmp(pc, pw, sizeof(float) * tot),
          "%s%s: the warm run takes all %lld prompt tokens from the tier (cold took %lld) and equals the cold run bit for bit",
          name, mode, (long long)cw, (long long)cc);
    free(sc);
    free(pc);
    cinfer_tier_free(t);
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    if (system(cmd)) printf("# could not remove %s\n", dir);
}

static void test_logprobs(json_t *ref) {
    json_t *c;
    size_t k;
    json_array_foreach(json_object_get(ref, "logprobs"), k, c) {
        const char *name = json_string_value(json_object_get(c, "model"));
        cinfer_model *m = load(name);
        cinfer_ctx *x = ctx_of(m);
        json_t *cases = json_object_get(c, "cases");
        int n = (int)json_array_size(cases), R, L, tot = 0;
        cinfer_lp_seq *s = calloc(n, sizeof *s);
        int32_t **bufs = calloc(2 * n, sizeof *bufs);
        for (int i = 0; i < n; i++) {
            json_t *p = json_array_get(cases, i), *pa = json_pack("[O]", json_object_get(p, "prompt")),
                   *ra = json_pack("[O]", json_object_get(p, "response"));
            bufs[2 * i] = rows_of(pa, &R, &L);
            s[i].prompt = bufs[2 * i]; s[i].n_prompt = L;
            bufs[2 * i + 1] = rows_of(ra, &R, &L);
            s[i].response = bufs[2 * i + 1]; s[i].n_response = L;
            tot += L;
            json_decref(pa);
            json_decref(ra);
        }
        double *sb = malloc(sizeof(double) * n), *s1 = malloc(sizeof(double) * n);
        float *pb = malloc(sizeof(float) * tot), *p1 = malloc(sizeof(float) * tot);
        char err[512] = "";
        int ok = x && !cinfer_response_logprobs(x, s, n, n, sb, pb, NULL, NULL, err, sizeof err);
        int ok1 = ok;
        for (int i = 0, off = 0; ok1 && i < n; off += s[i].n_response, i++)   /* each alone */
            ok1 = !cinfer_response_logprobs(x, s + i, 1, 1, s1 + i, p1 + off, NULL, NULL, err, sizeof err);
        CHECK(ok && ok1, "%s%s: response log-probs run (%s)", name, mode, err);
        if (ok && ok1) {
            int bad = 0;
            double e = 0, d = 0, ds = 0;
            for (int i = 0, t = 0; i < n; i++) {
                json_t *p = json_array_get(cases, i);
                if (!close_to(sb[i], num(p, "sum"), 1e-6)) { bad++; printf("# case %d: %.8f vs %.8f\n", i, sb[i], num(p, "sum")); }
                ds = fmax(ds, fabs(sb[i] - s1[i]) / fmax(1, fabs(s1[i])));
                for (int j = 0; j < s[i].n_response; j++, t++) {
                    double b = json_number_value(json_array_get(json_object_get(p, "per_token"), j));
                    e = fmax(e, fabs(pb[t] - b) / fmax(1, fabs(b)));
                    d = fmax(d, fabs(pb[t] - p1[t]) / fmax(1, fabs(p1[t])));
                }
            }
            CHECK(!bad && e <= NLL_TOL, "%s%s: %d response log-prob sums == PyTorch (per-token max rel %.1e, tol %.1e)", name, mode, n,
                  e, NLL_TOL);
            /* achieved (relative): per token 2.9e-6 (stories260k), 6.8e-7 (qwen2-f32); sums <= 2.9e-7 */
            CHECK(d <= LP_BATCH_TOL && ds <= LP_BATCH_TOL, "%s%s: a padded batch of %d gives each row its own log-probs "
                  "(max rel diff per token %.1e, sums %.1e; tolerance %.0e)", name, mode, n, d, ds, LP_BATCH_TOL);
            tier_logprobs(name, m, x, s, n, tot, cases, sb, pb);
        }
        for (int i = 0; i < 2 * n; i++) free(bufs[i]);
        free(bufs);
        free(s);
        free(sb);
        free(s1);
        free(pb);
        free(p1);
        cinfer_ctx_free(x);
        cinfer_model_free(m);
    }
}

/* ------------------------------------------------------------ bad input */

static void test_bad_input(void) {
    cinfer_model *m = load("stories260k");
    const cinfer_tokenizer *t = m ? cinfer_model_tokenizer(m) : NULL;
    cinfer_data_opts o = cinfer_data_defaults();
    int32_t *rows = NULL;
    int n = 0;
    char err[512], p1[64], p2[64], p3[64];
    snprintf(p1, sizeof p1, "/tmp/cinfer-score-%d-empty.txt", (int)getpid());
    snprintf(p2, sizeof p2, "/tmp/cinfer-score-%d-short.jsonl", (int)getpid());
    snprintf(p3, sizeof p3, "/tmp/cinfer-score-%d-bad.jsonl", (int)getpid());
    write_file(p1, "");
    write_file(p2, "{\"text\": \"Once upon a time.\"}\n");
    write_file(p3, "{\"text\": \"one\"}\n\n{\"text\": \"two\" \n{\"text\": \"three\"}\n");
    err[0] = 0;
    cinfer_status st = cinfer_load_rows(t, -1, p1, &o, &rows, &n, err, sizeof err);
    CHECK(st && !rows && strstr(err, "empty"), "empty data file: error '%s'", err);
    err[0] = 0;
    st = cinfer_load_rows(t, -1, p2, &o, &rows, &n, err, sizeof err);
    CHECK(st && !rows && strstr(err, "fewer than one row"), "data shorter than one row: error '%s'", err);
    err[0] = 0;
    o.shuffle = CINFER_SHUFFLE_NONE;
    o.seq_len = 2;
    st = cinfer_load_rows(t, -1, p3, &o, &rows, &n, err, sizeof err);
    char want[80];
    snprintf(want, sizeof want, "%s:3:", p3);
    CHECK(st && !rows && strstr(err, want), "malformed JSONL: the error names line 3: '%s'", err);
    o = cinfer_data_defaults();
    o.num_samples = 0;
    err[0] = 0;
    st = cinfer_load_rows(t, -1, p2, &o, &rows, &n, err, sizeof err);
    CHECK(st && !rows, "--num-samples 0 refused: '%s'", err);
    unlink(p1);
    unlink(p2);
    unlink(p3);

    /* different vocabularies */
    cinfer_model *a = load("llama-f32"), *b = load("mistral-f32");
    cinfer_ctx *ca = ctx_of(a), *cb = ctx_of(b);
    int32_t ids[8] = {1, 5, 6, 7, 8, 9, 10, 11};
    cinfer_kl_stats s;
    err[0] = 0;
    st = ca && cb ? cinfer_kl(cb, ca, NULL, ids, 1, 8, 1, NULL, NULL, NULL, &s, err, sizeof err) : CINFER_EIO;
    CHECK(st == CINFER_EINVAL && strstr(err, "different vocabularies"), "KL of models with different vocabularies: '%s'", err);
    /* a base file from one vocab, a model of another; a truncated file */
    char path[64];
    snprintf(path, sizeof path, "/tmp/cinfer-score-%d.klb", (int)getpid());
    cinfer_kl_base *f = NULL;
    st = cinfer_kl_save_base(ca, ids, 1, 8, 1, path, NULL, NULL, err, sizeof err) || cinfer_kl_base_open(path, &f, err, sizeof err);
    err[0] = 0;
    if (!st) st = cinfer_kl(cb, NULL, f, NULL, 0, 0, 1, NULL, NULL, NULL, &s, err, sizeof err);
    CHECK(st == CINFER_EINVAL && strstr(err, "different vocabularies"), "KL against a base file of another vocabulary: '%s'", err);
    cinfer_kl_base_free(f);
    f = NULL;
    /* every header byte flipped: refused or still consistent, never a crash (ASan run) */
    FILE *fp = fopen(path, "rb");
    unsigned char *img = NULL;
    long fsz = 0;
    if (fp && !fseek(fp, 0, SEEK_END) && (fsz = ftell(fp)) > 0 && !fseek(fp, 0, SEEK_SET) && (img = malloc(fsz)) &&
        fread(img, 1, fsz, fp) != (size_t)fsz) fsz = 0;
    if (fp) fclose(fp);
    int flips = 0, crashes = 0;
    for (long i = 0; img && fsz > 64 && i < 64; i++) {
        img[i] ^= 0x5a;
        fp = fopen(path, "wb");
        if (fp) { fwrite(img, 1, fsz, fp); fclose(fp); }
        cinfer_kl_base *g = NULL;
        if (!cinfer_kl_base_open(path, &g, err, sizeof err)) {
            int nr, L2, V2;
            cinfer_kl_base_rows(g, &nr, &L2, &V2);
            if (V2 == 256 && !cinfer_kl(ca, NULL, g, NULL, 0, 0, 1, NULL, NULL, NULL, &s, err, sizeof err) && !(s.tokens > 0)) crashes++;
        } else flips++;
        cinfer_kl_base_free(g);
        img[i] ^= 0x5a;
    }
    CHECK(flips == 64 && !crashes, "base file with a corrupted header byte: %d of 64 refused, the rest read consistently", flips);
    fp = fopen(path, "wb");
    if (fp && img) fwrite(img, 1, fsz, fp);
    if (fp) fclose(fp);
    free(img);
    if (truncate(path, 200) == 0) {
        err[0] = 0;
        st = cinfer_kl_base_open(path, &f, err, sizeof err);
        CHECK(st == CINFER_EFORMAT && !f, "truncated base file refused: '%s'", err);
    }
    write_file(path, "not a base file at all, just some text that is long enough to hold a header....");
    err[0] = 0;
    st = cinfer_kl_base_open(path, &f, err, sizeof err);
    CHECK(st == CINFER_EFORMAT && !f, "foreign file refused as a base file: '%s'", err);
    unlink(path);
    /* token out of range, empty prompt */
    int32_t badids[4] = {1, 2, 999, 3};
    cinfer_ppl_result r;
    err[0] = 0;
    st = ca ? cinfer_perplexity(ca, badids, 1, 4, 1, NULL, NULL, NULL, &r, err, sizeof err) : CINFER_EIO;
    CHECK(st == CINFER_EINVAL && strstr(err, "outside the vocabulary"), "token id outside the vocabulary: '%s'", err);
    cinfer_lp_seq q = {ids, 0, ids, 3};
    double sum;
    err[0] = 0;
    st = ca ? cinfer_response_logprobs(ca, &q, 1, 1, &sum, NULL, NULL, NULL, err, sizeof err) : CINFER_EIO;
    CHECK(st == CINFER_EINVAL, "logprobs with an empty prompt refused: '%s'", err);
    cinfer_ctx_free(ca);
    cinfer_ctx_free(cb);
    cinfer_model_free(a);
    cinfer_model_free(b);
    cinfer_model_free(m);
}

/* kl's percentiles (a histogram finds the ranks' buckets, only those are sorted) against qsort and
 * llama.cpp's rule, on values that fill one bucket, repeat, straddle zero and include -0 */
static int cmp_d(const void *x, const void *y) {
    double a = *(const double *)x, b = *(const double *)y;
    return (a > b) - (a < b);
}
static void test_percentiles(void) {
    static const double f[13] = {1, .999, .99, .95, .90, .75, .5, .25, .10, .05, .01, .001, 0};
    const int64_t sizes[] = {1, 2, 3, 7, 1000, 262144};
    uint64_t x = 88172645463325252ull;
    for (int kind = 0; kind < 5; kind++)
        for (int si = 0; si < 6; si++) {
            int64_t n = sizes[si];
            float *v = malloc(sizeof *v * (size_t)n);
            double *d = malloc(sizeof *d * (size_t)n), got[13], want[13];
            for (int64_t i = 0; i < n; i++) {
                x ^= x << 13, x ^= x >> 7, x ^= x << 17;
                double u = (double)(x >> 11) / 9007199254740992.0;
                v[i] = kind == 0 ? (float)(-log(u + 1e-300) * 1e-3)              /* kld-like: exponential */
                     : kind == 1 ? (float)(u - 0.5)                              /* straddles zero */
                     : kind == 2 ? 1.0f + (float)(x % 100) * 1e-6f               /* one bucket, repeats */
                     : kind == 3 ? 0.25f                                         /* all equal */
                     : (x & 1 ? -0.0f : 0.0f) + (x % 3 == 0 ? (float)u : 0.0f); /* zeros of both signs */
                d[i] = v[i];
            }
            qsort(d, (size_t)n, sizeof *d, cmp_d);
            for (int i = 0; i < 13; i++) {
                double p = f[i] * (double)(n - 1);
                int64_t ip = (int64_t)p, iq = ip + 1 < n ? ip + 1 : n - 1;
                want[i] = f[i] <= 0 ? d[0] : f[i] >= 1 ? d[n - 1] : (1 - (p - ip)) * d[ip] + (p - ip) * d[iq];
            }
            kl_percentiles(v, n, f, 13, got);
            int bad = 0;
            for (int i = 0; i < 13; i++) bad += got[i] != want[i];
            CHECK(!bad, "percentiles, values of kind %d, n %lld: equal to a sort's (median %.9g vs %.9g)", kind, (long long)n,
                  got[6], want[6]);
            free(v);
            free(d);
        }
}

int main(void) {
    test_percentiles();
    json_error_t je;
    json_t *ref = json_load_file(REF, 0, &je);
    CHECK(ref != NULL, "load %s (%s)", REF, ref ? "ok" : je.text);
    if (!ref) return CHECK_DONE();
    test_shuffles(ref);
    test_data(ref);
    test_chat_data();
    test_perplexity(ref);
    test_kl(ref);
    test_logprobs(ref);
    /* again in chunks of 3 positions: every row continues its cache at pos0 = 3, 6, ... in a batch,
     * the path long rows take (the natural width covers the fixtures' rows in one chunk) */
    setenv("CINFER_SCORE_CHUNK", "3", 1);
    mode = ", 3-position chunks";
    test_perplexity(ref);
    test_kl(ref);
    test_logprobs(ref);
    unsetenv("CINFER_SCORE_CHUNK");
    mode = "";
    test_bad_input();
    json_decref(ref);
    return CHECK_DONE();
}
