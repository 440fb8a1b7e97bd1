/*
 * serve-req.c — an OpenAI request body to a srv_req. Every field is hostile:
 * types, ranges and counts are checked, and a bad field is a 400 that names
 * it (OpenAI's error shape: message + param). Unknown fields are ignored, as
 * mlx_lm.server does. Prompts are tokenized here, on the HTTP thread, so the
 * engine only ever sees token ids. Chat messages go through the model's chat
 * template, or the one given by --chat-template.
 */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "serve.h"
#include "tokenizer/chat-template.h"
#include "tokenizer/tokenizer.h"

srv_req *srv_req_new(void) {
    srv_req *r = calloc(1, sizeof *r);
    if (!r) return NULL;
    pthread_mutex_init(&r->mu, NULL);
    pthread_cond_init(&r->cv, NULL);
    atomic_init(&r->refs, 1);
    atomic_init(&r->cancelled, 0);
    r->n_choices = 1;
    r->t_start = srv_now();
    return r;
}

void srv_req_unref(srv_req *r) {
    if (!r || atomic_fetch_sub(&r->refs, 1) != 1) return;
    for (int i = 0; i < r->n_ev; i++) { free(r->ev[i].text); free(r->ev[i].tok_text); }
    for (int i = 0; i < r->n_stop; i++) free(r->stop[i]);
    free(r->ev);
    free(r->pev);
    free(r->prompt);
    free(r->prompt_text);
    free(r->bias_id);
    free(r->bias_val);
    pthread_mutex_destroy(&r->mu);
    pthread_cond_destroy(&r->cv);
    free(r);
}

void srv_req_push(srv_req *r, srv_event *ev) {
    pthread_mutex_lock(&r->mu);
    if (r->n_ev == r->cap_ev) {
        int nc = r->cap_ev ? r->cap_ev * 2 : 64;
        srv_event *ne = realloc(r->ev, sizeof *ne * nc);
        if (!ne) {   /* the client loses this token's text; the request still ends */
            free(ev->text);
            free(ev->tok_text);
            pthread_mutex_unlock(&r->mu);
            return;
        }
        r->ev = ne;
        r->cap_ev = nc;
    }
    r->ev[r->n_ev++] = *ev;
    pthread_cond_broadcast(&r->cv);
    pthread_mutex_unlock(&r->mu);
}

/* ------------------------------------------------------------ field checks */

typedef struct perr { char *msg; size_t n; char *param; size_t pn; } perr;

