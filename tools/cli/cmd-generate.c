/*
 * cmd-generate.c — `cinfer generate` (one prompt, streamed) and `cinfer
 * chat` (interactive, through the chat template). Text streams to stdout;
 * statistics go to stderr in mlx_lm.generate's form, or as one JSON object on
 * stdout with --json. chat keeps the KV cache between turns and feeds only
 * the part of each new rendering that differs from the tokens already cached.
 */
#include <getopt.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "cli.h"

typedef struct gen_opts {
    const char *model, *prompt, *device, *system, *tokens;
    int max_tokens, threads, chat, json, kv_f16, quiet;
    cinfer_sampler_params sp;
    cinfer_ctx_opts co;
    cli_cache cache;
} gen_opts;

static void gen_help(FILE *f, const char *cmd) {
    fprintf(f,
        "usage: cinfer %s -m DIR [options]\n\n"
        "%s"
        "  -m, --model DIR            model directory (config.json, *.safetensors, tokenizer.json)\n"
        "%s"
        "  -n, --max-tokens N         tokens to generate (default 100)\n"
        "      --temp T               sampling temperature; 0 = greedy (default 0)\n"
        "      --top-k K              keep the K most likely tokens (default 0 = off)\n"
        "      --top-p P              nucleus sampling mass (default 1 = off)\n"
        "      --min-p P              drop tokens below P x the top probability (default 0 = off)\n"
        "      --repetition-penalty R penalise recent tokens (default 1 = off)\n"
        "      --repetition-context-size N  tokens the penalty looks back on (default 20)\n"
        "      --seed S               random seed; same seed, same output (default 0)\n"
        "      --system TEXT          system prompt (chat template)\n"
        "  -t, --threads N            CPU threads (default: all cores)\n"
        "      --device cpu|cuda      backend (default cpu)\n"
        "      --kv-f16               keep the KV cache in f16\n"
        CLI_KV_HELP
        CLI_CACHE_HELP
        "      --json                 print the statistics as one JSON object on stdout\n"
        "  -h, --help                 this help\n",
        cmd,
        strcmp(cmd, "chat") ? "Generates text after a prompt and streams it to stdout; prints prompt and\n"
                              "generation speed and peak memory to stderr.\n\n"
                            : "Interactive chat through the model's chat template; one line per user turn,\n"
                              "an empty line or end of input quits.\n\n",
        strcmp(cmd, "chat") ? "  -p, --prompt TEXT          prompt (default: start from BOS); '-' reads stdin\n"
                              "      --tokens 1,2,3         feed exactly these token ids (no BOS added)\n"
                              "      --chat                 wrap the prompt in the model's chat template\n"
                            : "");
}

