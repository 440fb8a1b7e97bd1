/*
 * cmd-cache-prompt.c — `cinfer cache-prompt` (mlx_lm.cache_prompt: prefill a
 * prompt and save its KV state as an mlx-lm prompt-cache file) and the cache
 * hooks the generation commands call: --prompt-cache-file (continue from a
 * file; the prompt is what follows the cached prefix, as mlx_lm.generate
 * takes it) and --cache-dir / --cache-dir-max-gb (the persistent prefix
 * tier: the longest stored prefix of the prompt is restored, the rest fed
 * and stored).
 * Chat templates are cut the way mlx-lm cuts them: cache-prompt keeps the
 * rendering up to the end of the user's text, generate keeps it from the
 * start of the user's text (both located through a "<query>" rendering).
 */
#include <getopt.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include "cli.h"

static double cli_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

int cli_cache_flag(const char *cmd, int code, const char *v, cli_cache *cc) {
    float gb;
    switch (code) {
    case CACHE_FILE: cc->file = v; return 1;
    case CACHE_DIR: cc->dir = v; return 1;
    case CACHE_MAX_GB:
        if (!cli_float(cmd, "--cache-dir-max-gb", v, &gb) || !(gb > 0)) {
            fprintf(stderr, "cinfer %s: --cache-dir-max-gb wants a size in GB > 0\n", cmd);
            return -1;
        }
        cc->max_bytes = (size_t)((double)gb * 1e9);
        return 1;
    default: return 0;
    }
}

/* renders [system?, user: content] with the generation prompt through the tokenizer's template; malloc'd */
static char *render_user(const cinfer_tokenizer *t, const char *system, const char *content) {
    json_t *msgs = json_array();
    if (system) json_array_append_new(msgs, json_pack("{s:s,s:s}", "role", "system", "content", system));
    json_array_append_new(msgs, json_pack("{s:s,s:s}", "role", "user", "content", content));
    char *js = json_dumps(msgs, JSON_COMPACT), *out = NULL, err[512];
    json_decref(msgs);
    cinfer_status st = js ? cinfer_chat_render(t, js, NULL, NULL, 1, &out, err, sizeof err) : CINFER_ENOMEM;
    free(js);
    if (st) fprintf(stderr, "cinfer cache-prompt: chat template: %s\n", st == CINFER_ENOMEM ? "out of memory" : err);
    return st ? NULL : out;
}

char *cli_cache_cut(const char *cmd, const char *full, const char *test, int prefix) {
    const char *q = strstr(test, "<query>");
    if (!q) { fprintf(stderr, "cinfer %s: the chat template does not show the user's text; cannot cut it\n", cmd); return NULL; }
    size_t at = (size_t)(q - test), tail = strlen(q) - 7, fl = strlen(full);
    if (prefix) return fl >= tail ? strndup(full, fl - tail) : NULL;
    return fl >= at ? strdup(full + at) : NULL;
}

/* cache-prompt's ids: --tokens as given; through the template (cut after the user's text) or plain with BOS */
static int prefix_ids(cinfer_model *m, const char *text, const char *tokens, int templ, const char *system, int32_t **ids, int *n) {
    *ids = NULL;
    *n = 0;
    if (tokens) {
        if (!cli_parse_ids(tokens, ids, n)) { fprintf(stderr, "cinfer cache-prompt: --tokens wants ids like 1,2,3\n"); return 2; }
        return 0;
    }
    const cinfer_tokenizer *t = cinfer_model_tokenizer(m);
    if (!t) { fprintf(stderr, "cinfer cache-prompt: the model has no tokenizer.json; pass --tokens\n"); return 1; }
    if (!text || !*text) { fprintf(stderr, "cinfer cache-prompt: give a prompt (--prompt TEXT, '-' for stdin, or --tokens)\n"); return 2; }
    if (templ < 0 && !cinfer_tokenizer_has_chat_template(t)) {
        fprintf(stderr, "cinfer cache-prompt: --chat needs a chat template and the model has none\n");
        return 2;
    }
    templ = templ < 0 || (templ > 0 && cinfer_tokenizer_has_chat_template(t));
    char *cut = NULL;
    if (templ) {
        char *full = render_user(t, system, text), *test = full ? render_user(t, system, "<query>") : NULL;
        cut = test ? cli_cache_cut("cache-prompt", full, test, 1) : NULL;
        free(full);
        free(test);
        if (!cut) return 1;
    }
    const char *s = cut ? cut : text;
    cinfer_status st = cinfer_tokenize(t, s, strlen(s), !templ, 1, ids, n);
    free(cut);
    if (st || *n < 1) {
        fprintf(stderr, "cinfer cache-prompt: the prompt tokenizes to nothing (%s)\n", cinfer_status_str(st));
        free(*ids);
        *ids = NULL;
        return 1;
    }
    return 0;
}

