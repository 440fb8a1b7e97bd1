/*
 * serve-resp.c — response bodies in OpenAI's shapes, built from a request's
 * engine events: the whole response (non-streaming), Server-Sent Events
 * chunks (streaming, ending in "data: [DONE]"), error objects and the model
 * list. Log-probs come in the two OpenAI shapes: completions
 * {tokens, token_logprobs, top_logprobs [{token: lp}], text_offset} and chat
 * {content: [{token, logprob, bytes, top_logprobs [{token, logprob, bytes}]}]}.
 * A token's string is the text it decoded to in the stream, so the tokens of
 * a choice join to its text.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "serve.h"

char *srv_error_json(const char *msg, const char *type, const char *param, int code) {
    json_t *e = json_pack("{s:{s:s,s:s,s:o,s:o}}", "error", "message", msg, "type", type, "param",
                          param && *param ? json_string(param) : json_null(), "code",
                          code ? json_integer(code) : json_null());
    char *out = e ? json_dumps(e, JSON_COMPACT) : NULL;
    json_decref(e);
    return out;
}

/* the string of an alternative token: what it decodes to after an anchor
 * token, so a SentencePiece word keeps its leading space (decoded alone, the
 * first token of a text loses it) */
static json_t *tok_str(const srv *s, int32_t id) {
    char *t = NULL, *a = NULL;
    int32_t two[2] = {s->anchor, id};
    json_t *v = NULL;
    if (s->tok && s->anchor >= 0 && !cinfer_detokenize(s->tok, two, 2, 0, &t) && !cinfer_detokenize(s->tok, two, 1, 0, &a) &&
        !strncmp(t, a, strlen(a)))
        v = json_string(t + strlen(a));
    else if (s->tok && !cinfer_detokenize(s->tok, &id, 1, 0, &t)) v = json_string(t);
    free(t);
    free(a);
    return v ? v : json_string("\xef\xbf\xbd");   /* a lone UTF-8 fragment */
}

static json_t *bytes_of(const char *t) {
    json_t *a = json_array();
    for (const unsigned char *p = (const unsigned char *)t; p && *p; p++) json_array_append_new(a, json_integer(*p));
    return a;
}

static json_t *str_or_fffd(const char *t) {
    json_t *v = json_string(t ? t : "");
    return v ? v : json_string("\xef\xbf\xbd");
}

/* chat: one logprobs.content entry */
static json_t *chat_lp(const srv *s, const srv_event *ev) {
    json_t *top = json_array();
    for (int k = 0; k < ev->n_top; k++) {
        json_t *ts = tok_str(s, ev->top[k].id);
        json_array_append_new(top, json_pack("{s:o,s:f,s:o}", "token", ts, "logprob", (double)ev->top[k].lp, "bytes",
                                             bytes_of(json_string_value(ts))));
    }
    return json_pack("{s:o,s:f,s:o,s:o}", "token", str_or_fffd(ev->tok_text), "logprob", (double)ev->logprob, "bytes",
                     bytes_of(ev->tok_text), "top_logprobs", top);
}

/* completions: appends one token to a {tokens, token_logprobs, top_logprobs, text_offset} object */
static void cmpl_lp_add(const srv *s, json_t *lp, const srv_event *ev, size_t offset) {
    json_array_append_new(json_object_get(lp, "tokens"), str_or_fffd(ev->tok_text));
    json_array_append_new(json_object_get(lp, "token_logprobs"), json_real(ev->logprob));
    json_t *top = json_object();
    for (int k = 0; k < ev->n_top; k++) {
        json_t *ts = tok_str(s, ev->top[k].id);
        json_object_set_new(top, json_string_value(ts), json_real(ev->top[k].lp));
        json_decref(ts);
    }
    json_array_append_new(json_object_get(lp, "top_logprobs"), top);
    json_array_append_new(json_object_get(lp, "text_offset"), json_integer((json_int_t)offset));
}

/* echo + logprobs: the prompt's tokens first (the first has no log-prob), each
 * with the text it decodes to in the prompt */
static void cmpl_lp_prompt(const srv *s, srv_req *r, json_t *lp) {
    cinfer_detok_stream *ds = s->tok ? cinfer_detok_stream_new(s->tok, 1) : NULL;
    size_t off = 0;
    for (int i = 0; i < r->n_prompt && ds; i++) {
        srv_event ev = r->pev[i];
        const char *t = cinfer_detok_stream_push(ds, r->prompt[i]);
        ev.tok_text = (char *)(t ? t : "");
        cmpl_lp_add(s, lp, &ev, off);
        off += strlen(ev.tok_text);
        if (!i) {
            json_array_set_new(json_object_get(lp, "token_logprobs"), 0, json_null());
            json_array_set_new(json_object_get(lp, "top_logprobs"), 0, json_null());
        }
    }
    cinfer_detok_stream_free(ds);
}