static int parse_gen(const char *cmd, int argc, char **argv, gen_opts *o) {
    static const struct option lo[] = {
        {"model", 1, 0, 'm'}, {"prompt", 1, 0, 'p'}, {"max-tokens", 1, 0, 'n'}, {"temp", 1, 0, 1},
        {"top-k", 1, 0, 2}, {"top-p", 1, 0, 3}, {"min-p", 1, 0, 4}, {"repetition-penalty", 1, 0, 5},
        {"repetition-context-size", 1, 0, 6}, {"seed", 1, 0, 7}, {"threads", 1, 0, 't'}, {"device", 1, 0, 8},
        {"chat", 0, 0, 9}, {"system", 1, 0, 10}, {"json", 0, 0, 11}, {"kv-f16", 0, 0, 12}, {"tokens", 1, 0, 13},
        {"help", 0, 0, 'h'}, CLI_KV_LONGOPTS, CLI_CACHE_LONGOPTS, {0, 0, 0, 0}};
    memset(o, 0, sizeof *o);
    o->max_tokens = 100;
    o->sp = cinfer_sampler_defaults();
    o->sp.rep_last_n = 20;
    o->chat = !strcmp(cmd, "chat");
    optind = 1;
    opterr = 0;
    int c, seed;
    while ((c = getopt_long(argc, argv, "m:p:n:t:h", lo, NULL)) != -1) {
        int kv = cli_kv_flag(cmd, c, optarg, &o->co);
        if (!kv) kv = cli_cache_flag(cmd, c, optarg, &o->cache);
        if (kv < 0) return 2;
        if (kv) continue;
        switch (c) {
        case 'm': o->model = optarg; break;
        case 'p': o->prompt = optarg; break;
        case 'n': if (!cli_int(cmd, "--max-tokens", optarg, 0, 1 << 24, &o->max_tokens)) return 2; break;
        case 1: if (!cli_float(cmd, "--temp", optarg, &o->sp.temp)) return 2; break;
        case 2: if (!cli_int(cmd, "--top-k", optarg, 0, 1 << 30, &o->sp.top_k)) return 2; break;
        case 3: if (!cli_float(cmd, "--top-p", optarg, &o->sp.top_p)) return 2; break;
        case 4: if (!cli_float(cmd, "--min-p", optarg, &o->sp.min_p)) return 2; break;
        case 5: if (!cli_float(cmd, "--repetition-penalty", optarg, &o->sp.rep_penalty)) return 2; break;
        case 6: if (!cli_int(cmd, "--repetition-context-size", optarg, 0, 1 << 30, &o->sp.rep_last_n)) return 2; break;
        case 7: if (!cli_int(cmd, "--seed", optarg, 0, 2147483647, &seed)) return 2; o->sp.seed = (uint64_t)seed; break;
        case 't': if (!cli_int(cmd, "--threads", optarg, 1, 1024, &o->threads)) return 2; break;
        case 8: o->device = optarg; break;
        case 9: o->chat = 1; break;
        case 10: o->system = optarg; break;
        case 11: o->json = 1; break;
        case 12: o->kv_f16 = 1; break;
        case 13: o->tokens = optarg; break;
        case 'h': gen_help(stdout, cmd); return -1;
        default:
            fprintf(stderr, "cinfer %s: unknown or incomplete option '%s'\n", cmd, argv[optind - 1]);
            gen_help(stderr, cmd);
            return 2;
        }
    }
    if (optind < argc) { fprintf(stderr, "cinfer %s: unexpected argument '%s'\n", cmd, argv[optind]); return 2; }
    if (!o->model) { fprintf(stderr, "cinfer %s: -m DIR is required (try --help)\n", cmd); return 2; }
    if (o->sp.temp < 0 || !(o->sp.top_p > 0 && o->sp.top_p <= 1) || o->sp.min_p < 0 || o->sp.min_p > 1 || !(o->sp.rep_penalty > 0)) {
        fprintf(stderr, "cinfer %s: need --temp >= 0, 0 < --top-p <= 1, 0 <= --min-p <= 1, --repetition-penalty > 0\n", cmd);
        return 2;
    }
    return 0;
}

static int print_cb(int32_t tok, const char *text, void *user) {
    (void)tok;
    (void)user;
    if (text) { fputs(text, stdout); fflush(stdout); }
    return 0;
}

static void print_stats(const gen_opts *o, const cinfer_gen_stats *s) {
    double pps = s->prompt_s > 0 ? s->prompt_tokens / s->prompt_s : 0;
    double gps = s->gen_s > 0 ? s->gen_tokens / s->gen_s : 0;
    if (o->json) {
        printf("\n{\"prompt_tokens\": %d, \"prompt_tps\": %.3f, \"generation_tokens\": %d, \"generation_tps\": %.3f, "
               "\"peak_memory_gb\": %.4f, \"stopped_by_eos\": %s, \"prompt_cached_tokens\": %d}\n",
               s->prompt_tokens, pps, s->gen_tokens, gps, s->peak_rss / 1e9, s->stopped_by_eos ? "true" : "false", o->cache.cached);
        return;
    }
    fprintf(stderr, "\n==========\nPrompt: %d tokens, %.3f tokens-per-sec\nGeneration: %d tokens, %.3f tokens-per-sec\n"
            "Peak memory: %.3f GB\n", s->prompt_tokens, pps, s->gen_tokens, gps, s->peak_rss / 1e9);
}

/* renders [system?, ...history, user] through the template; returns malloc'd text */
static char *render_chat(const cinfer_tokenizer *t, json_t *msgs, const char *cmd) {
    char *js = json_dumps(msgs, JSON_COMPACT), *out = NULL, err[512];
    cinfer_status st = js ? cinfer_chat_render(t, js, NULL, NULL, 1, &out, err, sizeof err) : CINFER_ENOMEM;
    free(js);
    if (st) { fprintf(stderr, "cinfer %s: chat template: %s\n", cmd, st == CINFER_ENOMEM ? "out of memory" : err); return NULL; }
    return out;
}

