/*
 * cmd-kl.c — `cinfer kl`: KL divergence of a model against a base model
 * over the rows perplexity would score, reported as llama.cpp's
 * `llama-perplexity --kl-divergence` does. The base is a second model in
 * memory (--base) or a file of its log-probs (--base-logprobs, written by
 * --save-base); see cinfer.h for the file's compression error.
 */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "cli.h"
#include "util.h"

/* shared with cmd-perplexity.c */
typedef struct score_progress { int on; double t0; const char *what; } score_progress;
int score_cli_progress(int64_t done, int64_t total, void *user);
void score_cli_progress_init(score_progress *p, int mode, const char *what);
int score_cli_data_flag(const char *cmd, int code, const char *v, cinfer_data_opts *o);
int score_cli_load_rows(const cinfer_tokenizer *t, const char *data, const cinfer_data_opts *o, int32_t **rows,
                        int *n_rows, char *err, size_t en);
enum { DF_SEQ = 1000, DF_NUM, DF_SEED, DF_SHUF };

static void kl_help(FILE *f) {
    fprintf(f,
        "usage: cinfer kl --base DIR --model DIR2 --data FILE [options]\n"
        "       cinfer kl --base DIR --data FILE --save-base FILE [--model DIR2]\n"
        "                                           (base log-probs to FILE; with --model, then pass 2)\n"
        "       cinfer kl --model DIR2 --base-logprobs FILE [options]  (pass 2)\n\n"
        "KL divergence of MODEL against BASE at every position of the rows perplexity\n"
        "scores, with llama.cpp's statistics (mean KLD, percentiles, PPL ratio, delta-p,\n"
        "same top).\n\n"
        "      --base DIR           base model directory\n"
        "      --model DIR          model to compare (-m too)\n"
        "      --data FILE          data as for `cinfer perplexity` (tokenized by the base's\n"
        "                           tokenizer, or the model's when only it is loaded)\n"
        "      --sequence-length N, --num-samples N, --seed N, --shuffle KIND   as perplexity\n"
        "      --batch-size N       rows per forward (default 8)\n"
        "      --save-base FILE     write the base's log-probs (16-bit codes of the full\n"
        "                           vocabulary, exact next-token nll and argmax); with --model\n"
        "                           the base is then freed and the model scored from FILE\n"
        "                           (log-prob error <= 16/65535/2 = 1.22e-4 nats per entry;\n"
        "                           PPL(base), delta-p and same top are exact)\n"
        "      --base-logprobs FILE read them instead of running a base model (rows too)\n"
        "      --per-token FILE     TSV: row, pos, token, kld, nll_model, nll_base, dp, same_top\n"
        "      --json               one JSON object on stdout\n"
        "      --progress / --no-progress\n"
        "  -t, --threads N, --device cpu|cuda\n"
        CLI_KV_HELP
        "  -h, --help\n");
}

static void print_report(const cinfer_kl_stats *s) {
    printf("====== Perplexity statistics ======\n");
    printf("Mean PPL(Q)                   : %10.6f \xc2\xb1 %10.6f\n", s->ppl_model, s->ppl_model_unc);
    printf("Mean PPL(base)                : %10.6f \xc2\xb1 %10.6f\n", s->ppl_base, s->ppl_base_unc);
    printf("Cor(ln(PPL(Q)), ln(PPL(base))): %6.2f%%\n", 100 * s->cor_ln_ppl);
    printf("Mean ln(PPL(Q)/PPL(base))     : %10.6f \xc2\xb1 %10.6f\n", s->ln_ratio, s->ln_ratio_unc);
    printf("Mean PPL(Q)/PPL(base)         : %10.6f \xc2\xb1 %10.6f\n", s->ratio, s->ratio_unc);
    printf("Mean PPL(Q)-PPL(base)         : %10.6f \xc2\xb1 %10.6f\n", s->diff, s->diff_unc);
    printf("\n====== KL divergence statistics ======\n");
    printf("Mean    KLD: %10.6f \xc2\xb1 %10.6f\n", s->mean_kld, s->kld_unc);
    static const char *kn[11] = {"Maximum KLD", "99.9%   KLD", "99.0%   KLD", "95.0%   KLD", "90.0%   KLD", "Median  KLD",
                                 "10.0%   KLD", " 5.0%   KLD", " 1.0%   KLD", " 0.1%   KLD", "Minimum KLD"};
    for (int i = 0; i < 11; i++) printf("%s: %10.6f\n", kn[i], s->kld_q[i]);
    printf("\n====== Token probability statistics ======\n");
    printf("Mean    \xce\x94p: %7.3f \xc2\xb1 %5.3f %%\n", 100 * s->mean_dp, 100 * s->dp_unc);
    static const char *dn[13] = {"Maximum", "99.9%  ", "99.0%  ", "95.0%  ", "90.0%  ", "75.0%  ", "Median ",
                                 "25.0%  ", "10.0%  ", " 5.0%  ", " 1.0%  ", " 0.1%  ", "Minimum"};
    for (int i = 0; i < 13; i++) printf("%s \xce\x94p: %7.3f%%\n", dn[i], 100 * s->dp_q[i]);
    printf("RMS \xce\x94p    : %7.3f \xc2\xb1 %5.3f %%\n", 100 * s->rms_dp, 100 * s->rms_dp_unc);
    printf("Same top p: %7.3f \xc2\xb1 %5.3f %%\n", 100 * s->same_top, 100 * s->same_top_unc);
    printf("Tokens    : %lld\n", (long long)s->tokens);
}

