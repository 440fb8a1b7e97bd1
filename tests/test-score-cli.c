/*
 * test-score-cli.c — the scoring commands end to end: `cinfer perplexity`,
 * `kl` and `logprobs` from the same build folder as this test (argv[0]'s
 * ../cinfer), checked for their JSON fields, agreement with the library's
 * numbers and with PyTorch (perplexity for several --seed / --shuffle /
 * --sequence-length / --num-samples / --batch-size choices, kl --per-token;
 * --shuffle mulberry32 in mlx-bun's order),
 * the save-base / base-logprobs round trip, and clear errors with
 * exit status 1 or 2 (never a crash) on bad input.
 */
#include <jansson.h>
#include "check.h"
#include "cinfer.h"
#include "cli-run.h"

static void write_file(const char *path, const char *text) {
    FILE *f = fopen(path, "w");
    if (f) { fputs(text, f); fclose(f); }
}

static double rel(double a, double b) { return fabs(a - b) / fmax(fabs(b), 1e-12); }

/* `perplexity --json` with --sequence-length / --num-samples / --seed / --shuffle / --batch-size against
 * PyTorch on the rows mlx_lm's load_data cuts with the same choices (make_data_fixtures.py ->
 * cli-reference.json). Achieved: perplexity, standard error and mean loss within 1.4e-7 relative on an AVX2
 * host, 6.0e-7 on an AVX-512 Zen 4 host (OpenBLAS's COOPERLAKE sgemm sums the prefill's f32 products in
 * another order: the f32 logits differ by their rounding, the base commit measured the same there), so
 * the bar is 1e-6: a wrong row, token or position moves these by 1e-3 or more. */
#define CLI_PPL_TOL 1e-6
static void test_ppl_reference(const char *model, const char *data, char *out, char *er, size_t cap) {
    json_t *ref = json_load_file("tests/fixtures/score/cli-reference.json", 0, NULL), *c;
    size_t k;
    const int batch[] = {4, 1, 3, 8};
    CHECK(json_array_size(json_object_get(ref, "perplexity")) == 4, "cli-reference.json holds 4 perplexity cases");
    json_array_foreach(json_object_get(ref, "perplexity"), k, c) {
        char args[1024];
        int L = (int)json_integer_value(json_object_get(c, "seq_len")), num = (int)json_integer_value(json_object_get(c, "num_samples"));
        int seed = (int)json_integer_value(json_object_get(c, "seed"));
        const char *shuf = json_string_value(json_object_get(c, "shuffle"));
        snprintf(args, sizeof args, "perplexity -m %s --data %s --sequence-length %d --num-samples %d --seed %d --shuffle %s "
                 "--batch-size %d --json", model, data, L, num, seed, shuf, batch[k % 4]);
        int rc = run(args, out, er, cap);
        json_t *j = json_loads(out, 0, NULL);
        double p = json_number_value(json_object_get(j, "perplexity")), se = json_number_value(json_object_get(j, "standard_error"));
        double ml = json_number_value(json_object_get(j, "mean_loss"));
        double want = json_number_value(json_object_get(c, "perplexity"));
        int rows = (int)json_array_size(json_object_get(c, "rows"));
        double e = fmax(rel(p, want), fmax(rel(se, json_number_value(json_object_get(c, "standard_error"))),
                                          rel(ml, json_number_value(json_object_get(c, "mean_loss")))));
        CHECK(rc == 0 && j && e <= CLI_PPL_TOL && json_integer_value(json_object_get(j, "rows")) == rows &&
              json_integer_value(json_object_get(j, "tokens")) == json_integer_value(json_object_get(c, "tokens")),
              "perplexity --sequence-length %d --num-samples %d --seed %d --shuffle %s --batch-size %d: %.6f == PyTorch %.6f "
              "on mlx_lm's rows (%d rows; max rel error %.1e) %s", L, num, seed, shuf, batch[k % 4], p, want, rows, e, er);
        json_decref(j);
    }
    json_decref(ref);
}