static int bad(perr *e, const char *field, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int bad(perr *e, const char *field, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(e->msg, e->n, fmt, ap);
    va_end(ap);
    snprintf(e->param, e->pn, "%s", field);
    return 400;
}

/* a number field: absent -> def; present must be a finite number in [lo, hi] */
static int get_num(json_t *o, const char *k, double lo, double hi, double def, double *out, perr *e) {
    json_t *v = json_object_get(o, k);
    *out = def;
    if (!v || json_is_null(v)) return 0;
    if (!json_is_number(v)) return bad(e, k, "'%s' must be a number", k);
    double x = json_number_value(v);
    if (!isfinite(x) || x < lo || x > hi) return bad(e, k, "'%s' must be between %g and %g (got %g)", k, lo, hi, x);
    *out = x;
    return 0;
}

/* an integer field (an integral real such as 5.0 is accepted) in [lo, hi] */
static int get_int(json_t *o, const char *k, long long lo, long long hi, long long def, long long *out, perr *e) {
    json_t *v = json_object_get(o, k);
    *out = def;
    if (!v || json_is_null(v)) return 0;
    long long x;
    if (json_is_integer(v)) x = json_integer_value(v);
    else if (json_is_real(v) && json_real_value(v) == floor(json_real_value(v)) && fabs(json_real_value(v)) < 9e15)
        x = (long long)json_real_value(v);
    else return bad(e, k, "'%s' must be an integer", k);
    if (x < lo || x > hi) return bad(e, k, "'%s' must be between %lld and %lld (got %lld)", k, lo, hi, x);
    *out = x;
    return 0;
}

static int get_bool(json_t *o, const char *k, int def, int *out, perr *e) {
    json_t *v = json_object_get(o, k);
    *out = def;
    if (!v || json_is_null(v)) return 0;
    if (!json_is_boolean(v)) return bad(e, k, "'%s' must be a boolean", k);
    *out = json_is_true(v);
    return 0;
}

static int parse_stop(json_t *o, srv_req *r, perr *e) {
    json_t *v = json_object_get(o, "stop");
    if (!v || json_is_null(v)) return 0;
    json_t *one = json_is_string(v) ? v : NULL;
    if (!one && !json_is_array(v)) return bad(e, "stop", "'stop' must be a string or an array of strings");
    size_t n = one ? 1 : json_array_size(v);
    if (n > SRV_MAX_STOP) return bad(e, "stop", "'stop' holds at most %d strings", SRV_MAX_STOP);
    for (size_t i = 0; i < n; i++) {
        json_t *s = one ? one : json_array_get(v, i);
        if (!json_is_string(s)) return bad(e, "stop", "'stop' must be a string or an array of strings");
        size_t l = json_string_length(s);
        if (l == 0) continue;   /* an empty stop string would stop before every token; OpenAI ignores it */
        if (l > SRV_MAX_STOP_LEN) return bad(e, "stop", "each 'stop' string is at most %d bytes", SRV_MAX_STOP_LEN);
        if (memchr(json_string_value(s), 0, l)) return bad(e, "stop", "'stop' strings may not contain NUL");
        if (!(r->stop[r->n_stop] = strdup(json_string_value(s)))) return 500;
        r->n_stop++;
    }
    return 0;
}

static int parse_bias(json_t *o, srv_req *r, int n_vocab, perr *e) {
    json_t *v = json_object_get(o, "logit_bias");
    if (!v || json_is_null(v)) return 0;
    if (!json_is_object(v)) return bad(e, "logit_bias", "'logit_bias' must be an object of token id -> bias");
    size_t n = json_object_size(v);
    if (n > 1024) return bad(e, "logit_bias", "'logit_bias' holds at most 1024 entries");
    if (!n) return 0;
    r->bias_id = malloc(sizeof *r->bias_id * n);
    r->bias_val = malloc(sizeof *r->bias_val * n);
    if (!r->bias_id || !r->bias_val) return 500;
    const char *k;
    json_t *b;
    json_object_foreach(v, k, b) {
        char *end;
        long id = strtol(k, &end, 10);
        if (end == k || *end || id < 0 || id >= n_vocab)
            return bad(e, "logit_bias", "'logit_bias' key '%.32s' is not a token id in [0, %d)", k, n_vocab);
        if (!json_is_number(b) || !isfinite(json_number_value(b)) || fabs(json_number_value(b)) > 100)
            return bad(e, "logit_bias", "'logit_bias' values must be numbers in [-100, 100]");
        r->bias_id[r->n_bias] = (int32_t)id;
        r->bias_val[r->n_bias++] = (float)json_number_value(b);
    }
    return 0;
}

/* sampling and output fields common to both endpoints */
static int parse_common(srv *s, json_t *o, srv_req *r, perr *e) {
    double x;
    long long k;
    int rc;
    r->sp = cinfer_sampler_defaults();   /* the repetition penalty stays 1 here: the engine applies it */
    json_t *mt = json_object_get(o, "max_completion_tokens");
    if (!mt || json_is_null(mt)) mt = json_object_get(o, "max_tokens");
    if (mt && !json_is_null(mt)) {
        json_t *tmp = json_pack("{sO}", "max_tokens", mt);
        rc = tmp ? get_int(tmp, "max_tokens", 0, 1 << 24, s->o.max_tokens, &k, e) : 500;
        json_decref(tmp);
        if (rc) return rc;
        r->max_tokens = (int)k;
    } else r->max_tokens = s->o.max_tokens;
    if ((rc = get_num(o, "temperature", 0, 100, 0, &x, e))) return rc;
    r->sp.temp = (float)x;
    if ((rc = get_num(o, "top_p", 0, 1, 1, &x, e))) return rc;
    r->sp.top_p = x > 0 ? (float)x : 1.0f;
    if ((rc = get_int(o, "top_k", -1, 1 << 30, 0, &k, e))) return rc;
    r->sp.top_k = x > 0 ? (k < 0 ? 0 : (int)k) : 1;   /* top_p 0 keeps the top token alone */
    if ((rc = get_num(o, "min_p", 0, 1, 0, &x, e))) return rc;
    r->sp.min_p = (float)x;
    if ((rc = get_num(o, "repetition_penalty", 0, 100, 0, &x, e))) return rc;
    r->rep_penalty = x > 0 ? (float)x : 1.0f;
    if ((rc = get_num(o, "presence_penalty", -100, 100, 0, &x, e))) return rc;
    r->presence = (float)x;
    if ((rc = get_num(o, "frequency_penalty", -100, 100, 0, &x, e))) return rc;
    r->frequency = (float)x;
    if ((rc = get_int(o, "repetition_context_size", 0, 1 << 20, 20, &k, e))) return rc;
    r->rep_ctx = (int)k;
    if ((rc = get_int(o, "presence_context_size", 0, 1 << 20, 20, &k, e))) return rc;
    r->presence_ctx = (int)k;
    if ((rc = get_int(o, "frequency_context_size", 0, 1 << 20, 20, &k, e))) return rc;
    r->frequency_ctx = (int)k;
    if ((rc = get_int(o, "seed", -(1LL << 62), 1LL << 62, 0, &k, e))) return rc;
    r->sp.seed = (uint64_t)k;
    if ((rc = get_int(o, "n", 1, SRV_MAX_N, 1, &k, e))) return rc;
    r->n_choices = (int)k;
    if ((rc = get_bool(o, "stream", 0, &r->stream, e))) return rc;
    if ((rc = get_bool(o, "ignore_eos", 0, &r->ignore_eos, e))) return rc;
    json_t *so = json_object_get(o, "stream_options");
    if (so && !json_is_null(so)) {
        if (!json_is_object(so)) return bad(e, "stream_options", "'stream_options' must be an object");
        if ((rc = get_bool(so, "include_usage", 0, &r->include_usage, e))) return rc;
    }
    /* logprobs: an integer (completions: that many alternatives) or a boolean
     * (chat, with top_logprobs) */
    json_t *lp = json_object_get(o, "logprobs");
    if (lp && json_is_boolean(lp)) r->logprobs = json_is_true(lp);
    else if (lp && !json_is_null(lp)) {
        if ((rc = get_int(o, "logprobs", 0, SRV_MAX_TOP, 0, &k, e))) return rc;
        if (r->kind == SRV_CHAT) return bad(e, "logprobs", "'logprobs' must be a boolean (use top_logprobs for alternatives)");
        r->logprobs = 1;
        r->top_logprobs = (int)k;
    }
    if ((rc = get_int(o, "top_logprobs", -1, SRV_MAX_TOP, r->top_logprobs, &k, e))) return rc;
    r->top_logprobs = k < 0 ? 0 : (int)k;
    if (r->kind == SRV_CHAT && r->top_logprobs > 0 && !r->logprobs)
        return bad(e, "top_logprobs", "'top_logprobs' needs 'logprobs': true");
    if ((rc = parse_stop(o, r, e)) || (rc = parse_bias(o, r, s->n_vocab, e))) return rc;
    return 0;
}

/* ------------------------------------------------------------ prompts */

static int tokenize(srv *s, const char *text, size_t len, int add_special, srv_req *r, perr *e, const char *field) {
    if (!len) {   /* as `cinfer generate` with no prompt: start from BOS */
        if (s->bos < 0) return bad(e, field, "'%s' is empty and the model has no BOS token", field);
        if (!(r->prompt = malloc(sizeof(int32_t)))) return 500;
        r->prompt[0] = s->bos;
        r->n_prompt = 1;
        return 0;
    }
    cinfer_status st = cinfer_tokenize(s->tok, text, len, add_special, 1, &r->prompt, &r->n_prompt);
    if (st == CINFER_ENOMEM) return 500;
    if (st || r->n_prompt < 1) return bad(e, field, "'%s' could not be tokenized (%s)", field, cinfer_status_str(st));
    return 0;
}

static int completion_prompt(srv *s, json_t *o, srv_req *r, perr *e) {
    json_t *p = json_object_get(o, "prompt");
    if (p && json_is_array(p) && json_array_size(p) == 1 && !json_is_integer(json_array_get(p, 0)))
        p = json_array_get(p, 0);   /* a batch of one prompt */
    if (!p || json_is_null(p)) return bad(e, "prompt", "'prompt' is required");
    if (json_is_string(p)) {
        if (!s->tok) return bad(e, "prompt", "the model has no tokenizer; send 'prompt' as token ids");
        if (!(r->prompt_text = strdup(json_string_value(p)))) return 500;
        return tokenize(s, json_string_value(p), json_string_length(p), 1, r, e, "prompt");
    }
    if (!json_is_array(p) || json_array_size(p) == 0)
        return bad(e, "prompt", "'prompt' must be a string, an array of token ids or an array of one string");
    size_t n = json_array_size(p);
    if (n > (size_t)s->max_pos && !s->o.co.max_kv_size) n = (size_t)s->max_pos + 1;   /* rejected below, bounded work */
    if (n > (1u << 24)) return bad(e, "prompt", "'prompt' is too long");
    if (!(r->prompt = malloc(sizeof(int32_t) * n))) return 500;
    for (size_t i = 0; i < n; i++) {
        json_t *v = json_array_get(p, i);
        if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) >= s->n_vocab)
            return bad(e, "prompt", "'prompt' token ids must be integers in [0, %d)", s->n_vocab);
        r->prompt[i] = (int32_t)json_integer_value(v);
    }
    r->n_prompt = (int)n;
    return 0;
}