static void print_json(const cinfer_kl_stats *s, double secs, size_t mem) {
    cli_json_printf("{\"tokens\": %lld, \"mean_kld\": %.10g, \"kld_uncertainty\": %.10g, \"same_top\": %.10g, "
           "\"same_top_uncertainty\": %.10g, \"ppl_model\": %.10g, \"ppl_model_uncertainty\": %.10g, "
           "\"ppl_base\": %.10g, \"ppl_base_uncertainty\": %.10g, \"cor_ln_ppl\": %.10g, \"ln_ppl_ratio\": %.10g, "
           "\"ln_ppl_ratio_uncertainty\": %.10g, \"ppl_ratio\": %.10g, \"ppl_ratio_uncertainty\": %.10g, "
           "\"ppl_diff\": %.10g, \"ppl_diff_uncertainty\": %.10g, \"mean_dp\": %.10g, \"dp_uncertainty\": %.10g, "
           "\"rms_dp\": %.10g, \"rms_dp_uncertainty\": %.10g, \"seconds\": %.4f, \"peak_memory_gb\": %.4f",
           (long long)s->tokens, s->mean_kld, s->kld_unc, s->same_top, s->same_top_unc, s->ppl_model, s->ppl_model_unc,
           s->ppl_base, s->ppl_base_unc, s->cor_ln_ppl, s->ln_ratio, s->ln_ratio_unc, s->ratio, s->ratio_unc, s->diff,
           s->diff_unc, s->mean_dp, s->dp_unc, s->rms_dp, s->rms_dp_unc, secs, mem / 1e9);
    static const char *kq[11] = {"max", "99.9", "99", "95", "90", "median", "10", "5", "1", "0.1", "min"};
    static const char *dq[13] = {"max", "99.9", "99", "95", "90", "75", "median", "25", "10", "5", "1", "0.1", "min"};
    cli_json_printf(", \"kld_percentiles\": {");
    for (int i = 0; i < 11; i++) cli_json_printf("%s\"%s\": %.10g", i ? ", " : "", kq[i], s->kld_q[i]);
    cli_json_printf("}, \"dp_percentiles\": {");
    for (int i = 0; i < 13; i++) cli_json_printf("%s\"%s\": %.10g", i ? ", " : "", dq[i], s->dp_q[i]);
    cli_json_printf("}}\n");
}

/* the tokenizers of both models must agree piece by piece */
static int same_vocab(cinfer_model *a, cinfer_model *b, char *why, size_t n) {
    cinfer_model_info ia, ib;
    cinfer_model_get_info(a, &ia);
    cinfer_model_get_info(b, &ib);
    if (ia.n_vocab != ib.n_vocab) {
        snprintf(why, n, "the models have different vocabularies (base %d tokens, model %d): KL needs the same token ids", ia.n_vocab, ib.n_vocab);
        return 0;
    }
    const cinfer_tokenizer *ta = cinfer_model_tokenizer(a), *tb = cinfer_model_tokenizer(b);
    for (int i = 0; ta && tb && i < ia.n_vocab; i++) {
        const char *pa = cinfer_token_piece(ta, i), *pb = cinfer_token_piece(tb, i);
        if ((pa || pb) && (!pa || !pb || strcmp(pa, pb))) {
            snprintf(why, n, "the models have different vocabularies: token %d is '%s' in the base and '%s' in the model", i, pa ? pa : "", pb ? pb : "");
            return 0;
        }
    }
    return 1;
}

