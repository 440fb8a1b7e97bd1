/*
 * test-serve-parse.c — the server's request parser and tool-call parser,
 * compiled in from tools/cli: field checks on hand-written bodies, tool
 * calls in the Qwen3 and Llama 3 shapes, response JSON built from a request
 * with events, and a fuzz loop (byte mutations of valid bodies and random
 * JSON of the known fields with random types) in which every body gets 0 or
 * a 4xx and an accepted request is in range. Bounded in time so the ASan
 * build stays quick.
 */
#include "../tools/cli/serve-req.c"
#include "../tools/cli/serve-resp.c"
#include "../tools/cli/serve-tools.c"
#include "../tools/cli/serve-util.c"
#include "check.h"

static srv S;

static int parse(int kind, const char *body, srv_req **r, char *param) {
    char msg[512];
    return srv_parse_request(&S, kind, body, strlen(body), r, msg, sizeof msg, param, 64);
}

static int sane(const srv_req *r) {
    if (r->n_prompt < 1 || r->max_tokens < 0 || r->n_choices < 1 || r->n_choices > SRV_MAX_N) return 0;
    if (r->top_logprobs < 0 || r->top_logprobs > SRV_MAX_TOP || r->n_stop > SRV_MAX_STOP) return 0;
    if (!(r->sp.top_p > 0 && r->sp.top_p <= 1) || r->sp.temp < 0 || r->rep_penalty <= 0) return 0;
    if (r->n_prompt + r->max_tokens > S.max_pos) return 0;
    for (int i = 0; i < r->n_prompt; i++)
        if (r->prompt[i] < 0 || r->prompt[i] >= S.n_vocab) return 0;
    for (int i = 0; i < r->n_bias; i++)
        if (r->bias_id[i] < 0 || r->bias_id[i] >= S.n_vocab) return 0;
    cinfer_sampler *smp = NULL;
    int ok = cinfer_sampler_new(&r->sp, S.n_vocab, &smp) == CINFER_OK;
    cinfer_sampler_free(smp);
    return ok;
}

static void t_fields(void) {
    srv_req *r = NULL;
    char param[64];
    int st = parse(SRV_COMPLETION, "{\"prompt\":\"Once upon a time\",\"max_tokens\":7,\"temperature\":0.5,\"top_p\":0.9,"
                   "\"top_k\":40,\"stop\":[\"a\",\"b\"],\"logprobs\":3,\"n\":2,\"seed\":5,\"logit_bias\":{\"13\":2.5}}", &r, param);
    CHECK(st == 0 && r->max_tokens == 7 && r->n_choices == 2 && r->n_stop == 2 && r->logprobs && r->top_logprobs == 3 &&
          r->n_bias == 1 && r->bias_id[0] == 13 && r->sp.top_k == 40 && r->sp.seed == 5 && sane(r), "a full completions body");
    srv_req_unref(r);
    st = parse(SRV_COMPLETION, "{\"prompt\":\"hi\",\"max_completion_tokens\":3,\"max_tokens\":9}", &r, param);
    CHECK(st == 0 && r->max_tokens == 3, "max_completion_tokens wins over max_tokens");
    srv_req_unref(r);
    st = parse(SRV_COMPLETION, "{\"prompt\":\"hi\",\"max_tokens\":100000}", &r, param);
    CHECK(st == 0 && r->n_prompt + r->max_tokens == S.max_pos, "max_tokens clamps to the model's context");
    srv_req_unref(r);
    st = parse(SRV_COMPLETION, "{\"prompt\":[1,403,407]}", &r, param);
    CHECK(st == 0 && r->n_prompt == 3 && r->prompt[1] == 403 && r->max_tokens == S.o.max_tokens, "prompt as token ids; default max_tokens");
    srv_req_unref(r);
    st = parse(SRV_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],\"logprobs\":3}", &r, param);
    CHECK(st == 400 && !strcmp(param, "logprobs"), "chat: an integer logprobs is 400");
    st = parse(SRV_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],\"top_logprobs\":3}", &r, param);
    CHECK(st == 400 && !strcmp(param, "top_logprobs"), "chat: top_logprobs without logprobs is 400");
    st = parse(SRV_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":\"a\"},{\"type\":\"text\",\"text\":\"b\"}]}]}",
               &r, param);
    CHECK(st == 0 && r->n_prompt > 0, "chat: content parts are joined");
    srv_req_unref(r);
    st = parse(SRV_CHAT, "{\"messages\":[]}", &r, param);
    CHECK(st == 400 && !strcmp(param, "messages"), "chat: empty messages is 400");
    char longp[4000] = "{\"prompt\":[";
    for (int i = 0; i < 600; i++) strcat(longp, i ? ",5" : "5");
    strcat(longp, "]}");
    st = parse(SRV_COMPLETION, longp, &r, param);
    CHECK(st == 400 && !strcmp(param, "prompt"), "a prompt longer than the context is 400");
}