/* the template's variables, as cinfer_chat_render builds them (chat.c), for a --chat-template override */
static char *render_override(srv *s, json_t *msgs, json_t *tools, json_t *kwargs, perr *e, int *rc) {
    json_t *ctx = s->tok->chat_vars ? json_loads(s->tok->chat_vars, 0, NULL) : NULL;
    if (!ctx) ctx = json_object();
    json_object_set(ctx, "messages", msgs);
    json_object_set(ctx, "tools", tools ? tools : json_null());
    json_object_set_new(ctx, "documents", json_null());
    json_object_set_new(ctx, "add_generation_prompt", json_true());
    if (kwargs) json_object_update(ctx, kwargs);
    char *cj = json_dumps(ctx, JSON_COMPACT), *out = NULL, err[400] = "";
    json_decref(ctx);
    int st = cj ? tmpl_render(s->chat_template, cj, &out, err, sizeof err) : CINFER_ENOMEM;
    free(cj);
    if (st) *rc = st == CINFER_ENOMEM ? 500 : bad(e, "messages", "chat template: %s", err);
    return out;
}

/* content given as OpenAI parts [{type:"text", text}] becomes one string, as
 * most templates expect a string */
static int flatten_content(json_t *msg, perr *e) {
    json_t *c = json_object_get(msg, "content");
    if (!c || json_is_string(c) || json_is_null(c)) return 0;
    if (!json_is_array(c)) return bad(e, "messages", "message 'content' must be a string or an array of parts");
    size_t tot = 0;
    for (size_t i = 0; i < json_array_size(c); i++) {
        json_t *t = json_object_get(json_array_get(c, i), "text");
        if (!json_is_string(t)) return bad(e, "messages", "only text content parts are supported");
        tot += json_string_length(t);
    }
    char *buf = malloc(tot + 1), *w = buf;
    if (!buf) return 500;
    for (size_t i = 0; i < json_array_size(c); i++) {
        json_t *t = json_object_get(json_array_get(c, i), "text");
        memcpy(w, json_string_value(t), json_string_length(t));
        w += json_string_length(t);
    }
    *w = 0;
    json_object_set_new(msg, "content", json_stringn(buf, tot));
    free(buf);
    return 0;
}

