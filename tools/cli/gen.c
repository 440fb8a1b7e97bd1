/*
 * gen.c — see gen.h. Flags follow mlx_lm.generate (--max-tokens, --temp,
 * --top-p, --min-p, --seed, --system-prompt, --ignore-chat-template,
 * --chat-template, --extra-eos-token) and llama.cpp (--seed -1 = random,
 * -n -1 = until EOS or the context limit, --stop, -f FILE).
 */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include "gen.h"

static void gen_help(FILE *f, const char *cmd) {
    int chat = !strcmp(cmd, "chat");
    fprintf(f,
        "usage: cinfer %s -m DIR [options]\n\n"
        "%s"
        "  -m, --model DIR            model directory (config.json, *.safetensors, tokenizer.json)\n"
        "%s"
        "  -n, --max-tokens N         tokens to generate, -1 = until EOS or the context limit (default %d)\n"
        "      --temp T               sampling temperature; 0 = greedy (default 0)\n"
        "      --top-k K              keep the K most likely tokens (default 0 = off)\n"
        "      --top-p P              nucleus sampling mass (default 1 = off)\n"
        "      --min-p P              drop tokens below P x the top probability (default 0 = off)\n"
        "      --repetition-penalty R penalise recent tokens (default 1 = off)\n"
        "      --repetition-context-size N  tokens the penalty looks back on (default 20)\n"
        "      --seed S               random seed: the same seed gives the same output; -1 or none = random\n"
        "      --stop STR             stop when the text contains STR (not printed); repeatable\n"
        "      --extra-eos-token T    one more token (a piece or an id) that ends generation; repeatable\n"
        "      --system-prompt TEXT   system prompt for the chat template (alias --system)\n"
        "      --chat-template T      Jinja chat template: a file, or the template text itself\n"
        "%s"
        "  -t, --threads N            CPU threads (default: all cores)\n"
        "      --device cpu|cuda      backend (default cpu)\n"
        "      --kv-f16               keep the KV cache in f16\n"
        CLI_KV_HELP
        CLI_CACHE_HELP
        "%s"
        "  -h, --help                 this help\n",
        cmd,
        chat ? "Interactive chat through the model's chat template (or --chat-template): one line\n"
               "per user turn. Commands: q quits, r resets the conversation, h shows them; an empty\n"
               "line or end of input quits.\n\n"
             : "Generates text after a prompt and prints only the generated text (and a newline)\n"
               "on stdout, as mlx_lm.generate does; prompt and generation speed, peak memory and\n"
               "why it stopped go to stderr. The prompt goes through the tokenizer's chat\n"
               "template when it has one. A model without a tokenizer prints the generated ids.\n\n",
        chat ? "" : "  -p, --prompt TEXT          prompt (default: start from BOS); '-' reads stdin\n"
                    "  -f, --file FILE            read the prompt from FILE\n"
                    "      --tokens 1,2,3         feed exactly these token ids (no BOS, no template)\n",
        chat ? 256 : 100,
        chat ? "" : "      --ignore-chat-template use the prompt as is (BOS added as the tokenizer says)\n"
                    "      --chat                 require the chat template (fail when there is none)\n",
        chat ? "" : "      --json                 print one JSON object on stdout: text, tokens, logprobs,\n"
                    "                             finish_reason and the statistics (nothing else)\n"
                    "  -q, --quiet                no statistics on stderr\n");
}

static int add_multi(const char *cmd, const char *flag, const char **v, int *n, int max, const char *a) {
    if (*n == max) { fprintf(stderr, "cinfer %s: at most %d %s flags\n", cmd, max, flag); return 0; }
    if (!*a) { fprintf(stderr, "cinfer %s: %s wants a non-empty value\n", cmd, flag); return 0; }
    v[(*n)++] = a;
    return 1;
}

static int random_seed(uint64_t *s) {
    return getrandom(s, sizeof *s, 0) == (ssize_t)sizeof *s;
}