static void t_tools(void) {
    char *content = NULL;
    json_t *c = srv_tool_calls("Let me check.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>",
                               &content);
    json_t *f = json_object_get(json_array_get(c, 0), "function");
    CHECK(json_array_size(c) == 1 && !strcmp(json_string_value(json_object_get(f, "name")), "get_weather") &&
          !strcmp(json_string_value(json_object_get(f, "arguments")), "{\"city\":\"Paris\"}") && !strcmp(content, "Let me check."),
          "Qwen3 <tool_call> block: name, arguments as a JSON string, the rest as content");
    json_decref(c);
    free(content);
    c = srv_tool_calls("<tool_call>{\"name\":\"a\",\"arguments\":{}}</tool_call><tool_call>{\"name\":\"b\",\"arguments\":{\"x\":1}}</tool_call>", &content);
    CHECK(json_array_size(c) == 2 && !strcmp(json_string_value(json_object_get(json_array_get(c, 1), "id")), "call_1"), "two Qwen3 calls");
    json_decref(c);
    free(content);
    c = srv_tool_calls("{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Oslo\"}}", &content);
    f = json_object_get(json_array_get(c, 0), "function");
    CHECK(json_array_size(c) == 1 && !strcmp(json_string_value(json_object_get(f, "arguments")), "{\"city\":\"Oslo\"}"),
          "Llama 3 JSON call with parameters");
    json_decref(c);
    free(content);
    CHECK(!srv_tool_calls("Just a story about a cat.", &content) && !content, "plain text: no tool calls");
    CHECK(!srv_tool_calls("<tool_call>{not json</tool_call>", &content), "a malformed call is not a call");
}

static void t_response(void) {
    srv_req *r = NULL;
    char param[64];
    parse(SRV_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],\"tools\":[{\"type\":\"function\","
          "\"function\":{\"name\":\"f\"}}],\"logprobs\":true,\"top_logprobs\":1}", &r, param);
    snprintf(r->id, sizeof r->id, "chatcmpl-1");
    const char *parts[] = {"<tool_call>", "{\"name\":\"f\",\"arguments\":{}}", "</tool_call>"};
    for (int i = 0; i < 3; i++) {
        srv_event ev = {.choice = 0, .token = 5 + i, .text = strdup(parts[i]), .tok_text = strdup(parts[i]), .logprob = -0.5f,
                        .n_top = 1, .top = {{5, -0.5f}}};
        srv_req_push(r, &ev);
    }
    srv_event fin = {.choice = 0, .token = -1, .text = strdup(""), .finish = "stop"};
    srv_req_push(r, &fin);
    r->done = 1;
    char *js = srv_final_json(&S, r);
    json_t *j = js ? json_loads(js, 0, NULL) : NULL;
    json_t *c0 = json_array_get(json_object_get(j, "choices"), 0);
    CHECK(!strcmp(json_string_value(json_object_get(c0, "finish_reason")), "tool_calls") &&
          json_array_size(json_object_get(json_object_get(c0, "message"), "tool_calls")) == 1 &&
          json_array_size(json_object_get(json_object_get(c0, "logprobs"), "content")) == 3,
          "a chat reply holding a tool call: message.tool_calls, finish_reason tool_calls");
    json_decref(j);
    free(js);
    char *buf = NULL;
    size_t len = 0, cap = 0;
    srv_sse_state ss = {0};
    srv_sse_events(&S, r, 0, r->n_ev, &ss, &buf, &len, &cap);
    srv_sse_tail(&S, r, &buf, &len, &cap);
    CHECK(buf && strstr(buf, "\"role\":\"assistant\"") && strstr(buf, "\"finish_reason\":\"tool_calls\"") &&
              strstr(buf, "\"tool_calls\":[{") && !strstr(buf, "\"delta\":{\"content\":\"<tool_call>") && strstr(buf, "data: [DONE]\n\n"),
          "SSE chunks: a role chunk, the tool call as a tool_calls delta (no tag in the content), finish tool_calls, [DONE]");
    srv_sse_state_free(&ss);
    free(buf);
    srv_req_unref(r);
}

