/*
 * serve.h — `cinfer serve`, an OpenAI-compatible HTTP server.
 *
 * Threads: libmicrohttpd runs one thread per connection; those threads parse
 * and validate requests, tokenize, and turn engine events into JSON or SSE.
 * ONE engine thread (serve-engine.c) owns the model's context: every step it
 * decodes all running sequences as one batch and spends the rest of a token
 * budget on chunked prefill of admitted requests. The two sides meet only in
 * a srv_req (events appended by the engine under the request's mutex) and in
 * the server's queue; the engine never waits on a connection.
 *
 * A request is reference counted: the HTTP side holds one reference, the
 * engine another from submit until it has emitted the request's last event.
 * A client that goes away sets `cancelled`; the engine frees the request's
 * sequences at its next step.
 */
#ifndef CINFER_SERVE_H
#define CINFER_SERVE_H
#include <jansson.h>
#include <pthread.h>
#include <stdatomic.h>
#include "cinfer.h"

#define SRV_MAX_TOP 20      /* top_logprobs cap (OpenAI's) */
#define SRV_MAX_STOP 16     /* stop strings per request */
#define SRV_MAX_STOP_LEN 256
#define SRV_MAX_N 16        /* choices per request */

typedef struct srv_opts {
    const char *model_dir, *host, *api_key, *model_id, *chat_template, *origins, *device;
    int port, max_batch, max_tokens, max_queue, step_tokens, prompt_cache, threads, timeout_s, max_conn;
    int quiet;
    size_t max_body;
    const char *cache_dir;  /* --cache-dir: the prefix cache's on-disk second level (NULL: none) */
    size_t cache_max;       /* --cache-dir-max-gb in bytes (0: no limit) */
    cinfer_ctx_opts co;
} srv_opts;

typedef struct srv_top { int32_t id; float lp; } srv_top;

/* one step of one choice, from the engine to the HTTP side */
typedef struct srv_event {
    int choice;
    int32_t token;          /* -1: a finish-only event */
    char *text;             /* text released to the client (after stop-string hold-back), malloc'd */
    char *tok_text;         /* the text this token decoded to (for logprobs), malloc'd, may be NULL */
    float logprob;
    int n_top;
    srv_top top[SRV_MAX_TOP];
    const char *finish;     /* NULL, "stop" or "length" (static strings) */
} srv_event;

enum { SRV_COMPLETION = 0, SRV_CHAT = 1 };

typedef struct srv_req {
    /* set by the HTTP thread before submit, read-only afterwards */
    int kind, stream, include_usage, echo;
    int32_t *prompt;        /* [n_prompt] */
    int n_prompt;
    char *prompt_text;      /* completions: the prompt as text (echo); may be NULL */
    int n_choices, max_tokens;
    cinfer_sampler_params sp;          /* temp, top_k, top_p, min_p, seed (rep_penalty applied by the engine) */
    float rep_penalty, presence, frequency;
    int rep_ctx, presence_ctx, frequency_ctx;
    int n_bias;
    int32_t *bias_id;       /* [n_bias] */
    float *bias_val;        /* [n_bias] */
    int logprobs, top_logprobs;        /* logprobs 0/1; top_logprobs 0..SRV_MAX_TOP */
    int n_stop;
    char *stop[SRV_MAX_STOP];
    int has_tools;          /* chat: tools were given (tool-call parsing) */
    int ignore_eos;         /* llama.cpp's and vLLM's extension: generate past eos ids (benchmarks) */
    double deadline;        /* cf_now() seconds after which the engine ends the request */
    char id[48];
    long created;
    char model[128];

    /* shared between the engine and the HTTP side, under mu */
    pthread_mutex_t mu;
    pthread_cond_t cv;
    srv_event *ev;
    int n_ev, cap_ev;
    srv_event *pev;         /* echo + logprobs: [n_prompt] the prompt's log-probs (pev[0] has none) */
    int done;               /* the engine has emitted everything */
    int err_status;         /* != 0: failed with this HTTP status and err */
    char err[256];
    int prompt_tokens, completion_tokens, cached_tokens;
    atomic_int cancelled;
    atomic_int refs;
    double t_start, t_first;  /* timing for the access log */
} srv_req;