static json_t *cmpl_lp_new(void) {
    return json_pack("{s:[],s:[],s:[],s:[]}", "tokens", "token_logprobs", "top_logprobs", "text_offset");
}

static json_t *usage(srv_req *r) {
    return json_pack("{s:i,s:i,s:i,s:{s:i}}", "prompt_tokens", r->prompt_tokens, "completion_tokens", r->completion_tokens,
                     "total_tokens", r->prompt_tokens + r->completion_tokens, "prompt_tokens_details", "cached_tokens",
                     r->cached_tokens);
}

static json_t *envelope(srv_req *r, const char *object) {
    return json_pack("{s:s,s:s,s:I,s:s,s:s}", "id", r->id, "object", object, "created", (json_int_t)r->created, "model",
                     r->model, "system_fingerprint", "cinfer");
}

/* called with r->mu held and r->done set */
char *srv_final_json(const srv *s, srv_req *r) {
    int chat = r->kind == SRV_CHAT, nc = r->n_choices;
    json_t *o = envelope(r, chat ? "chat.completion" : "text_completion"), *choices = json_array();
    for (int c = 0; c < nc; c++) {
        char *text = NULL;
        size_t len = 0, cap = 0;
        if (r->echo && r->prompt_text) srv_buf_put(&text, &len, &cap, r->prompt_text, strlen(r->prompt_text));
        json_t *lp = r->logprobs ? (chat ? json_pack("{s:[]}", "content") : cmpl_lp_new()) : json_null();
        const char *finish = "length";
        if (r->pev && !chat) cmpl_lp_prompt(s, r, lp);
        for (int i = 0; i < r->n_ev; i++) {
            srv_event *ev = &r->ev[i];
            if (ev->choice != c) continue;
            if (r->logprobs && ev->token >= 0) {
                if (chat) json_array_append_new(json_object_get(lp, "content"), chat_lp(s, ev));
                else cmpl_lp_add(s, lp, ev, len);
            }
            if (ev->text) srv_buf_put(&text, &len, &cap, ev->text, strlen(ev->text));
            if (ev->finish) finish = ev->finish;
        }
        json_t *ch;
        if (chat) {
            char *content = NULL;
            json_t *calls = r->has_tools ? srv_tool_calls(text ? text : "", &content) : NULL;
            json_t *msg = json_pack("{s:s,s:o}", "role", "assistant", "content",
                                    str_or_fffd(calls ? content : text ? text : ""));
            if (calls) {
                json_object_set_new(msg, "tool_calls", calls);
                finish = "tool_calls";
            }
            free(content);
            ch = json_pack("{s:i,s:o,s:o,s:s}", "index", c, "message", msg, "logprobs", lp, "finish_reason", finish);
        } else
            ch = json_pack("{s:i,s:o,s:o,s:s}", "index", c, "text", str_or_fffd(text ? text : ""), "logprobs", lp,
                           "finish_reason", finish);
        free(text);
        json_array_append_new(choices, ch);
    }
    json_object_set_new(o, "choices", choices);
    json_object_set_new(o, "usage", usage(r));
    char *out = json_dumps(o, JSON_COMPACT);
    json_decref(o);
    return out;
}

static int sse(json_t *o, char **buf, size_t *len, size_t *cap) {
    char *j = o ? json_dumps(o, JSON_COMPACT) : NULL;
    json_decref(o);
    if (!j) return 0;
    int ok = srv_buf_put(buf, len, cap, "data: ", 6) && srv_buf_put(buf, len, cap, j, strlen(j)) &&
             srv_buf_put(buf, len, cap, "\n\n", 2);
    free(j);
    return ok;
}

static json_t *chunk(srv_req *r, json_t *choice) {
    json_t *o = envelope(r, r->kind == SRV_CHAT ? "chat.completion.chunk" : "text_completion");
    json_object_set_new(o, "choices", choice ? json_pack("[o]", choice) : json_array());
    return o;
}

void srv_sse_state_free(srv_sse_state *ss) {
    for (int c = 0; c < SRV_MAX_N; c++) free(ss->held[c]);
    memset(ss, 0, sizeof *ss);
}

/* drops the first n held bytes of choice c */
static void held_drop(srv_sse_state *ss, int c, size_t n) {
    memmove(ss->held[c], ss->held[c] + n, ss->held_len[c] - n + 1);
    ss->held_len[c] -= n;
}