/* a streamed reply cut into the same calls and content as the whole reply (srv_tool_calls), whatever
 * the token boundaries: every split of the text into 1..3 pieces at every position */
static char *stream_pieces(const char **pieces, int n, json_t **calls_out, const char **finish) {
    srv_req *r = NULL;
    char param[64];
    parse(SRV_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],\"stream\":true,\"tools\":[{\"type\":\"function\","
          "\"function\":{\"name\":\"f\"}}]}", &r, param);
    for (int i = 0; i < n; i++) {
        srv_event ev = {.choice = 0, .token = 5 + i, .text = strdup(pieces[i]), .tok_text = strdup(pieces[i])};
        srv_req_push(r, &ev);
    }
    srv_event fin = {.choice = 0, .token = -1, .text = strdup(""), .finish = "stop"};
    srv_req_push(r, &fin);
    r->done = 1;
    char *buf = NULL, *content = NULL;
    size_t len = 0, cap = 0, cl = 0, cc = 0;
    srv_sse_state ss = {0};
    for (int i = 0; i < r->n_ev; i++) srv_sse_events(&S, r, i, i + 1, &ss, &buf, &len, &cap);   /* one event at a time */
    srv_sse_state_free(&ss);
    *calls_out = json_array();
    *finish = NULL;
    srv_buf_put(&content, &cl, &cc, "", 0);
    for (char *p = buf; p && (p = strstr(p, "data: ")); p += 6) {   /* the client's side: join the deltas */
        json_t *j = json_loads(p + 6, JSON_DISABLE_EOF_CHECK, NULL);
        json_t *c0 = json_array_get(json_object_get(j, "choices"), 0), *d = json_object_get(c0, "delta");
        const char *t = json_string_value(json_object_get(d, "content"));
        if (t) srv_buf_put(&content, &cl, &cc, t, strlen(t));
        json_t *tc = json_object_get(d, "tool_calls");
        for (size_t i = 0; i < json_array_size(tc); i++) json_array_append(*calls_out, json_array_get(tc, i));
        if (json_is_string(json_object_get(c0, "finish_reason")))
            *finish = json_string_value(json_object_get(c0, "finish_reason"))[0] == 't' ? "tool_calls" : "stop";
        json_decref(j);
    }
    free(buf);
    srv_req_unref(r);
    return content;
}