static int chat_prompt(srv *s, json_t *o, srv_req *r, perr *e) {
    json_t *msgs = json_object_get(o, "messages");
    if (!json_is_array(msgs) || !json_array_size(msgs)) return bad(e, "messages", "'messages' must be a non-empty array");
    if (json_array_size(msgs) > 4096) return bad(e, "messages", "'messages' holds at most 4096 messages");
    for (size_t i = 0; i < json_array_size(msgs); i++) {
        json_t *m = json_array_get(msgs, i);
        if (!json_is_object(m) || !json_is_string(json_object_get(m, "role")))
            return bad(e, "messages", "each message must be an object with a string 'role'");
        int rc = flatten_content(m, e);
        if (rc) return rc;
    }
    json_t *tools = json_object_get(o, "tools"), *kw = json_object_get(o, "chat_template_kwargs");
    if (tools && json_is_null(tools)) tools = NULL;
    if (kw && json_is_null(kw)) kw = NULL;
    if (tools && !json_is_array(tools)) return bad(e, "tools", "'tools' must be an array");
    if (kw && !json_is_object(kw)) return bad(e, "chat_template_kwargs", "'chat_template_kwargs' must be an object");
    r->has_tools = tools && json_array_size(tools) > 0;
    if (!s->tok) return bad(e, "messages", "the model has no tokenizer");
    int rc = 0;
    char *text = NULL, err[400] = "";
    if (s->chat_template) text = render_override(s, msgs, tools, kw, e, &rc);
    else if (!s->tok->chat_template)
        return bad(e, "messages", "the model has no chat template; start the server with --chat-template FILE|STRING");
    else {
        char *mj = json_dumps(msgs, JSON_COMPACT), *tj = tools ? json_dumps(tools, JSON_COMPACT) : NULL;
        char *kj = kw ? json_dumps(kw, JSON_COMPACT) : NULL;
        cinfer_status st = mj ? cinfer_chat_render(s->tok, mj, tj, kj, 1, &text, err, sizeof err) : CINFER_ENOMEM;
        free(mj); free(tj); free(kj);
        if (st) rc = st == CINFER_ENOMEM ? 500 : bad(e, "messages", "chat template: %s", err);
    }
    if (rc) { free(text); return rc; }
    /* the rendering holds the template's special tokens itself: add none */
    rc = tokenize(s, text, strlen(text), 0, r, e, "messages");
    free(text);
    return rc;
}