/* prompt -> ids: --tokens, chat template, plain text with BOS, or just BOS */
static int prompt_ids(const char *cmd, const gen_opts *o, cinfer_model *m, const char *text, int32_t **ids, int *n) {
    const cinfer_tokenizer *t = cinfer_model_tokenizer(m);
    cinfer_model_info info;
    cinfer_model_get_info(m, &info);
    if (o->tokens) {
        if (!cli_parse_ids(o->tokens, ids, n)) { fprintf(stderr, "cinfer %s: --tokens wants ids like 1,2,3\n", cmd); return 2; }
        return 0;
    }
    if (!t && (text || o->chat)) { fprintf(stderr, "cinfer %s: %s has no tokenizer.json; pass --tokens\n", cmd, o->model); return 1; }
    char *rendered = NULL;
    if (o->chat) {
        json_t *msgs = json_array();
        if (o->system) json_array_append_new(msgs, json_pack("{s:s,s:s}", "role", "system", "content", o->system));
        json_array_append_new(msgs, json_pack("{s:s,s:s}", "role", "user", "content", text ? text : ""));
        rendered = render_chat(t, msgs, cmd);
        json_decref(msgs);
        if (!rendered) return 1;
        text = rendered;
    }
    if (!text || !*text) {
        int bos = t ? cinfer_tokenizer_bos(t) : -1;
        if (bos < 0) bos = info.bos;
        if (bos < 0) { fprintf(stderr, "cinfer %s: no prompt and the model has no BOS token\n", cmd); return 2; }
        *ids = malloc(sizeof(int32_t));
        if (!*ids) return 1;
        (*ids)[0] = bos;
        *n = 1;
        return 0;
    }
    cinfer_status st = cinfer_tokenize(t, text, strlen(text), !o->chat, 1, ids, n);
    free(rendered);
    if (st || *n < 1) { fprintf(stderr, "cinfer %s: could not tokenize the prompt (%s)\n", cmd, cinfer_status_str(st)); return 1; }
    return 0;
}

int cmd_generate(int argc, char **argv) {
    gen_opts o;
    int rc = parse_gen("generate", argc, argv, &o);
    if (rc) return rc < 0 ? 0 : rc;
    char *stdin_text = NULL;
    if (o.prompt && !strcmp(o.prompt, "-")) {
        stdin_text = cli_read_file("-", NULL);
        if (!stdin_text) { fprintf(stderr, "cinfer generate: cannot read the prompt from stdin\n"); return 1; }
        o.prompt = stdin_text;
    }
    cinfer_model *m = cli_load_model("generate", o.model, o.device, o.threads);
    if (!m) { free(stdin_text); return 1; }
    int32_t *ids = NULL;
    int n = 0;
    cinfer_ctx *c = NULL;
    char err[512];
    rc = o.cache.file ? cli_cache_suffix_ids("generate", m, o.prompt, o.tokens, o.chat, o.system, &ids, &n)
                      : prompt_ids("generate", &o, m, o.prompt, &ids, &n);
    cinfer_ctx_opts co = o.co;
    co.n_threads = o.threads;
    co.kv_f16 = o.kv_f16;
    if (!rc && cinfer_ctx_new(m, &co, &c, err, sizeof err)) { fprintf(stderr, "cinfer generate: %s\n", err); rc = 1; }
    int skip = 0;
    if (!rc) rc = cli_cache_begin("generate", &o.cache, m, c, ids, n, &skip);
    if (!rc) {
        cinfer_gen_stats s;
        if (o.prompt && !o.chat && !o.json) { fputs(o.prompt, stdout); fflush(stdout); }
        cinfer_status st = cinfer_generate(c, ids + skip, n - skip, &o.sp, o.max_tokens, print_cb, NULL, &s);
        cli_cache_end(&o.cache, &s);
        if (st) { fprintf(stderr, "\ncinfer generate: %s\n", cinfer_ctx_error(c)); rc = 1; }
        else print_stats(&o, &s);
    }
    cli_cache_end(&o.cache, NULL);
    free(ids);
    free(stdin_text);
    cinfer_ctx_free(c);
    cinfer_model_free(m);
    return rc;
}

/* the assistant's text of this turn, and every token id fed to the cache */
typedef struct chat_acc { char *buf; size_t n, cap; int32_t *fed; int n_fed, cap_fed; } chat_acc;

