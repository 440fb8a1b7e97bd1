/*
 * cmd-generate.c — `cinfer generate`: one prompt, as mlx_lm.generate runs
 * it. stdout holds only the generated text and a final newline (no prompt
 * echo), or with --json exactly one JSON object (text, tokens, logprobs,
 * finish_reason and the statistics) and nothing else; the statistics go to
 * stderr in mlx_lm.generate's form (--quiet drops them). The prompt goes
 * through the chat template when the tokenizer has one (--ignore-chat-template
 * feeds it as is). Generation ends at an eos id, a --stop string, max tokens
 * or the model's context limit, and says which.
 */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "gen.h"

/* prompt -> ids: --tokens, the chat template, plain text with BOS, or just BOS */
static int prompt_ids(const gen_opts *o, cinfer_model *m, const char *text, size_t len, int32_t **ids, int *n) {
    const cinfer_tokenizer *t = cinfer_model_tokenizer(m);
    cinfer_model_info info;
    cinfer_model_get_info(m, &info);
    if (o->tokens) {
        if (!cli_parse_ids(o->tokens, ids, n)) { fprintf(stderr, "cinfer generate: --tokens wants ids like 1,2,3\n"); return 2; }
        return 0;
    }
    if (text && memchr(text, 0, len)) {
        fprintf(stderr, "cinfer generate: the prompt holds a NUL byte (at byte %zu): prompts are text\n", (size_t)((const char *)memchr(text, 0, len) - text));
        return 2;
    }
    if (!t && (text || o->chat || o->system)) { fprintf(stderr, "cinfer generate: %s has no tokenizer.json; pass --tokens\n", o->model); return 1; }
    int templ = text && !o->no_chat && (o->chat_template || cinfer_tokenizer_has_chat_template(t));
    if ((o->chat || o->system) && !templ) {
        if (!text) fprintf(stderr, "cinfer generate: %s needs a prompt (-p TEXT or -f FILE)\n", o->chat ? "--chat" : "--system-prompt");
        else fprintf(stderr, "cinfer generate: %s needs a chat template and %s has none (give --chat-template FILE|TEXT)\n",
                     o->chat ? "--chat" : "--system-prompt", o->model);
        return text ? 1 : 2;
    }
    char *rendered = NULL;
    if (templ) {
        json_t *msgs = json_array();
        if (o->system) json_array_append_new(msgs, json_pack("{s:s,s:s}", "role", "system", "content", o->system));
        json_array_append_new(msgs, json_pack("{s:s,s:s}", "role", "user", "content", text));
        rendered = gen_render("generate", o, t, msgs);
        if (rendered && o->cache.file) {   /* the file holds the rendering up to the user's text (cli_cache_cut) */
            json_object_set_new(json_array_get(msgs, json_array_size(msgs) - 1), "content", json_string("<query>"));
            char *test = gen_render("generate", o, t, msgs), *cut = test ? cli_cache_cut("generate", rendered, test, 0) : NULL;
            free(test);
            free(rendered);
            rendered = cut;
        }
        json_decref(msgs);
        if (!rendered) return 1;
        text = rendered;
        len = strlen(rendered);
    }
    if (!text || !len) {
        int bos = t ? cinfer_tokenizer_bos(t) : -1;
        if (bos < 0) bos = info.bos;
        if (bos < 0) { fprintf(stderr, "cinfer generate: no prompt and the model has no BOS token\n"); return 2; }
        *ids = malloc(sizeof(int32_t));
        if (!*ids) return 1;
        (*ids)[0] = bos;
        *n = 1;
        return 0;
    }
    cinfer_status st = cinfer_tokenize(t, text, len, !templ && !o->cache.file, 1, ids, n);
    free(rendered);
    if (st || *n < 1) { fprintf(stderr, "cinfer generate: could not tokenize the prompt (%s)\n", cinfer_status_str(st)); return 1; }
    return 0;
}

static json_t *num_or_null(double v) { return v == v && v - v == 0 ? json_real(v) : json_null(); }