static void tier_log(const char *msg, void *user) { fprintf(stderr, "cinfer %s: %s\n", (const char *)user, msg); }

int cli_tier_open(const char *cmd, cli_cache *cc, cinfer_model *m) {
    char err[512];
    cinfer_tier_opts to = {cc->max_bytes, tier_log, (void *)cmd};
    if (!cc->tier && cinfer_tier_open(cc->dir, m, &to, &cc->tier, err, sizeof err)) {   /* chat: open once */
        fprintf(stderr, "cinfer %s: --cache-dir: %s\n", cmd, err);
        return 1;
    }
    return 0;
}

int cli_cache_begin(const char *cmd, cli_cache *cc, cinfer_model *m, cinfer_ctx *c, const int32_t *ids, int n, int *skip) {
    *skip = 0;
    cc->cached = 0;
    if (cc->file && cc->dir) { fprintf(stderr, "cinfer %s: --prompt-cache-file and --cache-dir do not combine\n", cmd); return 2; }
    double t0 = cli_now();
    if (cc->file) {
        int fp = 1;
        if (cinfer_prompt_cache_load(c, 0, cc->file, NULL, &fp)) {
            fprintf(stderr, "cinfer %s: %s\n", cmd, cinfer_ctx_error(c));
            return 1;
        }
        if (!fp) fprintf(stderr, "cinfer %s: warning: %s has no cinfer fingerprint; only its shapes could be checked against "
                         "this model\n", cmd, cc->file);
        cc->cached = cinfer_seq_len(c, 0);
    } else if (cc->dir) {
        if (cli_tier_open(cmd, cc, m)) return 1;
        if (cinfer_tier_prefill(cc->tier, c, 0, ids, n, &cc->cached)) {
            fprintf(stderr, "cinfer %s: %s\n", cmd, cinfer_tier_error(cc->tier));
            return 1;
        }
        *skip = n - 1;
        cc->fed = n - 1 - cc->cached;
    }
    cc->seconds = cli_now() - t0;
    return 0;
}

void cli_cache_end(cli_cache *cc, cinfer_gen_stats *s) {
    if (s && cc->dir) {   /* the prompt's tokens and time include what the tier step fed */
        s->prompt_tokens += cc->fed;
        s->prompt_s += cc->seconds;
    }
    cinfer_tier_free(cc->tier);
    cc->tier = NULL;
}

/* ------------------------------------------------------ cache-prompt */

static void cp_help(FILE *f) {
    fprintf(f,
        "usage: cinfer cache-prompt -m DIR (--prompt TEXT|- | --tokens IDS) --prompt-cache-file FILE [options]\n\n"
        "Feeds a prompt and saves the KV cache as an mlx-lm prompt-cache file (mlx_lm.cache_prompt's\n"
        "format: mlx_lm.generate --prompt-cache-file reads it, and so does cinfer generate). Every\n"
        "prompt token is in the cache; the file adds cinfer's model and tokenizer fingerprints.\n\n"
        "  -m, --model DIR            model directory\n"
        "  -p, --prompt TEXT          the prompt to cache ('-' reads stdin)\n"
        "      --tokens 1,2,3         cache exactly these ids\n"
        "      --ignore-chat-template feed the prompt as it is (default: when the tokenizer has a chat\n"
        "                             template, the rendering of the prompt as a user message up to the\n"
        "                             end of its text, as mlx_lm.cache_prompt does)\n"
        "      --chat                 require the chat template\n"
        "      --system-prompt TEXT   system message (through the template)\n"
        "      --prompt-cache-file F  the file to write (.safetensors appended when missing)\n"
        "  -t, --threads N            CPU threads\n"
        "      --device cpu|cuda      backend (default cpu)\n"
        CLI_KV_HELP
        "  -h, --help                 this help\n");
}