static int chat_cb(int32_t tok, const char *text, void *user) {
    chat_acc *a = user;
    if (tok >= 0) {
        if (a->n_fed == a->cap_fed) {
            int nc = a->cap_fed ? a->cap_fed * 2 : 256;
            int32_t *nf = realloc(a->fed, sizeof *nf * nc);
            if (!nf) return 1;
            a->fed = nf;
            a->cap_fed = nc;
        }
        a->fed[a->n_fed++] = tok;
    }
    if (!text) return 0;
    fputs(text, stdout);
    fflush(stdout);
    size_t k = strlen(text);
    if (a->n + k + 1 > a->cap) {
        size_t nc = (a->n + k + 1) * 2;
        char *nb = realloc(a->buf, nc);
        if (!nb) return 1;
        a->buf = nb;
        a->cap = nc;
    }
    memcpy(a->buf + a->n, text, k + 1);
    a->n += k;
    return 0;
}

int cmd_chat(int argc, char **argv) {
    gen_opts o;
    int rc = parse_gen("chat", argc, argv, &o);
    if (rc) return rc < 0 ? 0 : rc;
    if (o.cache.file) { fprintf(stderr, "cinfer chat: --prompt-cache-file: generate only, for now (chat takes --cache-dir)\n"); return 2; }
    cinfer_model *m = cli_load_model("chat", o.model, o.device, o.threads);
    if (!m) return 1;
    const cinfer_tokenizer *t = cinfer_model_tokenizer(m);
    cinfer_ctx *c = NULL;
    char err[512], line[8192];
    cinfer_ctx_opts co = o.co;
    co.n_threads = o.threads;
    co.kv_f16 = o.kv_f16;
    if (!t) { fprintf(stderr, "cinfer chat: %s has no tokenizer.json\n", o.model); rc = 1; }
    else if (cinfer_ctx_new(m, &co, &c, err, sizeof err)) { fprintf(stderr, "cinfer chat: %s\n", err); rc = 1; }
    json_t *msgs = json_array();
    chat_acc acc = {0};
    if (o.system) json_array_append_new(msgs, json_pack("{s:s,s:s}", "role", "system", "content", o.system));
    if (!o.max_tokens) o.max_tokens = 512;
    while (!rc) {
        fprintf(stderr, "\n> ");
        if (!fgets(line, sizeof line, stdin)) break;
        line[strcspn(line, "\r\n")] = 0;
        if (!line[0]) break;
        json_array_append_new(msgs, json_pack("{s:s,s:s}", "role", "user", "content", line));
        char *text = render_chat(t, msgs, "chat");
        int32_t *ids = NULL;
        int n = 0;
        if (!text || cinfer_tokenize(t, text, strlen(text), 0, 1, &ids, &n) || n < 1) { free(text); free(ids); rc = 1; break; }
        free(text);
        /* reuse the cached prefix the new rendering shares with what was fed */
        int keep = 0, have = cinfer_ctx_pos(c);
        while (keep < have && keep < n - 1 && keep < acc.n_fed && acc.fed[keep] == ids[keep]) keep++;
        cinfer_ctx_trim(c, keep);
        if (cinfer_ctx_pos(c) < keep) keep = cinfer_ctx_pos(c);   /* a window that dropped keys cannot go back */
        acc.n_fed = keep;
        for (int i = keep; i < n; i++) chat_cb(ids[i], NULL, &acc);
        int skip = 0;   /* --cache-dir: a rendering that shares nothing with the cache may start from disk */
        if (o.cache.dir && !keep && cli_cache_begin("chat", &o.cache, m, c, ids, n, &skip)) { free(ids); rc = 1; break; }
        acc.n = 0;
        if (acc.buf) acc.buf[0] = 0;
        cinfer_gen_stats s;
        cinfer_status st = cinfer_generate(c, ids + keep + skip, n - keep - skip, &o.sp, o.max_tokens, chat_cb, &acc, &s);
        free(ids);
        if (st) { fprintf(stderr, "\ncinfer chat: %s\n", cinfer_ctx_error(c)); rc = 1; break; }
        json_array_append_new(msgs, json_pack("{s:s,s:s}", "role", "assistant", "content", acc.buf ? acc.buf : ""));
        fprintf(stderr, "\n[%d tokens, %.1f tok/s]", s.gen_tokens, s.gen_s > 0 ? s.gen_tokens / s.gen_s : 0.0);
    }
    cli_cache_end(&o.cache, NULL);
    json_decref(msgs);
    free(acc.buf);
    free(acc.fed);
    cinfer_ctx_free(c);
    cinfer_model_free(m);
    return rc;
}