/* `kl --per-token FILE` rows against PyTorch's per-position KLD for the same rows (reference.json "kl"[0]:
 * stories260k vs its 4-bit fake-quantized copy on mlx_lm's first 4 rows of 64). Error relative to
 * max(1, KLD): achieved 1.0e-5 (the per-token KLD is a float32 sum whose terms cancel). */
#define CLI_KLD_TOL 3e-5
static void test_kl_per_token(const char *base, const char *model, const char *data, char *out, char *er, size_t cap) {
    json_t *ref = json_load_file("tests/fixtures/score/reference.json", 0, NULL);
    json_t *c = json_array_get(json_object_get(ref, "kl"), 0), *kld = json_object_get(c, "kld"), *rows = json_object_get(c, "rows");
    char args[1024], tsv[64], line[256];
    snprintf(tsv, sizeof tsv, "/tmp/cinfer-cli-%d.tsv", (int)getpid());
    snprintf(args, sizeof args, "kl --base %s --model %s --data %s --sequence-length 64 --num-samples 4 --per-token %s",
             base, model, data, tsv);
    int rc = run(args, out, er, cap), n = 0, bad = 0;
    double e = 0;
    FILE *f = fopen(tsv, "r");
    int head = f && fgets(line, sizeof line, f) && !strncmp(line, "row\tpos\ttoken\tkld\t", 18);
    while (f && fgets(line, sizeof line, f)) {
        int r, pos, tok, same;
        double kl, nm, nb, dp;
        if (sscanf(line, "%d\t%d\t%d\t%lf\t%lf\t%lf\t%lf\t%d", &r, &pos, &tok, &kl, &nm, &nb, &dp, &same) != 8 ||
            r != n / 63 || pos != n % 63 || tok != json_integer_value(json_array_get(json_array_get(rows, r), pos + 1))) bad++;
        else e = fmax(e, fabs(kl - json_number_value(json_array_get(kld, n))) / fmax(1, fabs(json_number_value(json_array_get(kld, n)))));
        n++;
    }
    if (f) fclose(f);
    unlink(tsv);
    CHECK(rc == 0 && head && n == 4 * 63 && (size_t)n == json_array_size(kld) && !bad && e <= CLI_KLD_TOL,
          "kl --per-token: %d TSV rows (row, pos, next token) with each position's KLD == PyTorch (max error %.1e, "
          "%d bad lines) %s", n, e, bad, er);
    json_decref(ref);
}

/* perplexity --shuffle mulberry32 --seed 123: samples visited in mlx-bun's order (mulberry32.json's
 * permutation for n 5, seed 123, written by node running mlx-bun), through {"tokens"} samples so that the
 * rows follow from the permutation alone; the CLI's perplexity == the library's on those rows */
static void test_mulberry_cli(const char *model, char *out, char *er, size_t cap) {
    json_t *mb = json_load_file("tests/fixtures/score/mulberry32.json", 0, NULL), *c, *perm = NULL;
    size_t k;
    json_array_foreach(json_object_get(mb, "cases"), k, c)
        if (json_integer_value(json_object_get(c, "n")) == 5 && json_integer_value(json_object_get(c, "seed")) == 123)
            perm = json_object_get(c, "perm");
    const int lens[5] = {3, 5, 2, 6, 4};
    int32_t smp[5][6], rows[20];
    char path[64], args[1024];
    snprintf(path, sizeof path, "/tmp/cinfer-cli-%d-mb.jsonl", (int)getpid());
    FILE *f = fopen(path, "w");
    for (int i = 0; i < 5; i++) {
        if (f) fprintf(f, "{\"tokens\": [");
        for (int j = 0; j < lens[i]; j++) {
            smp[i][j] = 3 + 7 * i + j;
            if (f) fprintf(f, "%s%d", j ? ", " : "", smp[i][j]);
        }
        if (f) fprintf(f, "]}\n");
    }
    if (f) fclose(f);
    int n = 0;
    for (int i = 0; perm && i < 5; i++) {
        int s = (int)json_integer_value(json_array_get(perm, i));
        for (int j = 0; j < lens[s]; j++) rows[n++] = smp[s][j];
    }
    cinfer_model *m = NULL;
    cinfer_ctx *x = NULL;
    cinfer_ppl_result r;
    char err[256];
    int ok = perm && n == 20 && !cinfer_model_load(model, NULL, &m, err, sizeof err) && !cinfer_ctx_new(m, NULL, &x, err, sizeof err) &&
             !cinfer_perplexity(x, rows, 5, 4, 1, NULL, NULL, NULL, &r, err, sizeof err);
    snprintf(args, sizeof args, "perplexity -m %s --data %s --sequence-length 4 --num-samples -1 --shuffle mulberry32 --seed 123 "
             "--batch-size 2 --json", model, path);
    int rc = run(args, out, er, cap);
    json_t *j = json_loads(out, 0, NULL);
    double p = json_number_value(json_object_get(j, "perplexity"));
    CHECK(ok && rc == 0 && json_integer_value(json_object_get(j, "rows")) == 5 && rel(p, r.perplexity) <= 1e-6,
          "perplexity --shuffle mulberry32 --seed 123: rows in mlx-bun's sample order (perplexity %.6f, on those rows %.6f) %s",
          p, ok ? r.perplexity : 0, er);
    json_decref(j);
    cinfer_ctx_free(x);
    cinfer_model_free(m);
    unlink(path);
    json_decref(mb);
}

