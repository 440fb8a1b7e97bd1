/*
 * cmd-chat.c — `cinfer chat`: interactive, through the chat template, as
 * mlx_lm.chat (q quits, r resets, h lists the commands). Fails at start when
 * there is no template (--chat-template gives one). The KV cache is kept
 * between turns and only the part of each new rendering that differs from
 * the tokens already cached is fed. Lines may be of any length; a turn
 * that no longer fits the model's context is refused with a message (r
 * starts over) and the conversation continues.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "gen.h"

/* every token id fed to the cache, to find the prefix a new rendering shares */
typedef struct fed_ids { int32_t *v; int n, cap; } fed_ids;

static int fed_push(fed_ids *f, int32_t tok) {
    if (f->n == f->cap) {
        int nc = f->cap ? f->cap * 2 : 256;
        int32_t *nv = realloc(f->v, sizeof *nv * nc);
        if (!nv) return 0;
        f->v = nv;
        f->cap = nc;
    }
    f->v[f->n++] = tok;
    return 1;
}

typedef struct chat_turn { gen_out out; fed_ids gen; } chat_turn;

static int chat_token(int32_t tok, const char *text, float lp, void *user) {
    chat_turn *t = user;
    if (tok >= 0 && !fed_push(&t->gen, tok)) return 1;
    return gen_out_token(tok, text, lp, &t->out);
}

static const char *chat_commands = "commands: q quits, r resets the conversation, h shows this\n";

/* one user turn: render, feed the new part, generate; 0 ok, 1 fatal, 2 refused (conversation kept) */
static int chat_turn_run(const gen_opts *o, cinfer_ctx *c, const cinfer_tokenizer *t, json_t *msgs, fed_ids *fed,
                         const cinfer_gen_opts *go, cinfer_model *m, cli_cache *cc) {
    char *text = gen_render("chat", o, t, msgs);
    int32_t *ids = NULL;
    int n = 0;
    if (!text || cinfer_tokenize(t, text, strlen(text), 0, 1, &ids, &n) || n < 1) { free(text); free(ids); return 1; }
    free(text);
    int keep = 0, have = cinfer_ctx_pos(c);
    while (keep < have && keep < n - 1 && keep < fed->n && fed->v[keep] == ids[keep]) keep++;
    cinfer_ctx_trim(c, keep);
    if (cinfer_ctx_pos(c) < keep) keep = cinfer_ctx_pos(c);   /* a window that dropped keys cannot go back */
    fed->n = keep;
    int skip = 0;   /* --cache-dir: a rendering that shares nothing with the cache may start from disk */
    if (cc->dir && !keep && cli_cache_begin("chat", cc, m, c, ids, n, &skip)) { free(ids); return 1; }
    chat_turn turn = {{.o = o, .stream = 1}, {0}};
    cinfer_gen_stats s;
    cinfer_status st = cinfer_generate_ex(c, ids + keep + skip, n - keep - skip, &o->sp, go, chat_token, &turn, &s);
    /* what the cache now holds, in order (the last id may not be fed yet: the
     * next turn's match is bounded by the cache's length) */
    for (int i = keep; !st && i < n; i++) fed_push(fed, ids[i]);
    for (int i = 0; !st && i < turn.gen.n; i++) fed_push(fed, turn.gen.v[i]);
    free(turn.gen.v);
    free(ids);
    gen_out_finish(&turn.out);
    int rc = 0;
    if (st) {
        fprintf(stderr, "\ncinfer chat: %s\n", cinfer_ctx_error(c));
        rc = st == CINFER_EINVAL ? 2 : 1;   /* a turn that does not fit: say so, keep going */
        cinfer_ctx_trim(c, keep);
        fed->n = keep;
    } else {
        json_array_append_new(msgs, json_pack("{s:s,s:s}", "role", "assistant", "content", turn.out.text ? turn.out.text : ""));
        if (fputc('\n', stdout) == EOF || fflush(stdout)) turn.out.write_failed = 1;
        fprintf(stderr, "[%d tokens, %.1f tok/s%s]", s.gen_tokens, s.gen_s > 0 ? s.gen_tokens / s.gen_s : 0.0,
                s.finish_reason == CINFER_FINISH_CONTEXT ? ", context full: r resets" : "");
        if (turn.out.write_failed) rc = 1;
    }
    gen_out_free(&turn.out);
    return rc;
}

int cmd_chat(int argc, char **argv) {
    gen_opts o;
    int rc = gen_parse("chat", argc, argv, &o);
    if (rc) return rc < 0 ? 0 : rc;
    cinfer_model *m = cli_load_model("chat", o.model, o.device, o.threads);
    if (!m) { gen_opts_free(&o); return 1; }
    const cinfer_tokenizer *t = cinfer_model_tokenizer(m);
    cinfer_ctx *c = NULL;
    char err[512];
    int32_t eos[GEN_MAX_EOS];
    int n_eos = 0;
    cinfer_ctx_opts co = o.co;
    co.n_threads = o.threads;
    co.kv_f16 = o.kv_f16;
    if (!t) { fprintf(stderr, "cinfer chat: %s has no tokenizer.json\n", o.model); rc = 1; }
    else if (!o.chat_template && !cinfer_tokenizer_has_chat_template(t)) {
        fprintf(stderr, "cinfer chat: %s has no chat template (tokenizer_config.json \"chat_template\"); give one with --chat-template FILE|TEXT\n", o.model);
        rc = 1;
    } else if (!gen_extra_eos("chat", &o, m, eos, &n_eos)) rc = 2;
    else if (cinfer_ctx_new(m, &co, &c, err, sizeof err)) { fprintf(stderr, "cinfer chat: %s\n", err); rc = 1; }
    cinfer_gen_opts go = cinfer_gen_defaults();
    go.max_tokens = o.max_tokens;
    go.extra_eos = eos;
    go.n_extra_eos = n_eos;
    json_t *msgs = json_array();
    fed_ids fed = {0};
    if (o.system) json_array_append_new(msgs, json_pack("{s:s,s:s}", "role", "system", "content", o.system));
    char *line = NULL;
    size_t lcap = 0;
    if (!rc) fprintf(stderr, "%s", chat_commands);
    while (!rc) {
        fprintf(stderr, "\n> ");
        ssize_t got = getline(&line, &lcap, stdin);
        if (got < 0) break;
        line[strcspn(line, "\r\n")] = 0;
        if (!line[0] || !strcmp(line, "q")) break;
        if (!strcmp(line, "h")) { fprintf(stderr, "%s", chat_commands); continue; }
        if (!strcmp(line, "r")) {
            json_array_clear(msgs);
            if (o.system) json_array_append_new(msgs, json_pack("{s:s,s:s}", "role", "system", "content", o.system));
            cinfer_ctx_reset(c);
            fed.n = 0;
            fprintf(stderr, "(conversation reset)");
            continue;
        }
        json_t *um = json_pack("{s:s,s:s}", "role", "user", "content", line);
        if (!um) { fprintf(stderr, "cinfer chat: the line is not UTF-8 text\n"); continue; }
        json_array_append_new(msgs, um);
        rc = chat_turn_run(&o, c, t, msgs, &fed, &go, m, &o.cache);
        if (rc == 2) { json_array_remove(msgs, json_array_size(msgs) - 1); rc = 0; }
    }
    free(line);
    json_decref(msgs);
    free(fed.v);
    cli_cache_end(&o.cache, NULL);
    gen_opts_free(&o);
    cinfer_ctx_free(c);
    cinfer_model_free(m);
    return rc;
}