static int model_ok(const srv *s, json_t *o) {
    json_t *m = json_object_get(o, "model");
    if (!m || json_is_null(m)) return 1;
    if (!json_is_string(m)) return 0;
    const char *v = json_string_value(m);
    return !strcmp(v, s->o.model_id) || !strcmp(v, "default_model") || !strcmp(v, s->o.model_dir) || !*v;
}

int srv_parse_request(srv *s, int kind, const char *body, size_t len, srv_req **out, char *msg, size_t msg_len,
                      char *param, size_t param_len) {
    perr e = {msg, msg_len, param, param_len};
    msg[0] = param[0] = 0;
    *out = NULL;
    json_error_t je;
    json_t *o = json_loadb(body, len, 0, &je);
    if (!o) {
        snprintf(msg, msg_len, "malformed JSON body: %s (line %d column %d)", je.text, je.line, je.column);
        return 400;
    }
    int rc = 0;
    srv_req *r = srv_req_new();
    if (!r) { json_decref(o); return 500; }
    r->kind = kind;
    if (!json_is_object(o)) rc = bad(&e, "", "the request body must be a JSON object");
    else if (!model_ok(s, o)) {
        json_t *m = json_object_get(o, "model");
        snprintf(msg, msg_len, "The model '%.100s' does not exist; this server serves '%s'",
                 json_is_string(m) ? json_string_value(m) : "?", s->o.model_id);
        snprintf(param, param_len, "model");
        rc = 404;
    }
    if (!rc) rc = parse_common(s, o, r, &e);
    if (!rc && kind == SRV_COMPLETION) rc = get_bool(o, "echo", 0, &r->echo, &e);
    if (!rc) rc = kind == SRV_CHAT ? chat_prompt(s, o, r, &e) : completion_prompt(s, o, r, &e);
    if (!rc && !s->o.co.max_kv_size && r->n_prompt >= s->max_pos)
        rc = bad(&e, kind == SRV_CHAT ? "messages" : "prompt",
                 "the prompt has %d tokens; the model's context is %d tokens", r->n_prompt, s->max_pos);
    if (!rc && !s->o.co.max_kv_size && r->n_prompt + r->max_tokens > s->max_pos)
        r->max_tokens = s->max_pos - r->n_prompt;   /* ends with finish_reason "length" */
    if (!rc && r->echo && !r->prompt_text && s->tok && cinfer_detokenize(s->tok, r->prompt, r->n_prompt, 0, &r->prompt_text))
        rc = 500;
    json_t *m = json_object_get(o, "model");
    snprintf(r->model, sizeof r->model, "%s", json_is_string(m) && *json_string_value(m) ? json_string_value(m) : s->o.model_id);
    json_decref(o);
    if (rc == 500) snprintf(msg, msg_len, "out of memory");
    if (rc) { srv_req_unref(r); return rc; }
    *out = r;
    return 0;
}