static void t_stream_tools(void) {
    const char *texts[] = {
        "Let me check.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>",
        "<tool_call>{\"name\":\"a\",\"arguments\":{}}</tool_call> and <tool_call>{\"name\":\"b\",\"arguments\":{\"x\":1}}</tool_call>",
        "<|python_tag|>{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Oslo\"}}",
        " {\"name\": \"f\", \"parameters\": {}}",
        "a < b and <tool a cat",
        "<tool_call>{not json</tool_call> tail",
        "<tool_call> never closed",
        "{ not a call",
    };
    int bad = 0, runs = 0;
    for (size_t ti = 0; ti < sizeof texts / sizeof *texts; ti++) {
        const char *t = texts[ti];
        size_t n = strlen(t);
        char *want_content = NULL;
        json_t *want = srv_tool_calls(t, &want_content);
        char *want_text = want ? want_content : strdup(t);
        if (!want) free(want_content);
        for (size_t a = 0; a <= n; a += 1)
            for (size_t b = a; b <= n; b += 3) {
                char *p0 = strndup(t, a), *p1 = strndup(t + a, b - a), *p2 = strdup(t + b);
                const char *pieces[3] = {p0, p1, p2};
                json_t *got = NULL;
                const char *finish = NULL;
                char *content = stream_pieces(pieces, 3, &got, &finish);
                /* the whole reply's content is trimmed of white space around calls; the stream's is not */
                char *cs = content, *ce = content + strlen(content);
                while (want && (*cs == ' ' || *cs == '\n')) cs++;
                while (want && ce > cs && (ce[-1] == ' ' || ce[-1] == '\n')) ce--;
                *ce = 0;
                int same = !strcmp(cs, want_text) && json_array_size(got) == (want ? json_array_size(want) : 0) && finish &&
                           !strcmp(finish, want ? "tool_calls" : "stop");
                for (size_t i = 0; same && want && i < json_array_size(want); i++) {
                    json_t *g = json_object_get(json_array_get(got, i), "function"), *w = json_object_get(json_array_get(want, i), "function");
                    same = json_equal(json_object_get(g, "name"), json_object_get(w, "name")) &&
                           json_equal(json_object_get(g, "arguments"), json_object_get(w, "arguments")) &&
                           json_integer_value(json_object_get(json_array_get(got, i), "index")) == (json_int_t)i;
                }
                if (!same && bad++ < 3)
                    printf("# split %zu/%zu of text %zu: content '%s' (want '%s'), %zu calls (want %zu), finish %s\n", a, b, ti, cs,
                           want_text, json_array_size(got), want ? json_array_size(want) : 0, finish ? finish : "none");
                runs++;
                json_decref(got);
                free(content); free(p0); free(p1); free(p2);
            }
        json_decref(want);
        free(want_text);
    }
    CHECK(!bad, "streamed tool calls: %d splits of 8 replies into 3 pieces each give srv_tool_calls' calls and content (%d differ)", runs, bad);
}

/* ------------------------------------------------------------ fuzz */

static const char *seeds[] = {
    "{\"prompt\":\"Once upon a time\",\"max_tokens\":7,\"temperature\":0.5,\"stop\":[\"a\"],\"logprobs\":3,\"n\":2}",
    "{\"prompt\":[1,2,3],\"logit_bias\":{\"13\":2.5},\"stream\":true,\"stream_options\":{\"include_usage\":true}}",
    "{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],\"logprobs\":true,\"top_logprobs\":2,\"tools\":[]}",
};
static const char *keys[] = {"prompt", "messages", "max_tokens", "max_completion_tokens", "temperature", "top_p", "top_k",
                             "min_p", "repetition_penalty", "presence_penalty", "frequency_penalty", "seed", "stop",
                             "logit_bias", "logprobs", "top_logprobs", "n", "stream", "stream_options", "echo", "model",
                             "tools", "chat_template_kwargs", "repetition_context_size"};