int cmd_kl(int argc, char **argv) {
    static const struct option lo[] = {
        {"base", 1, 0, 1}, {"model", 1, 0, 'm'}, {"data", 1, 0, 2}, {"data-path", 1, 0, 2}, {"sequence-length", 1, 0, DF_SEQ},
        {"num-samples", 1, 0, DF_NUM}, {"seed", 1, 0, DF_SEED}, {"shuffle", 1, 0, DF_SHUF}, {"batch-size", 1, 0, 3},
        {"save-base", 1, 0, 4}, {"base-logprobs", 1, 0, 5}, {"per-token", 1, 0, 6}, {"json", 0, 0, 7},
        {"progress", 0, 0, 8}, {"no-progress", 0, 0, 9}, {"threads", 1, 0, 't'}, {"device", 1, 0, 10},
        {"help", 0, 0, 'h'}, CLI_KV_LONGOPTS, CLI_TIER_LONGOPTS, {0, 0, 0, 0}};
    const char *base = NULL, *model = NULL, *data = NULL, *save = NULL, *blp = NULL, *ptf = NULL, *device = NULL;
    int batch = 8, json = 0, prog = -1, threads = 0, c;
    cinfer_data_opts o = cinfer_data_defaults();
    cinfer_ctx_opts co = {.quantized_kv_start = -1};   /* scoring: QuantizedKVCache from token 0 */
    if (!cli_getopt_begin("kl", argc, argv, "m:t:h", lo)) return 2;
    while ((c = getopt_long(argc, argv, "m:t:h", lo, NULL)) != -1) {
        int kv = cli_kv_flag("kl", c, optarg, &co);
        if (kv < 0) return 2;
        if (kv) continue;
        int d = score_cli_data_flag("kl", c, optarg, &o);
        if (d < 0) return 2;
        if (d) continue;
        switch (c) {
        case 1: base = optarg; break;
        case 'm': model = optarg; break;
        case 2: data = optarg; break;
        case 3: if (!cli_int("kl", "--batch-size", optarg, 1, 1 << 16, &batch)) return 2; break;
        case 4: save = optarg; break;
        case 5: blp = optarg; break;
        case 6: ptf = optarg; break;
        case 7: json = 1; break;
        case 8: prog = 1; break;
        case 9: prog = 0; break;
        case 't': if (!cli_int("kl", "--threads", optarg, 1, 1024, &threads)) return 2; break;
        case 10: device = optarg; break;
        case 'h': kl_help(stdout); return 0;
        default: fprintf(stderr, "cinfer kl: unknown or incomplete option '%s'\n", argv[optind - 1]); kl_help(stderr); return 2;
        }
    }
    if (!cli_no_more_args("kl", argc, argv) || !cli_scoring_kv("kl", &co)) return 2;
    const char *use = NULL;
    if (save && (!base || !data || blp)) use = "--save-base needs --base DIR and --data FILE (and no --base-logprobs)";
    else if (!save && !model) use = "need --model DIR (try --help)";
    else if (!save && !blp == !base) use = "need exactly one of --base DIR or --base-logprobs FILE";
    else if (!save && base && !data) use = "need --data FILE with --base";
    if (use) { fprintf(stderr, "cinfer kl: %s\n", use); return 2; }
    if (blp && data) fprintf(stderr, "cinfer kl: note: the rows come from %s; --data is ignored\n", blp);

    char err[1024];
    co.max_seqs = batch > 64 ? batch : 0;   /* one sequence per row of a batch */
    int rc = 0, n_rows = 0;
    int32_t *rows = NULL;
    cinfer_model *mb = NULL, *mm = NULL;
    cinfer_ctx *cb = NULL, *cm = NULL;
    cinfer_kl_base *file = NULL;
    if (base && !(mb = cli_load_model("kl", base, device, threads))) rc = 1;
    if (!rc && !save && !(mm = cli_load_model("kl", model, device, threads))) rc = 1;
    if (!rc && save && model) {   /* the model is loaded only after the base is gone: compare its vocabulary first */
        cinfer_model *probe = cli_load_model("kl", model, device, threads);
        if (!probe) rc = 1;
        else if (!same_vocab(mb, probe, err, sizeof err)) { fprintf(stderr, "cinfer kl: %s\n", err); rc = 1; }
        cinfer_model_free(probe);
    }
    if (!rc && mb && mm && !same_vocab(mb, mm, err, sizeof err)) { fprintf(stderr, "cinfer kl: %s\n", err); rc = 1; }
    if (!rc && blp && cinfer_kl_base_open(blp, &file, err, sizeof err)) { fprintf(stderr, "cinfer kl: %s\n", err); rc = 1; }
    if (!rc && data && !blp && score_cli_load_rows(cinfer_model_tokenizer(mb ? mb : mm), data, &o, &rows, &n_rows, err, sizeof err)) {
        fprintf(stderr, "cinfer kl: %s\n", err);
        rc = 1;
    }
    cinfer_ctx_opts cob = co;   /* the KV quantization flags apply to --model: the base runs unquantized */
    cob.kv_bits = 0;
    cob.kv_config = cob.kv_kernels = NULL;
    if (!rc && mb && cinfer_ctx_new(mb, &cob, &cb, err, sizeof err)) { fprintf(stderr, "cinfer kl: %s\n", err); rc = 1; }
    if (!rc && mm && cinfer_ctx_new(mm, &co, &cm, err, sizeof err)) { fprintf(stderr, "cinfer kl: %s\n", err); rc = 1; }
    score_progress p;
    score_cli_progress_init(&p, prog, save ? "base" : "kl");
    double t0 = cf_now();
    if (!rc && save) {
        if (cinfer_kl_save_base(cb, rows, n_rows, o.seq_len, batch, save, score_cli_progress, &p, err, sizeof err)) {
            fprintf(stderr, "cinfer kl: %s\n", err);
            rc = 1;
        } else {
            fprintf(stderr, "cinfer kl: wrote %s: %d rows x %d tokens, %lld positions\n", save, n_rows, o.seq_len,
                    (long long)n_rows * (o.seq_len - 1));
        }
        if (!rc && model) {   /* pass 2 in the same command: the base leaves memory first */
            cinfer_ctx_free(cb);
            cinfer_model_free(mb);
            cb = NULL;
            mb = NULL;
            free(rows);
            rows = NULL;
            if (!(mm = cli_load_model("kl", model, device, threads))) rc = 1;
            if (!rc && cinfer_kl_base_open(save, &file, err, sizeof err)) { fprintf(stderr, "cinfer kl: %s\n", err); rc = 1; }
            if (!rc && cinfer_ctx_new(mm, &co, &cm, err, sizeof err)) { fprintf(stderr, "cinfer kl: %s\n", err); rc = 1; }
            save = NULL;
        }
    }
    if (!rc && !save) {
        int L = file ? 0 : o.seq_len;
        if (file) cinfer_kl_base_rows(file, &n_rows, &L, NULL);
        cinfer_kl_token *pt = ptf ? malloc(sizeof *pt * (size_t)n_rows * (L - 1)) : NULL;
        cinfer_kl_stats s;
        if (ptf && !pt) { fprintf(stderr, "cinfer kl: out of memory\n"); rc = 1; }
        else if (cinfer_kl(cm, cb, file, rows, n_rows, L, batch, pt, score_cli_progress, &p, &s, err, sizeof err)) {
            fprintf(stderr, "cinfer kl: %s\n", err);
            rc = 1;
        }
        const int32_t *tk = file ? cinfer_kl_base_rows(file, NULL, NULL, NULL) : rows;
        if (!rc && pt) {
            FILE *f = fopen(ptf, "w");
            if (!f) { fprintf(stderr, "cinfer kl: cannot write %s\n", ptf); rc = 1; }
            else {
                fprintf(f, "row\tpos\ttoken\tkld\tnll_model\tnll_base\tdp\tsame_top\n");
                for (int r = 0; r < n_rows; r++)
                    for (int i = 0; i < L - 1; i++) {
                        const cinfer_kl_token *q = pt + (size_t)r * (L - 1) + i;
                        fprintf(f, "%d\t%d\t%d\t%.9g\t%.9g\t%.9g\t%.9g\t%d\n", r, i, tk[(size_t)r * L + i + 1], q->kld,
                                q->nll_model, q->nll_base, q->dp, q->same_top);
                    }
                if (fclose(f)) { fprintf(stderr, "cinfer kl: writing %s failed\n", ptf); rc = 1; }
            }
        }
        if (!rc) {
            if (json) print_json(&s, cf_now() - t0, (cm ? cinfer_ctx_memory_bytes(cm) : 0) + (cb ? cinfer_ctx_memory_bytes(cb) : 0));
            else print_report(&s);
        }
        free(pt);
    }
    free(rows);
    cinfer_kl_base_free(file);
    cinfer_ctx_free(cb);
    cinfer_ctx_free(cm);
    cinfer_model_free(mb);
    cinfer_model_free(mm);
    return rc;
}