/* Streaming chat with tools: the text of choice c, piece by piece (fin: the reply ended), cut as
 * srv_tool_calls cuts a whole reply: <tool_call> blocks become calls (appended to calls), a reply
 * that begins with a JSON object (after <|python_tag|>, Llama 3) is held to its end and then parsed,
 * and text that may be the start of a tag is held until the next piece tells. Appends the text
 * released as content to *out (len/cap); 0 on allocation failure. */
static int tool_stream(srv_sse_state *ss, int c, const char *text, int fin, json_t *calls, char **out, size_t *len, size_t *cap) {
    static const char open_tag[] = "<tool_call>", close_tag[] = "</tool_call>", py[] = "<|python_tag|>";
    if (text && !srv_buf_put(&ss->held[c], &ss->held_len[c], &ss->held_cap[c], text, strlen(text))) return 0;
    if (!ss->held[c] && !srv_buf_put(&ss->held[c], &ss->held_len[c], &ss->held_cap[c], "", 0)) return 0;
    for (;;) {
        char *h = ss->held[c];
        size_t n = ss->held_len[c];
        if (ss->whole[c]) {   /* Llama 3: parsed at the end, as a whole reply */
            if (!fin) return 1;
            char *content = NULL;
            json_t *got = srv_tool_calls(h, &content);
            int ok = 1;
            if (got) {
                for (size_t i = 0; i < json_array_size(got); i++) json_array_append(calls, json_array_get(got, i));
                ss->n_calls[c] += (int)json_array_size(got);
                ok = srv_buf_put(out, len, cap, content, strlen(content));
            } else ok = srv_buf_put(out, len, cap, h, n);
            json_decref(got);
            free(content);
            held_drop(ss, c, n);
            return ok;
        }
        if (ss->in_call[c]) {
            char *e = strstr(h, close_tag);
            if (!e) {   /* unterminated at the end: it was text after all */
                if (!fin) return 1;
                int ok = srv_buf_put(out, len, cap, open_tag, strlen(open_tag)) && srv_buf_put(out, len, cap, h, n);
                held_drop(ss, c, n);
                ss->in_call[c] = 0;
                return ok;
            }
            json_t *call = srv_tool_call_parse(h, (size_t)(e - h), ss->n_calls[c]);
            if (call) {
                json_array_append_new(calls, call);
                ss->n_calls[c]++;
            } else if (!srv_buf_put(out, len, cap, open_tag, strlen(open_tag)) || !srv_buf_put(out, len, cap, h, (size_t)(e - h) + strlen(close_tag)))
                return 0;
            held_drop(ss, c, (size_t)(e - h) + strlen(close_tag));
            ss->in_call[c] = 0;
            continue;
        }
        if (!ss->started[c]) {   /* the reply's first text decides whether it is a Llama 3 call */
            const char *q = h;
            while (*q == ' ' || *q == '\n') q++;
            size_t qn = n - (size_t)(q - h);
            if (*q == '{' || (qn >= strlen(py) && !strncmp(q, py, strlen(py)))) { ss->whole[c] = 1; continue; }
            if (!fin && (!qn || (qn < strlen(py) && !strncmp(q, py, qn)))) return 1;   /* not known yet */
        }
        char *a = strstr(h, open_tag);
        size_t rel = a ? (size_t)(a - h) : fin ? n : n - srv_tail_prefix(h, n, open_tag);
        if (!srv_buf_put(out, len, cap, h, rel)) return 0;
        for (size_t i = 0; i < rel && !ss->started[c]; i++) ss->started[c] = h[i] != ' ' && h[i] != '\n';
        held_drop(ss, c, rel);
        if (!a) return 1;
        held_drop(ss, c, strlen(open_tag));
        ss->in_call[c] = 1;
        ss->started[c] = 1;
    }
}

/* a chat chunk delta: content (when text is not NULL) and tool calls (when calls holds some) */
static json_t *chat_delta(int choice, const char *text, json_t *calls, int first_call, json_t *lp) {
    json_t *d = json_object();
    if (text) json_object_set_new(d, "content", str_or_fffd(text));
    if (json_array_size(calls)) {
        for (size_t i = 0; i < json_array_size(calls); i++)
            json_object_set_new(json_array_get(calls, i), "index", json_integer(first_call + (json_int_t)i));
        json_object_set(d, "tool_calls", calls);
    }
    return json_pack("{s:i,s:o,s:o,s:n}", "index", choice, "delta", d, "logprobs", lp ? lp : json_null(), "finish_reason");
}

