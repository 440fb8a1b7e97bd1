/*
 * gen.h — what `cinfer generate` and `cinfer chat` share: their flags (as
 * mlx_lm.generate / mlx_lm.chat and llama.cpp spell them), the prompt
 * through the chat template, and the output of generated text with stop
 * strings held back until they can no longer match.
 */
#ifndef CINFER_CLI_GEN_H
#define CINFER_CLI_GEN_H
#include <jansson.h>
#include "cli.h"

#define GEN_MAX_STOP 16
#define GEN_MAX_EOS 16

typedef struct gen_opts {
    const char *model, *prompt, *file, *device, *system, *tokens, *chat_template, *extra_eos_arg[GEN_MAX_EOS];
    const char *stop[GEN_MAX_STOP];
    int n_stop, n_extra_eos_arg;
    int max_tokens, threads, chat, no_chat, json, kv_f16, quiet, seeded;
    char *template_text;     /* --chat-template FILE's contents (malloc'd) or NULL */
    cinfer_sampler_params sp;
    cinfer_ctx_opts co;      /* the KV-cache flags (cli_kv_flag) */
    cli_cache cache;         /* --prompt-cache-file, --cache-dir (cli_cache_flag) */
} gen_opts;

/* parses the flags; 0 ok, 2 usage error, -1 help printed */
int gen_parse(const char *cmd, int argc, char **argv, gen_opts *o);
void gen_opts_free(gen_opts *o);
/* the --chat-template source, or NULL for the tokenizer's own */
const char *gen_template(const gen_opts *o);
/* renders messages (+ the assistant's opening) through the template; malloc'd */
char *gen_render(const char *cmd, const gen_opts *o, const cinfer_tokenizer *t, json_t *msgs);
/* --extra-eos-token values -> ids; 0 ok, else prints the problem */
int gen_extra_eos(const char *cmd, const gen_opts *o, cinfer_model *m, int32_t *ids, int *n);

/* generated text on its way to stdout: stop strings are matched across
 * tokens and cut (the text before one is printed, the rest never is) */
typedef struct gen_out {
    const gen_opts *o;
    char *text;          /* everything generated so far (after a stop: up to it) */
    size_t n, cap, printed;
    int stream;          /* print as it comes (not --json) */
    int stopped;         /* a stop string matched */
    int write_failed;
    json_t *ids, *lps;   /* --json: generated ids and log-probs */
} gen_out;

/* the cinfer_token_lp_cb of generate and chat: appends, prints, stops */
int gen_out_token(int32_t tok, const char *text, float lp, void *user);
/* prints what a pending stop-string prefix held back (end of generation) */
void gen_out_finish(gen_out *g);
void gen_out_free(gen_out *g);
/* "stop", "length" or "context" */
const char *gen_finish_name(int finish_reason);
#endif
