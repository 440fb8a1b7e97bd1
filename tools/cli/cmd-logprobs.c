/*
 * cmd-logprobs.c — `cinfer logprobs`: summed log-likelihood of responses
 * given prompts (cinfer_response_logprobs), for {"prompt","response"} lines
 * or DPO-style {"prompt","chosen","rejected"} lines (then the margin
 * chosen - rejected). The prompt is encoded with the tokenizer's special
 * tokens (BOS), each response without them, and the two are joined as ids;
 * a field given as an array of ints is taken as ids.
 */
#include <getopt.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "cli.h"
#include "util.h"

typedef struct score_progress { int on; double t0; const char *what; } score_progress;
int score_cli_progress(int64_t done, int64_t total, void *user);
void score_cli_progress_init(score_progress *p, int mode, const char *what);

static void lp_help(FILE *f) {
    fprintf(f,
        "usage: cinfer logprobs -m DIR --data pairs.jsonl [options]\n\n"
        "Per line, the summed log-probability of the response tokens given the prompt\n"
        "and their count: {\"prompt\", \"response\"}, or {\"prompt\", \"chosen\", \"rejected\"}\n"
        "with the margin chosen - rejected. Strings are tokenized (prompt with BOS as\n"
        "configured, responses without special tokens); arrays of ints are token ids.\n\n"
        "  -m, --model DIR      model directory\n"
        "      --data FILE      .jsonl file\n"
        "      --batch-size N   sequences per forward (default 8)\n"
        "      --json           one JSON object per line on stdout\n"
        "      --progress / --no-progress\n"
        "  -t, --threads N, --device cpu|cuda\n"
        "      --cache-dir DIR  take each prompt's K/V from DIR's longest stored prefix and store\n"
        "                       new ones (prompts repeated across lines and runs are computed once;\n"
        "                       the scores are unchanged)\n"
        "      --cache-dir-max-gb G  evict least recently used entries past G GB\n"
        CLI_KV_HELP
        "  -h, --help\n");
}

/* a field as ids: array of ints, or a string tokenized */
static int field_ids(const cinfer_tokenizer *t, json_t *v, int special, int32_t **ids, int *n, const char *path, int ln,
                     const char *name) {
    if (json_is_array(v)) {
        size_t k, cnt = json_array_size(v);
        json_t *x;
        *ids = malloc(sizeof **ids * (cnt ? cnt : 1));
        if (!*ids) return 0;
        json_array_foreach(v, k, x) {
            if (!json_is_integer(x) || json_integer_value(x) < 0 || json_integer_value(x) > INT32_MAX) {
                fprintf(stderr, "cinfer logprobs: %s:%d: \"%s\" must be a string or an array of token ids\n", path, ln, name);
                return 0;
            }
            (*ids)[k] = (int32_t)json_integer_value(x);
        }
        *n = (int)cnt;
        return 1;
    }
    if (!json_is_string(v)) {
        fprintf(stderr, "cinfer logprobs: %s:%d: \"%s\" must be a string or an array of token ids\n", path, ln, name);
        return 0;
    }
    if (!t) { fprintf(stderr, "cinfer logprobs: %s:%d: text needs a tokenizer (the model has none)\n", path, ln); return 0; }
    const char *s = json_string_value(v);
    if (cinfer_tokenize(t, s, json_string_length(v), special, 1, ids, n)) {
        fprintf(stderr, "cinfer logprobs: %s:%d: tokenizing \"%s\" failed\n", path, ln, name);
        return 0;
    }
    return 1;
}

typedef struct { int line, pair; } lp_item;