static void print_result(const gen_opts *o, const gen_out *g, const cinfer_gen_stats *s, int finish, const cinfer_model *m) {
    cinfer_model_info mi;
    cinfer_model_get_info(m, &mi);
    double pps = s->prompt_s > 0 ? s->prompt_tokens / s->prompt_s : 0;
    double gps = s->gen_s > 0 ? s->gen_tokens / s->gen_s : 0;
    if (o->json) {
        json_t *j = json_object();
        json_object_set_new(j, "text", json_stringn(g->text ? g->text : "", g->n));
        json_object_set(j, "tokens", g->ids);
        json_object_set(j, "logprobs", g->lps);
        json_object_set_new(j, "finish_reason", json_string(gen_finish_name(finish)));
        json_object_set_new(j, "prompt_tokens", json_integer(s->prompt_tokens));
        json_object_set_new(j, "prompt_tps", num_or_null(pps));
        json_object_set_new(j, "generation_tokens", json_integer(s->gen_tokens));
        json_object_set_new(j, "generation_tps", num_or_null(gps));
        json_object_set_new(j, "peak_memory_gb", num_or_null(s->peak_memory / 1e9));
        json_object_set_new(j, "kv_bytes", json_integer((json_int_t)s->kv_bytes));
        json_object_set_new(j, "weight_types", json_string(mi.weight_types));
        json_object_set_new(j, "bits_per_weight", num_or_null(mi.bits_per_weight));
        if (o->cache.file || o->cache.dir) json_object_set_new(j, "prompt_cached_tokens", json_integer(o->cache.cached));
        char *js = json_dumps(j, JSON_PRESERVE_ORDER | JSON_REAL_PRECISION(9));
        if (js) puts(js);
        free(js);
        json_decref(j);
        return;
    }
    fputc('\n', stdout);
    if (o->quiet) return;
    fprintf(stderr, "==========\nPrompt: %d tokens, %.3f tokens-per-sec\nGeneration: %d tokens, %.3f tokens-per-sec\n"
            "Peak memory: %.3f GB\nWeights: %s, %.2f bits per weight\n", s->prompt_tokens, pps, s->gen_tokens, gps,
            s->peak_memory / 1e9, mi.weight_types, mi.bits_per_weight);
    if (finish == CINFER_FINISH_CONTEXT)
        fprintf(stderr, "Stopped at the model's context limit (%d positions, max_position_embeddings)\n", s->prompt_tokens + s->gen_tokens);
}

int cmd_generate(int argc, char **argv) {
    gen_opts o;
    int rc = gen_parse("generate", argc, argv, &o);
    if (rc) return rc < 0 ? 0 : rc;
    char *input = NULL;
    size_t len = o.prompt ? strlen(o.prompt) : 0;
    const char *text = o.prompt;
    if (o.file || (o.prompt && !strcmp(o.prompt, "-"))) {
        const char *why, *path = o.file ? o.file : "-";
        input = cli_read_file(path, &len, &why);
        if (!input) {
            fprintf(stderr, "cinfer generate: cannot read the prompt from %s: %s\n", o.file ? o.file : "standard input", why);
            gen_opts_free(&o);
            return 1;
        }
        text = input;
    }
    cinfer_model *m = cli_load_model("generate", o.model, o.device, o.threads);
    int32_t *ids = NULL, eos[GEN_MAX_EOS];
    int n = 0, n_eos = 0;
    cinfer_ctx *c = NULL;
    char err[512];
    rc = m ? prompt_ids(&o, m, text, len, &ids, &n) : 1;
    if (!rc && !gen_extra_eos("generate", &o, m, eos, &n_eos)) rc = 2;
    cinfer_ctx_opts co = o.co;
    co.n_threads = o.threads;
    co.kv_f16 = o.kv_f16;
    if (!rc && cinfer_ctx_new(m, &co, &c, err, sizeof err)) { fprintf(stderr, "cinfer generate: %s\n", err); rc = 1; }
    int skip = 0;
    if (!rc) rc = cli_cache_begin("generate", &o.cache, m, c, ids, n, &skip);
    if (!rc) {
        cinfer_gen_stats s;
        cinfer_gen_opts go = cinfer_gen_defaults();
        go.max_tokens = o.max_tokens;
        go.extra_eos = eos;
        go.n_extra_eos = n_eos;
        go.logprobs = o.json;
        go.report_eos = o.json;
        gen_out g = {.o = &o, .stream = !o.json};
        if (o.json) { g.ids = json_array(); g.lps = json_array(); }
        cinfer_status st = cinfer_generate_ex(c, ids + skip, n - skip, &o.sp, &go, gen_out_token, &g, &s);
        cli_cache_end(&o.cache, &s);
        gen_out_finish(&g);
        if (st) { fprintf(stderr, "%scinfer generate: %s\n", g.printed ? "\n" : "", cinfer_ctx_error(c)); rc = 1; }
        else if (g.write_failed) rc = 0;   /* main() reports the failed write */
        else print_result(&o, &g, &s, g.stopped ? CINFER_FINISH_STOP : s.finish_reason, m);
        gen_out_free(&g);
    }
    cli_cache_end(&o.cache, NULL);
    free(ids);
    free(input);
    gen_opts_free(&o);
    cinfer_ctx_free(c);
    cinfer_model_free(m);
    return rc;
}