int gen_parse(const char *cmd, int argc, char **argv, gen_opts *o) {
    static const struct option lo[] = {
        {"model", 1, 0, 'm'}, {"prompt", 1, 0, 'p'}, {"max-tokens", 1, 0, 'n'}, {"temp", 1, 0, 1},
        {"top-k", 1, 0, 2}, {"top-p", 1, 0, 3}, {"min-p", 1, 0, 4}, {"repetition-penalty", 1, 0, 5},
        {"repetition-context-size", 1, 0, 6}, {"seed", 1, 0, 7}, {"threads", 1, 0, 't'}, {"device", 1, 0, 8},
        {"chat", 0, 0, 9}, {"system", 1, 0, 10}, {"system-prompt", 1, 0, 10}, {"json", 0, 0, 11},
        {"kv-f16", 0, 0, 12}, {"tokens", 1, 0, 13}, {"file", 1, 0, 'f'}, {"stop", 1, 0, 14},
        {"extra-eos-token", 1, 0, 15}, {"ignore-chat-template", 0, 0, 16}, {"chat-template", 1, 0, 17},
        {"quiet", 0, 0, 'q'}, {"help", 0, 0, 'h'}, CLI_KV_LONGOPTS, CLI_CACHE_LONGOPTS, {0, 0, 0, 0}};
    static const char *shortopts = "m:p:n:t:f:qh";
    int chat = !strcmp(cmd, "chat");
    memset(o, 0, sizeof *o);
    o->max_tokens = chat ? 256 : 100;
    o->sp = cinfer_sampler_defaults();
    o->sp.rep_last_n = 20;
    o->co.quantized_kv_start = 5000;   /* mlx_lm.generate's default */
    if (!cli_getopt_begin(cmd, argc, argv, shortopts, lo)) return 2;
    int c, seed = -1;
    while ((c = getopt_long(argc, argv, shortopts, lo, NULL)) != -1) {
        int kv = cli_kv_flag(cmd, c, optarg, &o->co);
        if (!kv) kv = cli_cache_flag(cmd, c, optarg, &o->cache);
        if (kv < 0) return 2;
        if (kv) continue;
        switch (c) {
        case 'm': o->model = optarg; break;
        case 'p': o->prompt = optarg; break;
        case 'f': o->file = optarg; break;
        case 'n': if (!cli_int(cmd, "--max-tokens", optarg, -1, 1 << 24, &o->max_tokens)) return 2; break;
        case 1: if (!cli_float(cmd, "--temp", optarg, &o->sp.temp)) return 2; break;
        case 2: if (!cli_int(cmd, "--top-k", optarg, 0, 1 << 30, &o->sp.top_k)) return 2; break;
        case 3: if (!cli_float(cmd, "--top-p", optarg, &o->sp.top_p)) return 2; break;
        case 4: if (!cli_float(cmd, "--min-p", optarg, &o->sp.min_p)) return 2; break;
        case 5: if (!cli_float(cmd, "--repetition-penalty", optarg, &o->sp.rep_penalty)) return 2; break;
        case 6: if (!cli_int(cmd, "--repetition-context-size", optarg, 0, 1 << 30, &o->sp.rep_last_n)) return 2; break;
        case 7: if (!cli_int(cmd, "--seed", optarg, -1, 2147483647, &seed)) return 2; break;
        case 't': if (!cli_int(cmd, "--threads", optarg, 1, 1024, &o->threads)) return 2; break;
        case 8: o->device = optarg; break;
        case 9: o->chat = 1; break;
        case 10: o->system = optarg; break;
        case 11: o->json = 1; break;
        case 12: o->kv_f16 = 1; break;
        case 13: o->tokens = optarg; break;
        case 14: if (!add_multi(cmd, "--stop", o->stop, &o->n_stop, GEN_MAX_STOP, optarg)) return 2; break;
        case 15: if (!add_multi(cmd, "--extra-eos-token", o->extra_eos_arg, &o->n_extra_eos_arg, GEN_MAX_EOS, optarg)) return 2; break;
        case 16: o->no_chat = 1; break;
        case 17: o->chat_template = optarg; break;
        case 'q': o->quiet = 1; break;
        case 'h': gen_help(stdout, cmd); return -1;
        default:
            cli_bad_option(cmd, argv, optopt);
            return 2;
        }
    }
    if (!cli_no_more_args(cmd, argc, argv)) return 2;
    if (!o->model) { fprintf(stderr, "cinfer %s: -m DIR is required (try --help)\n", cmd); return 2; }
    if (chat && (o->json || o->quiet)) { fprintf(stderr, "cinfer chat: %s is for generate (chat is interactive text)\n", o->json ? "--json" : "--quiet"); return 2; }
    if (o->sp.temp < 0) { fprintf(stderr, "cinfer %s: --temp must be >= 0 (got %g)\n", cmd, o->sp.temp); return 2; }
    if (!(o->sp.top_p > 0 && o->sp.top_p <= 1)) { fprintf(stderr, "cinfer %s: --top-p must be in (0, 1] (got %g)\n", cmd, o->sp.top_p); return 2; }
    if (!(o->sp.min_p >= 0 && o->sp.min_p <= 1)) { fprintf(stderr, "cinfer %s: --min-p must be in [0, 1] (got %g)\n", cmd, o->sp.min_p); return 2; }
    if (!(o->sp.rep_penalty > 0)) { fprintf(stderr, "cinfer %s: --repetition-penalty must be > 0 (got %g)\n", cmd, o->sp.rep_penalty); return 2; }
    int inputs = !!o->prompt + !!o->file + !!o->tokens;
    if (inputs > 1) { fprintf(stderr, "cinfer %s: give one of -p TEXT, -f FILE or --tokens, not several\n", cmd); return 2; }
    if (o->chat && o->no_chat) { fprintf(stderr, "cinfer %s: --chat and --ignore-chat-template contradict each other\n", cmd); return 2; }
    if (o->tokens && (o->chat || o->system || o->chat_template)) {
        fprintf(stderr, "cinfer %s: --tokens feeds ids as they are; it takes no --chat, --system-prompt or --chat-template\n", cmd);
        return 2;
    }
    if (o->no_chat && (o->system || o->chat_template)) {
        fprintf(stderr, "cinfer %s: --ignore-chat-template leaves no template for %s\n", cmd, o->system ? "--system-prompt" : "--chat-template");
        return 2;
    }
    if (o->cache.file && (chat || !inputs)) {
        fprintf(stderr, "cinfer %s: --prompt-cache-file %s\n", cmd, chat ? "is for generate: mlx_lm.chat has no such flag (its cache lives only in memory); "
                                                                                "for a chat that reuses its prefixes across runs give --cache-dir DIR"
                                                                         : "needs the prompt that follows the cached one (-p, -f or --tokens)");
        return 2;
    }
    if (seed >= 0) { o->sp.seed = (uint64_t)seed; o->seeded = 1; }
    else if (!random_seed(&o->sp.seed)) { fprintf(stderr, "cinfer %s: no random seed available (give --seed N)\n", cmd); return 1; }
    if (o->chat_template) {   /* a readable file is read; anything else is the template itself */
        size_t len;
        o->template_text = cli_read_file(o->chat_template, &len, NULL);
        if (!o->template_text && !strstr(o->chat_template, "{")) {
            fprintf(stderr, "cinfer %s: --chat-template '%s' is neither a readable file nor a template\n", cmd, o->chat_template);
            return 2;
        }
    }
    return 0;
}

