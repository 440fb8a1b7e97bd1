/*
 * cmd-logits.c — `cinfer logits`: the model's logits at every position of a
 * prompt or token list: top-K tokens with logit and log-prob per position
 * (text or --json), and optionally all float32 logits [positions, vocab] as
 * a NumPy .npy file. Log-probs are log-softmax in float32 with a double sum.
 */
#include <getopt.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "cli.h"
#include "io/npy.h"

static void logits_help(FILE *f) {
    fprintf(f,
        "usage: cinfer logits -m DIR (--prompt TEXT | --tokens 1,2,3) [options]\n\n"
        "Runs the model over the input and prints, per position, the top-K next tokens\n"
        "with logit and log-probability.\n\n"
        "  -m, --model DIR      model directory\n"
        "  -p, --prompt TEXT    text, encoded with the tokenizer's own rules (BOS as configured)\n"
        "      --tokens LIST    exactly these ids, comma-separated (no BOS added)\n"
        "      --top K          tokens shown per position (default 5)\n"
        "      --json           one JSON object: {\"tokens\": [...], \"positions\": [{\"top\": [...]}]}\n"
        "      --npy FILE       write all logits as float32 [positions, vocab] .npy\n"
        "  -t, --threads N      CPU threads\n"
        "      --device cpu|cuda\n"
        "  -h, --help\n");
}

static void json_str(const char *s) {
    putchar('"');
    for (const unsigned char *p = (const unsigned char *)(s ? s : ""); *p; p++) {
        if (*p == '"' || *p == '\\') printf("\\%c", *p);
        else if (*p < 0x20) printf("\\u%04x", *p);
        else putchar(*p);
    }
    putchar('"');
}