int cmd_cache_prompt(int argc, char **argv) {
    static const struct option lo[] = {
        {"model", 1, 0, 'm'}, {"prompt", 1, 0, 'p'}, {"tokens", 1, 0, 1}, {"chat", 0, 0, 2}, {"system", 1, 0, 3},
        {"system-prompt", 1, 0, 3}, {"ignore-chat-template", 0, 0, 6},
        {"threads", 1, 0, 't'}, {"device", 1, 0, 4}, {"help", 0, 0, 'h'}, CLI_KV_LONGOPTS,
        CLI_CACHE_LONGOPTS, {0, 0, 0, 0}};
    const char *model = NULL, *prompt = NULL, *tokens = NULL, *system = NULL, *device = NULL;
    int templ = 1, threads = 0, c;   /* 1: when the tokenizer has one, -1: required, 0: never */
    cli_cache cc = {0};
    cinfer_ctx_opts co = {.quantized_kv_start = 5000};   /* mlx_lm.cache_prompt's default */
    if (!cli_getopt_begin("cache-prompt", argc, argv, "m:p:t:h", lo)) return 2;
    while ((c = getopt_long(argc, argv, "m:p:t:h", lo, NULL)) != -1) {
        int k = cli_kv_flag("cache-prompt", c, optarg, &co);
        if (!k) k = cli_cache_flag("cache-prompt", c, optarg, &cc);
        if (k < 0) return 2;
        if (k) continue;
        switch (c) {
        case 'm': model = optarg; break;
        case 'p': prompt = optarg; break;
        case 1: tokens = optarg; break;
        case 2: templ = -1; break;
        case 6: templ = 0; break;
        case 3: system = optarg; break;
        case 't': if (!cli_int("cache-prompt", "--threads", optarg, 1, 1024, &threads)) return 2; break;
        case 4: device = optarg; break;
        case 'h': cp_help(stdout); return 0;
        default:
            cli_bad_option("cache-prompt", argv, optopt);
            return 2;
        }
    }
    if (!cli_no_more_args("cache-prompt", argc, argv)) return 2;
    if (!model || !cc.file || (!prompt && !tokens) || cc.dir) {
        fprintf(stderr, "cinfer cache-prompt: need -m DIR, --prompt-cache-file FILE and --prompt or --tokens (try --help)\n");
        return 2;
    }
    char *stdin_text = NULL, *path = NULL;
    if (prompt && !strcmp(prompt, "-")) {
        const char *why = NULL;
        if (!(stdin_text = cli_read_file("-", NULL, &why))) { fprintf(stderr, "cinfer cache-prompt: cannot read stdin: %s\n", why ? why : "?"); return 1; }
        prompt = stdin_text;
    }
    size_t fl = strlen(cc.file);
    path = malloc(fl + 13);
    if (!path) { free(stdin_text); return 1; }
    snprintf(path, fl + 13, "%s%s", cc.file, fl >= 12 && !strcmp(cc.file + fl - 12, ".safetensors") ? "" : ".safetensors");
    cinfer_model *m = cli_load_model("cache-prompt", model, device, threads);
    int32_t *ids = NULL;
    int n = 0, rc = m ? prefix_ids(m, prompt, tokens, templ, system, &ids, &n) : 1;
    cinfer_ctx *ctx = NULL;
    char err[512];
    co.n_threads = threads;
    if (!rc && cinfer_ctx_new(m, &co, &ctx, err, sizeof err)) { fprintf(stderr, "cinfer cache-prompt: %s\n", err); rc = 1; }
    double t0 = cli_now();
    int step = co.prefill_step_size > 0 ? co.prefill_step_size : 2048;
    for (int done = 0; !rc && done < n; done += step) {
        int k = n - done < step ? n - done : step;
        if (cinfer_forward(ctx, ids + done, 1, k, NULL, NULL, NULL, 0, NULL)) {
            fprintf(stderr, "cinfer cache-prompt: %s\n", cinfer_ctx_error(ctx));
            rc = 1;
        }
    }
    double dt = cli_now() - t0;
    json_t *meta = rc ? NULL : json_pack("{s:s, s:s}", "model", model, "tokenizer_config", "{\"trust_remote_code\": null}");
    char *mj = meta ? json_dumps(meta, JSON_COMPACT | JSON_PRESERVE_ORDER) : NULL;
    if (!rc && (!mj || cinfer_prompt_cache_save(ctx, 0, path, mj, ids, n))) {
        fprintf(stderr, "cinfer cache-prompt: %s\n", mj ? cinfer_ctx_error(ctx) : "out of memory");
        rc = 1;
    }
    if (!rc) fprintf(stderr, "Processed %d tokens (%.2f tok/s)\nSaved the prompt cache to %s\n", n, dt > 0 ? n / dt : 0.0, path);
    free(mj);
    json_decref(meta);
    free(ids);
    free(path);
    free(stdin_text);
    cinfer_ctx_free(ctx);
    cinfer_model_free(m);
    return rc;
}