void gen_opts_free(gen_opts *o) {
    free(o->template_text);
    o->template_text = NULL;
}

const char *gen_template(const gen_opts *o) {
    if (!o->chat_template) return NULL;   /* the tokenizer's own */
    return o->template_text ? o->template_text : o->chat_template;
}

char *gen_render(const char *cmd, const gen_opts *o, const cinfer_tokenizer *t, json_t *msgs) {
    char *js = json_dumps(msgs, JSON_COMPACT), *out = NULL, err[512];
    const char *src = gen_template(o);
    cinfer_status st = js ? cinfer_chat_render_with(t, src, js, NULL, NULL, 1, &out, err, sizeof err) : CINFER_ENOMEM;
    free(js);
    if (st) { fprintf(stderr, "cinfer %s: chat template: %s\n", cmd, st == CINFER_ENOMEM ? "out of memory" : err); return NULL; }
    return out;
}

int gen_extra_eos(const char *cmd, const gen_opts *o, cinfer_model *m, int32_t *ids, int *n) {
    const cinfer_tokenizer *t = cinfer_model_tokenizer(m);
    cinfer_model_info info;
    cinfer_model_get_info(m, &info);
    *n = 0;
    for (int i = 0; i < o->n_extra_eos_arg; i++) {
        const char *a = o->extra_eos_arg[i];
        char *e;
        long v = strtol(a, &e, 10);
        int32_t *tk = NULL;
        int nt = 0;
        if (!*e && v >= 0 && v < info.n_vocab) ids[(*n)++] = (int32_t)v;
        else if (t && !cinfer_tokenize(t, a, strlen(a), 0, 1, &tk, &nt) && nt == 1) ids[(*n)++] = tk[0];
        else {
            fprintf(stderr, "cinfer %s: --extra-eos-token '%s' is not one token of the vocabulary (nor an id < %d)\n", cmd, a, info.n_vocab);
            free(tk);
            return 0;
        }
        free(tk);
    }
    return 1;
}