int cmd_logits(int argc, char **argv) {
    static const struct option lo[] = {{"model", 1, 0, 'm'}, {"prompt", 1, 0, 'p'}, {"tokens", 1, 0, 1},
                                       {"top", 1, 0, 2},     {"json", 0, 0, 3},     {"npy", 1, 0, 4},
                                       {"threads", 1, 0, 't'}, {"device", 1, 0, 5}, {"help", 0, 0, 'h'},
                                       {0, 0, 0, 0}};
    const char *model = NULL, *prompt = NULL, *tokens = NULL, *npy = NULL, *device = NULL;
    int top = 5, json = 0, threads = 0, c;
    if (!cli_getopt_begin("logits", argc, argv, "m:p:t:h", lo)) return 2;
    while ((c = getopt_long(argc, argv, "m:p:t:h", lo, NULL)) != -1) {
        switch (c) {
        case 'm': model = optarg; break;
        case 'p': prompt = optarg; break;
        case 1: tokens = optarg; break;
        case 2: if (!cli_int("logits", "--top", optarg, 0, 1 << 20, &top)) return 2; break;
        case 3: json = 1; break;
        case 4: npy = optarg; break;
        case 't': if (!cli_int("logits", "--threads", optarg, 1, 1024, &threads)) return 2; break;
        case 5: device = optarg; break;
        case 'h': logits_help(stdout); return 0;
        default: fprintf(stderr, "cinfer logits: unknown or incomplete option '%s'\n", argv[optind - 1]); logits_help(stderr); return 2;
        }
    }
    if (!cli_no_more_args("logits", argc, argv)) return 2;
    if (!model || (!prompt == !tokens)) {
        fprintf(stderr, "cinfer logits: need -m DIR and exactly one of --prompt / --tokens (try --help)\n");
        return 2;
    }
    int32_t *ids = NULL;
    int n = 0;
    if (tokens && !*tokens) { fprintf(stderr, "cinfer logits: --tokens is empty\n"); return 2; }
    if (tokens && !cli_parse_ids(tokens, &ids, &n)) { fprintf(stderr, "cinfer logits: --tokens wants ids like 1,2,3\n"); return 2; }
    cinfer_model *m = cli_load_model("logits", model, device, threads);
    if (!m) { free(ids); return 1; }
    const cinfer_tokenizer *t = cinfer_model_tokenizer(m);
    int rc = 0;
    if (prompt) {
        if (!t) { fprintf(stderr, "cinfer logits: %s has no tokenizer.json; use --tokens\n", model); rc = 1; }
        else if (cinfer_tokenize(t, prompt, strlen(prompt), 1, 1, &ids, &n) || n < 1) { fprintf(stderr, "cinfer logits: cannot tokenize the prompt\n"); rc = 1; }
    }
    cinfer_model_info info;
    cinfer_model_get_info(m, &info);
    int V = info.n_vocab;
    if (top > V) top = V;
    if (!rc && n > info.max_pos) {
        fprintf(stderr, "cinfer logits: %d tokens do not fit the model's context of %d positions (max_position_embeddings)\n", n, info.max_pos);
        rc = 1;
    }
    float *lg = rc ? NULL : malloc(sizeof(float) * (size_t)n * V);
    int *best = malloc(sizeof(int) * (top > 0 ? top : 1));
    cinfer_ctx *ctx = NULL;
    char err[512];
    if (!rc && (!lg || !best)) { fprintf(stderr, "cinfer logits: out of memory for %d x %d logits\n", n, V); rc = 1; }
    if (!rc && cinfer_ctx_new(m, NULL, &ctx, err, sizeof err)) { fprintf(stderr, "cinfer logits: %s\n", err); rc = 1; }
    if (!rc && cinfer_eval(ctx, ids, n, 1, lg)) { fprintf(stderr, "cinfer logits: %s\n", cinfer_ctx_error(ctx)); rc = 1; }
    if (!rc && npy) {
        int64_t shape[2] = {n, V};
        if (npy_write_f32(npy, lg, 2, shape, err, sizeof err)) { fprintf(stderr, "cinfer logits: %s\n", err); rc = 1; }
    }
    if (!rc) {
        if (json) printf("{\"tokens\": [");
        for (int i = 0; json && i < n; i++) printf("%s%d", i ? ", " : "", ids[i]);
        if (json) printf("], \"positions\": [");
        for (int i = 0; i < n; i++) {
            const float *r = lg + (size_t)i * V;
            float mx = r[0];
            for (int v = 1; v < V; v++) mx = r[v] > mx ? r[v] : mx;
            double sum = 0;
            for (int v = 0; v < V; v++) sum += exp((double)r[v] - mx);
            float lse = mx + (float)log(sum);
            /* top K by insertion into a sorted list, ties to the lower id: O(V) for small K */
            int cnt = 0;
            for (int v = 0; v < V && top > 0; v++) {
                int j = cnt;
                while (j > 0 && r[v] > r[best[j - 1]]) j--;
                if (j == top) continue;
                if (cnt < top) cnt++;
                memmove(best + j + 1, best + j, sizeof *best * (size_t)(cnt - 1 - j));
                best[j] = v;
            }
            const char *piece = t ? cinfer_token_piece(t, ids[i]) : NULL;
            if (json) {
                printf("%s{\"position\": %d, \"token\": %d, \"top\": [", i ? ", " : "", i, ids[i]);
                for (int k = 0; k < top; k++) {
                    printf("%s{\"id\": %d, \"piece\": ", k ? ", " : "", best[k]);
                    json_str(t ? cinfer_token_piece(t, best[k]) : NULL);
                    printf(", \"logit\": %.6g, \"logprob\": %.6g}", r[best[k]], r[best[k]] - lse);
                }
                printf("]}");
            } else {
                printf("[%d] %d %s%s%s\n", i, ids[i], piece ? "'" : "", piece ? piece : "", piece ? "'" : "");
                for (int k = 0; k < top; k++) {
                    const char *bp = t ? cinfer_token_piece(t, best[k]) : NULL;
                    printf("    %6d %-16s logit %9.4f  logprob %9.4f\n", best[k], bp ? bp : "", r[best[k]], r[best[k]] - lse);
                }
            }
        }
        if (json) printf("]}\n");
    }
    free(best);
    free(lg);
    free(ids);
    cinfer_ctx_free(ctx);
    cinfer_model_free(m);
    return rc;
}