typedef struct srv_stats { int running, waiting, cached; size_t kv_held, kv_budget; long preempted; } srv_stats;

typedef struct srv_engine srv_engine;

typedef struct srv {
    srv_opts o;
    cinfer_model *m;             /* set by the engine thread once loaded */
    const cinfer_tokenizer *tok;
    int n_vocab, max_pos, bos;
    int32_t anchor;              /* a token that decodes to plain text: see tok_str (serve-resp.c) */
    char *chat_template;         /* --chat-template's text (file contents or the string), or NULL */
    srv_engine *eng;
    pthread_mutex_t mu;          /* guards queue and stats */
    pthread_cond_t cv;           /* new work for the engine */
    srv_req **queue;             /* [max_queue] FIFO of submitted requests */
    int q_head, q_len;
    atomic_int ready;            /* 1 once the model is loaded, -1 if loading failed */
    atomic_int stopping;
    srv_stats st;
    atomic_long next_id;
} srv;

/* serve-req.c: request JSON -> srv_req. On failure returns an HTTP status
 * (400/404/...) and writes an OpenAI error message and the offending field. */
int srv_parse_request(srv *s, int kind, const char *body, size_t len, srv_req **out, char *msg, size_t msg_len,
                      char *param, size_t param_len);
srv_req *srv_req_new(void);
void srv_req_unref(srv_req *r);
/* appends an event (engine side); takes ownership of ev->text/tok_text */
void srv_req_push(srv_req *r, srv_event *ev);

/* serve-resp.c: response bodies */
char *srv_error_json(const char *msg, const char *type, const char *param, int code);
char *srv_final_json(const srv *s, srv_req *r);
/* what one streaming response has sent so far (zero-initialised; srv_sse_state_free releases it) */
typedef struct srv_sse_state {
    int first_sent;
    size_t text_off[SRV_MAX_N];          /* completions: each choice's text_offset */
    /* chat with tools: text held back per choice while it may be (part of) a tool call */
    char *held[SRV_MAX_N];
    size_t held_len[SRV_MAX_N], held_cap[SRV_MAX_N];
    int in_call[SRV_MAX_N];              /* after a <tool_call> tag, before its </tool_call> */
    int whole[SRV_MAX_N];                /* the reply began as a Llama 3 call (JSON object): held to its end */
    int started[SRV_MAX_N];              /* text other than white space was released */
    int n_calls[SRV_MAX_N];
} srv_sse_state;
void srv_sse_state_free(srv_sse_state *ss);
/* appends the SSE chunks of events [from, to) to *buf; returns 0 on allocation failure */
int srv_sse_events(const srv *s, srv_req *r, int from, int to, srv_sse_state *ss, char **buf, size_t *len, size_t *cap);
int srv_sse_tail(const srv *s, srv_req *r, char **buf, size_t *len, size_t *cap);
char *srv_models_json(const srv *s);

/* serve-tools.c: tool calls in a chat reply (NULL when it holds none; *content: the text outside them);
 * one call's JSON text (n bytes) as an OpenAI tool_calls entry with id call_<k>, or NULL */
json_t *srv_tool_calls(const char *text, char **content);
json_t *srv_tool_call_parse(const char *json, size_t n, int k);

/* serve-engine.c */
int srv_engine_start(srv *s);               /* spawns the engine thread (it loads the model) */
void srv_engine_stop(srv *s);   /* stops admitting, lets running requests finish (10 s grace), joins */
void srv_engine_free(srv *s);   /* after the HTTP side has stopped: frees the context and model */
/* queues r (the engine takes a reference): 0 ok, 429 queue full, 503 not ready / stopping */
int srv_submit(srv *s, srv_req *r);

/* serve-http.c */
typedef struct srv_http srv_http;
srv_http *srv_http_start(srv *s, char *err, size_t err_len);
int srv_http_port(const srv_http *h);   /* the bound port (--port 0 picks one) */
void srv_http_stop(srv_http *h);

/* serve-util.c */
double srv_now(void);
int srv_buf_put(char **buf, size_t *len, size_t *cap, const char *s, size_t n);
/* the length of the longest end of h[n] that is a proper prefix of s (text that may still grow into s) */
size_t srv_tail_prefix(const char *h, size_t n, const char *s);
#endif