const char *gen_finish_name(int r) {
    return r == CINFER_FINISH_STOP ? "stop" : r == CINFER_FINISH_CONTEXT ? "context" : "length";
}

static void emit(gen_out *g, size_t upto) {
    if (!g->stream || upto <= g->printed) { if (upto > g->printed) g->printed = upto; return; }
    if (fwrite(g->text + g->printed, 1, upto - g->printed, stdout) != upto - g->printed || fflush(stdout)) g->write_failed = 1;
    g->printed = upto;
}

/* bytes at the end of the text that begin a stop string: held back */
static size_t held(const gen_out *g) {
    size_t h = 0;
    for (int s = 0; s < g->o->n_stop; s++) {
        size_t ls = strlen(g->o->stop[s]);
        for (size_t k = ls - 1; k > h; k--)
            if (k <= g->n && !memcmp(g->text + g->n - k, g->o->stop[s], k)) { h = k; break; }
    }
    return h;
}

int gen_out_token(int32_t tok, const char *text, float lp, void *user) {
    gen_out *g = user;
    if (g->ids && tok >= 0) {
        json_array_append_new(g->ids, json_integer(tok));
        json_t *v = lp == lp ? json_real(lp) : NULL;   /* finite by construction; null otherwise */
        json_array_append_new(g->lps, v ? v : json_null());
    }
    char idbuf[16];
    if (!text) {   /* a model without a tokenizer: the ids are the output */
        if (tok < 0) return 0;
        snprintf(idbuf, sizeof idbuf, "%s%d", g->n ? " " : "", (int)tok);
        text = idbuf;
    }
    size_t k = strlen(text), from = g->n;
    if (g->n + k + 1 > g->cap) {
        size_t nc = (g->n + k + 1) * 2;
        char *nt = realloc(g->text, nc);
        if (!nt) return 1;
        g->text = nt;
        g->cap = nc;
    }
    memcpy(g->text + g->n, text, k + 1);
    g->n += k;
    size_t cut = g->n;
    for (int s = 0; s < g->o->n_stop; s++) {   /* a match may start in earlier text; the earliest wins */
        size_t ls = strlen(g->o->stop[s]);
        size_t start = from >= ls - 1 ? from - (ls - 1) : 0;
        char *hit = start < g->n ? memmem(g->text + start, g->n - start, g->o->stop[s], ls) : NULL;
        if (hit && (size_t)(hit - g->text) < cut) {
            cut = (size_t)(hit - g->text);
            g->stopped = 1;
        }
    }
    if (g->stopped) {   /* the text before the stop string is out; nothing after it ever is */
        g->n = cut;
        g->text[cut] = 0;
        emit(g, g->n);
        return 1;
    }
    emit(g, g->n - held(g));
    return g->write_failed;
}

void gen_out_finish(gen_out *g) {
    emit(g, g->n);
}

void gen_out_free(gen_out *g) {
    free(g->text);
    json_decref(g->ids);
    json_decref(g->lps);
}