int main(int argc, char **argv) {
    (void)argc;
    if (!cli_find(argv[0])) { CHECK(0, "the CLI %s exists (build it: make all)", cli); return CHECK_DONE(); }
    static char out[1 << 16], er[1 << 16];
    char args[1024], s260[300];
    snprintf(s260, sizeof s260, "%s/models/stories260k", shared_dir());
    const char *data = "tests/fixtures/score/data.jsonl";

    /* perplexity --json == the library on the same rows */
    snprintf(args, sizeof args, "perplexity -m %s --data %s --sequence-length 64 --num-samples 6 --batch-size 4 --json -t 1", s260, data);
    int rc = run(args, out, er, sizeof out);
    json_t *j = json_loads(out, 0, NULL);
    CHECK(rc == 0 && j && json_object_get(j, "perplexity") && json_object_get(j, "standard_error") && json_object_get(j, "mean_loss") &&
          json_integer_value(json_object_get(j, "tokens")) == 6 * 63 && json_integer_value(json_object_get(j, "rows")) == 6,
          "perplexity --json: perplexity, standard_error, mean_loss, tokens 378, rows 6 (rc %d) %s", rc, er);
    cinfer_model *m = NULL;
    char err[512];
    cinfer_ctx *c = NULL;
    int32_t *rows = NULL;
    int nr = 0;
    cinfer_data_opts o = cinfer_data_defaults();
    o.seq_len = 64;
    o.num_samples = 6;
    cinfer_ppl_result r;
    int ok = !cinfer_model_load(s260, NULL, &m, err, sizeof err) && !cinfer_ctx_new(m, NULL, &c, err, sizeof err) &&
             !cinfer_load_rows(cinfer_model_tokenizer(m), -1, data, &o, &rows, &nr, err, sizeof err) &&
             !cinfer_perplexity(c, rows, nr, 64, 4, NULL, NULL, NULL, &r, err, sizeof err);
    CHECK(ok && j && fabs(json_number_value(json_object_get(j, "perplexity")) / r.perplexity - 1) < 1e-6,
          "perplexity CLI == library (%.6f vs %.6f)", j ? json_number_value(json_object_get(j, "perplexity")) : 0, ok ? r.perplexity : 0);
    json_decref(j);
    free(rows);
    cinfer_ctx_free(c);
    cinfer_model_free(m);
    test_ppl_reference(s260, data, out, er, sizeof out);
    test_mulberry_cli(s260, out, er, sizeof out);
    snprintf(args, sizeof args, "perplexity -m %s --data %s --sequence-length 64 --num-samples 2", s260, data);
    rc = run(args, out, er, sizeof out);
    CHECK(rc == 0 && strstr(out, "Perplexity: ") && strstr(out, "\xc2\xb1") && strstr(out, "Tokens per second") && strstr(out, "Peak memory"),
          "perplexity text: 'Perplexity: X \xc2\xb1 SE', tokens/s, peak memory");

    /* kl: live base, then --save-base / --base-logprobs give the same report */
    char klb[64], fq[] = "tests/fixtures/score/stories260k-fq";
    snprintf(klb, sizeof klb, "/tmp/cinfer-cli-%d.klb", (int)getpid());
    snprintf(args, sizeof args, "kl --base %s --model %s --data %s --sequence-length 64 --num-samples 6 --json", s260, fq, data);
    rc = run(args, out, er, sizeof out);
    json_t *a = json_loads(out, 0, NULL);
    CHECK(rc == 0 && a && json_object_get(a, "mean_kld") && json_object_get(a, "same_top") && json_object_get(a, "ppl_base") &&
          json_object_get(a, "ppl_model") && json_integer_value(json_object_get(a, "tokens")) == 6 * 63,
          "kl --json: mean_kld, same_top, ppl_base, ppl_model, tokens (rc %d) %s", rc, er);
    snprintf(args, sizeof args, "kl --base %s --data %s --sequence-length 64 --num-samples 6 --save-base %s", s260, data, klb);
    int rc1 = run(args, out, er, sizeof out);
    snprintf(args, sizeof args, "kl --model %s --base-logprobs %s --json", fq, klb);
    rc = run(args, out, er, sizeof out);
    json_t *b = json_loads(out, 0, NULL);
    double dk = a && b ? fabs(json_number_value(json_object_get(a, "mean_kld")) - json_number_value(json_object_get(b, "mean_kld"))) : 1;
    CHECK(rc1 == 0 && rc == 0 && b && dk <= 1.22e-4 &&
          json_number_value(json_object_get(a, "same_top")) == json_number_value(json_object_get(b, "same_top")),
          "kl --save-base then --base-logprobs == both models in memory (|mean KLD diff| %.1e)", dk);
    json_decref(a);
    json_decref(b);
    test_kl_per_token(s260, fq, data, out, er, sizeof out);
    snprintf(args, sizeof args, "kl --model %s --base-logprobs %s", fq, klb);
    rc = run(args, out, er, sizeof out);
    CHECK(rc == 0 && strstr(out, "Mean    KLD") && strstr(out, "Same top p") && strstr(out, "Mean PPL(Q)/PPL(base)") && strstr(out, "RMS \xce\x94p"),
          "kl text report: KLD, PPL ratio, RMS dp, same top");
    snprintf(args, sizeof args, "kl --model tests/fixtures/models/llama-f32 --base-logprobs %s", klb);
    rc = run(args, out, er, sizeof out);
    CHECK(rc == 1 && strstr(er, "different vocabularies"), "kl with another vocabulary: exit 1, '%.100s'", er);
    snprintf(args, sizeof args, "kl --base %s --model tests/fixtures/models/llama-f32 --data %s", s260, data);
    rc = run(args, out, er, sizeof out);
    CHECK(rc == 1 && strstr(er, "different vocabularies"), "kl of two models with different vocabularies: exit 1");
    unlink(klb);

    /* logprobs */
    char pj[64];
    snprintf(pj, sizeof pj, "/tmp/cinfer-cli-%d.jsonl", (int)getpid());
    write_file(pj, "{\"prompt\": \"Once upon a time\", \"response\": \" there was a girl.\"}\n"
                   "{\"prompt\": \"Lily and Ben\", \"chosen\": \" were friends.\", \"rejected\": \" zq xv.\"}\n");
    snprintf(args, sizeof args, "logprobs -m %s --data %s --json", s260, pj);
    rc = run(args, out, er, sizeof out);
    char *nl = strchr(out, '\n');
    if (nl) *nl = 0;
    json_t *l1 = json_loads(out, 0, NULL), *l2 = nl ? json_loads(nl + 1, JSON_DISABLE_EOF_CHECK, NULL) : NULL;
    double mg = l2 ? json_number_value(json_object_get(l2, "margin")) : 0;
    CHECK(rc == 0 && l1 && json_number_value(json_object_get(l1, "logprob")) < 0 && json_integer_value(json_object_get(l1, "tokens")) > 0 &&
          l2 && fabs(mg - (json_number_value(json_object_get(l2, "chosen_logprob")) - json_number_value(json_object_get(l2, "rejected_logprob")))) < 1e-6,
          "logprobs --json: response logprob and tokens; DPO pair margin = chosen - rejected (%.3f)", mg);
    json_decref(l1);
    json_decref(l2);
    /* --cache-dir: the same lines, the second run restoring every prompt (the DPO pair shares one already in the
     * first); the scores as without it within the batch tolerance of test-score, and equal between the two runs */
    static char o1[1 << 14], o2[1 << 14];
    char cd[64];
    snprintf(cd, sizeof cd, "/tmp/cinfer-cli-%d.tier", (int)getpid());
    snprintf(args, sizeof args, "logprobs -m %s --data %s --json --cache-dir %s", s260, pj, cd);
    int r1 = run(args, o1, er, sizeof o1);
    int hit1 = !!strstr(er, "restored");
    int r2 = run(args, o2, er, sizeof o2);
    char *e2 = strstr(er, "--cache-dir: ");
    long got = -1, of = -1;
    if (e2) sscanf(e2, "--cache-dir: %ld of %ld", &got, &of);
    json_t *t1 = json_loads(o1, JSON_DISABLE_EOF_CHECK, NULL), *t0 = json_loads(out, 0, NULL);   /* out: line 1 without it */
    double dt = t1 && t0 ? fabs(json_number_value(json_object_get(t1, "logprob")) - json_number_value(json_object_get(t0, "logprob"))) : 1;
    json_decref(t1);
    json_decref(t0);
    CHECK(r1 == 0 && r2 == 0 && hit1 && !strcmp(o1, o2) && got > 0 && got == of && dt <= 1e-5 * 20,
          "logprobs --cache-dir: the second run restores %ld of %ld prompt tokens, prints what the first printed, and "
          "the first line's logprob is the one without --cache-dir (|diff| %.1e)", got, of, dt);
    snprintf(args, sizeof args, "rm -rf %s", cd);
    if (system(args)) printf("# could not remove %s\n", cd);
    snprintf(args, sizeof args, "perplexity -m %s --data %s --cache-dir %s", s260, pj, cd);
    rc = run(args, o1, er, sizeof o1);
    CHECK(rc == 2 && strstr(er, "every position"), "perplexity --cache-dir: refused, saying why (%.100s)", er);

    /* bad input: exit 1 or 2 with a message, never a crash */
    write_file(pj, "");
    snprintf(args, sizeof args, "perplexity -m %s --data %s", s260, pj);
    rc = run(args, out, er, sizeof out);
    CHECK(rc == 1 && strstr(er, "empty"), "perplexity on an empty file: exit 1, '%.100s'", er);
    write_file(pj, "{\"text\": \"a\"}\n{\"text\": oops}\n");
    rc = run(args, out, er, sizeof out);
    CHECK(rc == 1 && strstr(er, ":2:"), "perplexity on malformed JSONL names line 2: '%.120s'", er);
    snprintf(args, sizeof args, "logprobs -m %s --data %s", s260, pj);
    rc = run(args, out, er, sizeof out);
    CHECK(rc == 1 && strstr(er, ":1:"), "logprobs on a line without prompt names line 1: '%.120s'", er);
    write_file(pj, "{\"text\": \"Once upon a time.\"}\n");
    snprintf(args, sizeof args, "perplexity -m %s --data %s", s260, pj);
    rc = run(args, out, er, sizeof out);
    CHECK(rc == 1 && strstr(er, "fewer than one row"), "perplexity on data shorter than a row: exit 1, '%.100s'", er);
    snprintf(args, sizeof args, "perplexity -m %s --data %s --num-samples -1 --sequence-length 2 --json", s260, pj);
    rc = run(args, out, er, sizeof out);
    CHECK(rc == 0 && strstr(out, "\"rows\": 3"), "--num-samples -1: every full row (7 tokens, 3 rows of 2: %.60s)", out);
    snprintf(args, sizeof args, "perplexity -m %s --data %s --num-samples 0", s260, pj);
    rc = run(args, out, er, sizeof out);
    CHECK(rc == 2, "--num-samples 0: usage error (exit %d)", rc);
    unlink(pj);
    return CHECK_DONE();
}