/* called with r->mu held */
int srv_sse_events(const srv *s, srv_req *r, int from, int to, srv_sse_state *ss, char **buf, size_t *len, size_t *cap) {
    int chat = r->kind == SRV_CHAT;
    size_t *text_off = ss->text_off;
    if (!ss->first_sent) {   /* chat opens each choice with its role; completions echo the prompt */
        ss->first_sent = 1;
        for (int c = 0; c < r->n_choices; c++) {
            if (chat && !sse(chunk(r, json_pack("{s:i,s:{s:s,s:s},s:n,s:n}", "index", c, "delta", "role", "assistant",
                                                 "content", "", "logprobs", "finish_reason")), buf, len, cap))
                return 0;
            if (!chat && r->echo && r->prompt_text) {
                text_off[c] += strlen(r->prompt_text);
                if (!sse(chunk(r, json_pack("{s:i,s:s,s:n,s:n}", "index", c, "text", r->prompt_text, "logprobs",
                                            "finish_reason")), buf, len, cap))
                    return 0;
            }
        }
    }
    for (int i = from; i < to; i++) {
        srv_event *ev = &r->ev[i];
        if (chat && r->has_tools) {   /* the text goes through the tool-call cutter */
            json_t *calls = json_array();
            char *t = NULL;
            size_t tl = 0, tc = 0;
            int first_call = ss->n_calls[ev->choice];
            int ok = calls && tool_stream(ss, ev->choice, ev->text, ev->finish != NULL, calls, &t, &tl, &tc);
            json_t *lp = r->logprobs && ev->token >= 0 ? json_pack("{s:[o]}", "content", chat_lp(s, ev)) : NULL;
            if (ok && (tl || lp || json_array_size(calls)))
                ok = sse(chunk(r, chat_delta(ev->choice, tl || lp ? (t ? t : "") : NULL, calls, first_call, lp)), buf, len, cap);
            else json_decref(lp);
            json_decref(calls);
            free(t);
            if (ok && ev->finish)
                ok = sse(chunk(r, json_pack("{s:i,s:{},s:n,s:s}", "index", ev->choice, "delta", "logprobs", "finish_reason",
                                            ss->n_calls[ev->choice] ? "tool_calls" : ev->finish)),
                         buf, len, cap);
            if (!ok) return 0;
            continue;
        }
        int has_text = ev->text && ev->text[0];
        if (has_text || (r->logprobs && ev->token >= 0)) {
            json_t *lp = json_null();
            if (r->logprobs && ev->token >= 0) {
                if (chat) lp = json_pack("{s:[o]}", "content", chat_lp(s, ev));
                else { lp = cmpl_lp_new(); cmpl_lp_add(s, lp, ev, text_off[ev->choice]); }
            }
            json_t *ch = chat ? json_pack("{s:i,s:{s:o},s:o,s:n}", "index", ev->choice, "delta", "content",
                                          str_or_fffd(ev->text), "logprobs", lp, "finish_reason")
                              : json_pack("{s:i,s:o,s:o,s:n}", "index", ev->choice, "text", str_or_fffd(ev->text),
                                          "logprobs", lp, "finish_reason");
            if (!sse(chunk(r, ch), buf, len, cap)) return 0;
            if (ev->text) text_off[ev->choice] += strlen(ev->text);
        }
        if (ev->finish) {
            json_t *ch = chat ? json_pack("{s:i,s:{},s:n,s:s}", "index", ev->choice, "delta", "logprobs", "finish_reason",
                                          ev->finish)
                              : json_pack("{s:i,s:s,s:n,s:s}", "index", ev->choice, "text", "", "logprobs",
                                          "finish_reason", ev->finish);
            if (!sse(chunk(r, ch), buf, len, cap)) return 0;
        }
    }
    return 1;
}

/* called with r->mu held and r->done set: the error (if any), usage, [DONE] */
int srv_sse_tail(const srv *s, srv_req *r, char **buf, size_t *len, size_t *cap) {
    (void)s;
    if (r->err_status) {
        char *e = srv_error_json(r->err, "server_error", NULL, r->err_status);
        int ok = e && srv_buf_put(buf, len, cap, "data: ", 6) && srv_buf_put(buf, len, cap, e, strlen(e)) &&
                 srv_buf_put(buf, len, cap, "\n\n", 2);
        free(e);
        if (!ok) return 0;
    } else if (r->include_usage) {
        json_t *o = chunk(r, NULL);
        json_object_set_new(o, "usage", usage(r));
        if (!sse(o, buf, len, cap)) return 0;
    }
    return srv_buf_put(buf, len, cap, "data: [DONE]\n\n", 14);
}

char *srv_models_json(const srv *s) {
    json_t *o = json_pack("{s:s,s:[{s:s,s:s,s:I,s:s}]}", "object", "list", "data", "id", s->o.model_id, "object", "model",
                          "created", (json_int_t)0, "owned_by", "cinfer");
    char *out = o ? json_dumps(o, JSON_COMPACT) : NULL;
    json_decref(o);
    return out;
}