int cmd_logprobs(int argc, char **argv) {
    static const struct option lo[] = {{"model", 1, 0, 'm'}, {"data", 1, 0, 1}, {"batch-size", 1, 0, 2},
                                       {"json", 0, 0, 3}, {"progress", 0, 0, 4}, {"no-progress", 0, 0, 5},
                                       {"threads", 1, 0, 't'}, {"device", 1, 0, 6}, {"help", 0, 0, 'h'}, CLI_KV_LONGOPTS, CLI_TIER_LONGOPTS, {0, 0, 0, 0}};
    const char *model = NULL, *data = NULL, *device = NULL;
    int batch = 8, json = 0, prog = -1, threads = 0, c;
    cinfer_ctx_opts co = {.quantized_kv_start = -1};   /* scoring: QuantizedKVCache from token 0 */
    cli_cache cc = {0};
    if (!cli_getopt_begin("logprobs", argc, argv, "m:t:h", lo)) return 2;
    while ((c = getopt_long(argc, argv, "m:t:h", lo, NULL)) != -1) {
        int kv = cli_kv_flag("logprobs", c, optarg, &co);
        if (!kv) kv = cli_cache_flag("logprobs", c, optarg, &cc);
        if (kv < 0) return 2;
        if (kv) continue;
        switch (c) {
        case 'm': model = optarg; break;
        case 1: data = optarg; break;
        case 2: if (!cli_int("logprobs", "--batch-size", optarg, 1, 1 << 16, &batch)) return 2; break;
        case 3: json = 1; break;
        case 4: prog = 1; break;
        case 5: prog = 0; break;
        case 't': if (!cli_int("logprobs", "--threads", optarg, 1, 1024, &threads)) return 2; break;
        case 6: device = optarg; break;
        case 'h': lp_help(stdout); return 0;
        default: fprintf(stderr, "cinfer logprobs: unknown or incomplete option '%s'\n", argv[optind - 1]); lp_help(stderr); return 2;
        }
    }
    if (!cli_no_more_args("logprobs", argc, argv) || !cli_scoring_kv("logprobs", &co)) return 2;
    if (!model || !data) { fprintf(stderr, "cinfer logprobs: need -m DIR and --data FILE (try --help)\n"); return 2; }
    size_t len;
    const char *why;
    char *buf = cli_read_file(data, &len, &why);
    if (!buf) { fprintf(stderr, "cinfer logprobs: cannot read %s: %s\n", data, why); return 1; }
    cinfer_model *m = cli_load_model("logprobs", model, device, threads);
    if (!m) { free(buf); return 1; }
    const cinfer_tokenizer *t = cinfer_model_tokenizer(m);
    cinfer_model_info info;
    cinfer_model_get_info(m, &info);
    int rc = 0, n = 0, cap = 0, ln = 0;
    cinfer_lp_seq *seqs = NULL;
    lp_item *items = NULL;
    for (char *p = buf; !rc && p && *p;) {
        char *nl = strchr(p, '\n');
        if (nl) *nl = 0;
        ln++;
        char *q = p;
        p = nl ? nl + 1 : NULL;
        while (*q == ' ' || *q == '\t' || *q == '\r') q++;
        if (!*q) continue;
        json_error_t je;
        json_t *o = json_loads(q, 0, &je);
        if (!o || !json_is_object(o)) {
            fprintf(stderr, "cinfer logprobs: %s:%d: not a JSON object (%s)\n", data, ln, o ? "wrong type" : je.text);
            json_decref(o);
            rc = 1;
            break;
        }
        json_t *pr = json_object_get(o, "prompt"), *re = json_object_get(o, "response");
        json_t *ch = json_object_get(o, "chosen"), *rj = json_object_get(o, "rejected");
        int pair = ch && rj;
        if (!pr || (!re && !pair)) {
            fprintf(stderr, "cinfer logprobs: %s:%d: expected {\"prompt\", \"response\"} or {\"prompt\", \"chosen\", \"rejected\"}\n", data, ln);
            json_decref(o);
            rc = 1;
            break;
        }
        if (n + 2 > cap) {
            cap = cap ? 2 * cap : 64;
            cinfer_lp_seq *a = realloc(seqs, sizeof *a * cap);
            if (a) seqs = a;
            lp_item *b = realloc(items, sizeof *b * cap);
            if (b) items = b;
            if (!a || !b) { fprintf(stderr, "cinfer logprobs: out of memory\n"); json_decref(o); rc = 1; break; }
        }
        int32_t *pid = NULL, *r1 = NULL, *r2 = NULL;
        int np = 0, n1 = 0, n2 = 0;
        int ok = field_ids(t, pr, 1, &pid, &np, data, ln, "prompt") &&
                 field_ids(t, pair ? ch : re, 0, &r1, &n1, data, ln, pair ? "chosen" : "response") &&
                 (!pair || field_ids(t, rj, 0, &r2, &n2, data, ln, "rejected"));
        if (ok && np < 1) { fprintf(stderr, "cinfer logprobs: %s:%d: the prompt is empty (no tokens)\n", data, ln); ok = 0; }
        int longest = np + (n1 > n2 ? n1 : n2) - 1;   /* positions fed: all but the last response token */
        if (ok && longest > info.max_pos) {
            fprintf(stderr, "cinfer logprobs: %s:%d: prompt + response feed %d positions; the model's context holds %d (max_position_embeddings)\n",
                    data, ln, longest, info.max_pos);
            ok = 0;
        }
        json_decref(o);
        if (!ok) { free(pid); free(r1); free(r2); rc = 1; break; }
        seqs[n] = (cinfer_lp_seq){pid, np, r1, n1};
        items[n++] = (lp_item){ln, pair ? 1 : 0};
        if (pair) {
            int32_t *pcopy = malloc(sizeof *pcopy * np);
            if (pcopy) memcpy(pcopy, pid, sizeof *pcopy * np);
            seqs[n] = (cinfer_lp_seq){pcopy, np, r2, n2};
            items[n++] = (lp_item){ln, 2};
            if (!pcopy) { fprintf(stderr, "cinfer logprobs: out of memory\n"); rc = 1; }
        }
    }
    if (!rc && n == 0) { fprintf(stderr, "cinfer logprobs: %s: no lines to score (the file is empty)\n", data); rc = 1; }
    double *sum = rc ? NULL : malloc(sizeof *sum * n);
    cinfer_ctx *ctx = NULL;
    char err[1024];
    co.max_seqs = batch > 64 ? batch : 0;   /* one sequence per row of a batch */
    if (!rc && !sum) { fprintf(stderr, "cinfer logprobs: out of memory\n"); rc = 1; }
    if (!rc && cinfer_ctx_new(m, &co, &ctx, err, sizeof err)) { fprintf(stderr, "cinfer logprobs: %s\n", err); rc = 1; }
    score_progress pg;
    score_cli_progress_init(&pg, prog, "logprobs");
    int64_t cached = 0, prompt_tokens = 0;
    if (!rc && cc.dir && cli_tier_open("logprobs", &cc, m)) rc = 1;
    if (!rc && cinfer_response_logprobs_tier(ctx, cc.tier, seqs, n, batch, sum, NULL, score_cli_progress, &pg, &cached, err,
                                             sizeof err)) {
        fprintf(stderr, "cinfer logprobs: %s\n", err);
        rc = 1;
    }
    for (int k = 0; k < n; k++) prompt_tokens += seqs[k].n_prompt - 1;
    if (!rc && cc.dir)
        fprintf(stderr, "cinfer logprobs: --cache-dir: %lld of %lld prompt tokens restored from %s\n", (long long)cached,
                (long long)prompt_tokens, cc.dir);
    for (int k = 0; !rc && k < n; k++) {
        if (items[k].pair == 0) {
            if (json) cli_json_printf("{\"line\": %d, \"logprob\": %.10g, \"tokens\": %d}\n", items[k].line, sum[k], seqs[k].n_response);
            else printf("line %d: logprob %.6f over %d tokens\n", items[k].line, sum[k], seqs[k].n_response);
        } else if (items[k].pair == 1) {
            double mg = sum[k] - sum[k + 1];
            if (json)
                cli_json_printf("{\"line\": %d, \"chosen_logprob\": %.10g, \"chosen_tokens\": %d, \"rejected_logprob\": %.10g, "
                       "\"rejected_tokens\": %d, \"margin\": %.10g}\n",
                       items[k].line, sum[k], seqs[k].n_response, sum[k + 1], seqs[k + 1].n_response, mg);
            else
                printf("line %d: chosen %.6f (%d tokens)  rejected %.6f (%d tokens)  margin %.6f\n", items[k].line, sum[k],
                       seqs[k].n_response, sum[k + 1], seqs[k + 1].n_response, mg);
        }
    }
    for (int k = 0; k < n; k++) {
        free((void *)seqs[k].prompt);
        free((void *)seqs[k].response);
    }
    free(seqs);
    free(items);
    free(sum);
    free(buf);
    cli_cache_end(&cc, NULL);
    cinfer_ctx_free(ctx);
    cinfer_model_free(m);
    return rc;
}
