/*
 * cmd-perplexity.c — `cinfer perplexity`: mlx_lm.perplexity on a local data
 * file (rows cut by cinfer_load_rows, scored by cinfer_perplexity). Also
 * holds the helpers the other scoring commands (kl, logprobs) share: the
 * data flags and the stderr progress bar (declared where they are used).
 */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "cli.h"
#include "util.h"

/* the progress bar: shown when stderr is a terminal or forced */
typedef struct score_progress { int on; double t0; const char *what; } score_progress;

int score_cli_progress(int64_t done, int64_t total, void *user) {
    score_progress *p = user;
    if (!p || !p->on || total <= 0) return 0;
    double el = cf_now() - p->t0;
    int w = 30, k = (int)(w * done / total);
    fprintf(stderr, "\r%s [", p->what);
    for (int i = 0; i < w; i++) fputc(i < k ? '#' : '.', stderr);
    fprintf(stderr, "] %lld/%lld tokens, %.0f tok/s ", (long long)done, (long long)total, el > 0 ? done / el : 0.0);
    if (done >= total) fputc('\n', stderr);
    return 0;
}

void score_cli_progress_init(score_progress *p, int mode, const char *what) {
    p->on = mode < 0 ? isatty(2) : mode;
    p->t0 = cf_now();
    p->what = what;
}

/* one data flag (long option code -> value); 0 = not a data flag, -1 = bad value */
enum { DF_SEQ = 1000, DF_NUM, DF_SEED, DF_SHUF };
int score_cli_data_flag(const char *cmd, int code, const char *v, cinfer_data_opts *o) {
    int x = 1;
    switch (code) {
    case DF_SEQ: if (!cli_int(cmd, "--sequence-length", v, 2, 1 << 24, &o->seq_len)) return -1; return 1;
    case DF_NUM:
        if (!cli_int(cmd, "--num-samples", v, -1, 1 << 30, &x) || x == 0) {
            if (x == 0) fprintf(stderr, "cinfer %s: --num-samples 0: want a positive count or -1 (all rows)\n", cmd);
            return -1;
        }
        o->num_samples = x;
        return 1;
    case DF_SEED: {
        char *e;
        unsigned long long s = strtoull(v, &e, 10);
        if (!*v || *e || s > 0xffffffffull || v[0] == '-') { fprintf(stderr, "cinfer %s: bad value for --seed: '%s' (0 .. 2^32-1)\n", cmd, v); return -1; }
        o->seed = (uint32_t)s;
        return 1;
    }
    case CACHE_DIR: case CACHE_MAX_GB:   /* the persistent prefix tier serves logprobs, not these */
        fprintf(stderr, "cinfer %s: --cache-dir does not apply: %s scores every position of every row, and a stored\n"
                "prefix holds K/V, not the logits those positions need, so it could not save any computation\n"
                "(logprobs takes --cache-dir: its prompts are not scored)\n", cmd, cmd);
        return -1;
    case DF_SHUF:
        if (!strcmp(v, "numpy")) o->shuffle = CINFER_SHUFFLE_NUMPY;
        else if (!strcmp(v, "mulberry32")) o->shuffle = CINFER_SHUFFLE_MULBERRY32;
        else if (!strcmp(v, "none")) o->shuffle = CINFER_SHUFFLE_NONE;
        else { fprintf(stderr, "cinfer %s: --shuffle wants numpy, mulberry32 or none (got '%s')\n", cmd, v); return -1; }
        return 1;
    }
    return 0;
}

/* --data FILE, or "-" for standard input (JSONL when it starts with '{') */
int score_cli_load_rows(const cinfer_tokenizer *t, const char *data, const cinfer_data_opts *o, int32_t **rows,
                        int *n_rows, char *err, size_t en) {
    if (strcmp(data, "-")) return cinfer_load_rows(t, -1, data, o, rows, n_rows, err, en) != CINFER_OK;
    size_t len;
    const char *why;
    char *buf = cli_read_file("-", &len, &why);
    if (!buf) { snprintf(err, en, "cannot read standard input: %s", why); return 1; }
    const char *p = buf + strspn(buf, " \t\r\n");
    int st = cinfer_load_rows_mem(t, -1, "standard input", buf, len, *p == '{', o, rows, n_rows, err, en) != CINFER_OK;
    free(buf);
    return st;
}

static void ppl_help(FILE *f) {
    fprintf(f,
        "usage: cinfer perplexity -m DIR --data FILE [options]\n\n"
        "Perplexity as mlx_lm.perplexity computes it: the samples of FILE are visited in a\n"
        "seeded shuffle, concatenated and cut into non-overlapping rows; every position of\n"
        "every row is scored (float32 log-softmax). Prints perplexity +- standard error.\n\n"
        "  -m, --model DIR          model directory\n"
        "      --data FILE          .txt (one sample) or .jsonl: {\"text\"}, {\"messages\"} (chat\n"
        "                           template), {\"prompt\",\"completion\"} or {\"tokens\": [ids]};\n"
        "                           '-' reads standard input (alias --data-path, mlx_lm's name)\n"
        "      --sequence-length N  tokens per row (default 512)\n"
        "      --num-samples N      rows to score, -1 = all (default 256)\n"
        "      --batch-size N       rows per forward (default 8)\n"
        "      --seed N             shuffle seed (default 123)\n"
        "      --shuffle KIND       numpy (np.random.permutation, default) | mulberry32 (mlx-bun) | none\n"
        "      --json               one JSON object on stdout\n"
        "      --progress / --no-progress   progress bar on stderr (default: when a terminal)\n"
        "  -t, --threads N          CPU threads\n"
        "      --device cpu|cuda\n"
        CLI_KV_HELP
        "  -h, --help\n");
}