static json_t *rand_value(unsigned *seed, int depth) {
    switch (rand_r(seed) % (depth > 2 ? 6 : 9)) {
    case 0: return json_integer((json_int_t)rand_r(seed) - RAND_MAX / 2);
    case 1: return json_integer(rand_r(seed) % 2 ? INT64_MAX : INT64_MIN);
    case 2: return json_real((rand_r(seed) % 2 ? 1e300 : 1.0) * ((double)rand_r(seed) / RAND_MAX - 0.5));
    case 3: return json_string(rand_r(seed) % 2 ? "Lily" : "");
    case 4: return json_boolean(rand_r(seed) % 2);
    case 5: return json_null();
    case 6: {
        json_t *a = json_array();
        for (int i = rand_r(seed) % 4; i > 0; i--) json_array_append_new(a, rand_value(seed, depth + 1));
        return a;
    }
    case 7: {
        json_t *o = json_object();
        json_object_set_new(o, "role", json_string("user"));
        json_object_set_new(o, "content", rand_value(seed, depth + 1));
        return json_pack("[o]", o);
    }
    default: {
        json_t *o = json_object();
        for (int i = rand_r(seed) % 3; i > 0; i--) {
            char k[16];
            snprintf(k, sizeof k, "%u", rand_r(seed) % 600);
            json_object_set_new(o, rand_r(seed) % 2 ? k : "include_usage", rand_value(seed, depth + 1));
        }
        return o;
    }
    }
}

static void t_fuzz(void) {
    unsigned seed = 99;
    int bad = 0, n = 0, accepted = 0;
    double t0 = srv_now();
    char param[64];
    for (; srv_now() - t0 < 3.0; n++) {
        char *body;
        int kind = rand_r(&seed) % 2;
        if (n % 2) {   /* byte mutations of a valid body */
            const char *s = seeds[rand_r(&seed) % 3];
            size_t l = strlen(s);
            body = malloc(l + 8);
            memcpy(body, s, l + 1);
            for (int k = rand_r(&seed) % 4; k >= 0; k--) {
                size_t at = rand_r(&seed) % l;
                switch (rand_r(&seed) % 3) {
                case 0: body[at] = (char)(rand_r(&seed) % 256 ?: 1); break;
                case 1: body[at] = "{}[]\",:0e-9"[rand_r(&seed) % 11]; break;
                default: body[at] = 0; l = at ? at : 1; break;
                }
            }
        } else {       /* the known fields with random types */
            json_t *o = json_object();
            for (int k = rand_r(&seed) % 6; k >= 0; k--)
                json_object_set_new(o, keys[rand_r(&seed) % (sizeof keys / sizeof *keys)], rand_value(&seed, 0));
            if (rand_r(&seed) % 2) json_object_set_new(o, kind ? "messages" : "prompt", kind ? json_pack("[{s:s,s:s}]", "role", "user", "content", "hi") : json_string("hi"));
            body = json_dumps(o, JSON_COMPACT);
            json_decref(o);
        }
        srv_req *r = NULL;
        int st = parse(kind, body, &r, param);
        if (st == 0) { accepted++; if (!sane(r)) bad++; srv_req_unref(r); }
        else if (st < 400 || st > 499) bad++;
        free(body);
    }
    CHECK(bad == 0 && n > 100, "fuzz: %d bodies (%d accepted), each 0 or 4xx, accepted ones in range (%d bad)", n, accepted, bad);
}

int main(void) {
    char dir[600], err[256];
    snprintf(dir, sizeof dir, "%s/models/stories260k", shared_dir());
    cinfer_tokenizer *t = NULL;
    if (cinfer_tokenizer_load(dir, &t, err, sizeof err)) { CHECK(0, "tokenizer loads: %s", err); return CHECK_DONE(); }
    S.tok = t;
    S.n_vocab = cinfer_tokenizer_n_vocab(t);
    S.max_pos = 512;
    S.bos = 1;
    S.anchor = -1;
    S.o.model_id = "stories260k";
    S.o.model_dir = dir;
    S.o.max_tokens = 64;
    S.chat_template = strdup("{% for m in messages %}{{ m.role }}: {{ m.content }}\n{% endfor %}");
    t_fields();
    t_tools();
    t_response();
    t_stream_tools();
    t_fuzz();
    free(S.chat_template);
    cinfer_tokenizer_free(t);
    return CHECK_DONE();
}