int cmd_perplexity(int argc, char **argv) {
    static const struct option lo[] = {
        {"model", 1, 0, 'm'}, {"data", 1, 0, 1}, {"data-path", 1, 0, 1}, {"sequence-length", 1, 0, DF_SEQ}, {"num-samples", 1, 0, DF_NUM},
        {"seed", 1, 0, DF_SEED}, {"shuffle", 1, 0, DF_SHUF}, {"batch-size", 1, 0, 2}, {"json", 0, 0, 3},
        {"progress", 0, 0, 4}, {"no-progress", 0, 0, 5}, {"threads", 1, 0, 't'}, {"device", 1, 0, 6},
        {"help", 0, 0, 'h'}, CLI_KV_LONGOPTS, CLI_TIER_LONGOPTS, {0, 0, 0, 0}};
    const char *model = NULL, *data = NULL, *device = NULL;
    int batch = 8, json = 0, prog = -1, threads = 0, c;
    cinfer_data_opts o = cinfer_data_defaults();
    cinfer_ctx_opts co = {.quantized_kv_start = -1};   /* scoring: QuantizedKVCache from token 0 */
    if (!cli_getopt_begin("perplexity", argc, argv, "m:t:h", lo)) return 2;
    while ((c = getopt_long(argc, argv, "m:t:h", lo, NULL)) != -1) {
        int kv = cli_kv_flag("perplexity", c, optarg, &co);
        if (kv < 0) return 2;
        if (kv) continue;
        int d = score_cli_data_flag("perplexity", c, optarg, &o);
        if (d < 0) return 2;
        if (d) continue;
        switch (c) {
        case 'm': model = optarg; break;
        case 1: data = optarg; break;
        case 2: if (!cli_int("perplexity", "--batch-size", optarg, 1, 1 << 16, &batch)) return 2; break;
        case 3: json = 1; break;
        case 4: prog = 1; break;
        case 5: prog = 0; break;
        case 't': if (!cli_int("perplexity", "--threads", optarg, 1, 1024, &threads)) return 2; break;
        case 6: device = optarg; break;
        case 'h': ppl_help(stdout); return 0;
        default: fprintf(stderr, "cinfer perplexity: unknown or incomplete option '%s'\n", argv[optind - 1]); ppl_help(stderr); return 2;
        }
    }
    if (!cli_no_more_args("perplexity", argc, argv) || !cli_scoring_kv("perplexity", &co)) return 2;
    if (!model || !data) { fprintf(stderr, "cinfer perplexity: need -m DIR and --data FILE (try --help)\n"); return 2; }
    cinfer_model *m = cli_load_model("perplexity", model, device, threads);
    if (!m) return 1;
    char err[1024];
    co.max_seqs = batch > 64 ? batch : 0;   /* one sequence per row of a batch */
    int32_t *rows = NULL;
    int n_rows = 0, rc = 0;
    cinfer_ctx *ctx = NULL;
    cinfer_model_info info;
    cinfer_model_get_info(m, &info);
    if (score_cli_load_rows(cinfer_model_tokenizer(m), data, &o, &rows, &n_rows, err, sizeof err)) {
        fprintf(stderr, "cinfer perplexity: %s\n", err);
        rc = 1;
    }
    if (!rc && cinfer_ctx_new(m, &co, &ctx, err, sizeof err)) { fprintf(stderr, "cinfer perplexity: %s\n", err); rc = 1; }
    cinfer_ppl_result r;
    score_progress p;
    score_cli_progress_init(&p, prog, "perplexity");
    if (!rc && cinfer_perplexity(ctx, rows, n_rows, o.seq_len, batch, NULL, score_cli_progress, &p, &r, err, sizeof err)) {
        fprintf(stderr, "cinfer perplexity: %s\n", err);
        rc = 1;
    }
    if (!rc) {
        double tps = r.seconds > 0 ? r.tokens / r.seconds : 0, peak = cinfer_ctx_memory_bytes(ctx) / 1e9;
        if (json)
            cli_json_printf("{\"perplexity\": %.10g, \"standard_error\": %.10g, \"mean_loss\": %.10g, \"std_loss\": %.10g, "
                   "\"tokens\": %lld, \"rows\": %d, \"sequence_length\": %d, \"seconds\": %.4f, "
                   "\"tokens_per_second\": %.2f, \"peak_memory_gb\": %.4f}\n",
                   r.perplexity, r.standard_error, r.mean_loss, r.std_loss, (long long)r.tokens, r.rows, o.seq_len,
                   r.seconds, tps, peak);
        else
            printf("Perplexity: %.3f \xc2\xb1 %.3f\nRows: %d x %d tokens, %lld positions scored\n"
                   "Evaluation time: %.2f seconds\nTokens per second: %.0f\nPeak memory: %.3f GB\n",
                   r.perplexity, r.standard_error, r.rows, o.seq_len, (long long)r.tokens, r.seconds, tps, peak);
    }
    free(rows);
    cinfer_ctx_free(ctx);
    cinfer_model_free(m);
    return rc;
}
