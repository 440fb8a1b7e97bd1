/*
 * serve-http.c — the HTTP side of `cinfer serve` on libmicrohttpd, one
 * thread per connection (a connection's thread may wait for its request;
 * it never blocks the engine or other connections).
 *
 * Routes: POST /v1/completions, /v1/chat/completions (and the same without
 * /v1), GET /v1/models[/ID], GET /health, OPTIONS anything (204 + CORS).
 * Bodies need a Content-Length (411) of at most --max-body (413, refused
 * before any of it is read). With --api-key, /v1 routes need
 * "Authorization: Bearer KEY" (401). A queue at --max-queue is 429; a model
 * still loading is 503. A client that disconnects marks its request
 * cancelled; the engine frees its sequences at the next step. One access-log
 * line per request goes to stderr: method, path, status, tokens, seconds.
 */
#include <arpa/inet.h>
#include <microhttpd.h>
#include <netdb.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <sys/socket.h>
#include "serve.h"

struct srv_http { srv *s; struct MHD_Daemon *d; };

typedef struct conn {
    char *body;
    size_t len, cap;
    int kind;              /* SRV_COMPLETION / SRV_CHAT */
    int status;            /* != 0: an early response (413, ...) was queued */
    double t0;
} conn;

/* a streaming response: the SSE bytes not yet handed to MHD */
typedef struct stream {
    srv *s;
    srv_req *r;
    int fd, ev_read, tail_done;
    srv_sse_state ss;
    char *buf;
    size_t len, cap, off;
    char path[32];
} stream;

static int client_gone(int fd) {
    if (fd < 0) return 0;
    struct pollfd p = {fd, POLLIN | POLLRDHUP, 0};
    if (poll(&p, 1, 0) <= 0) return 0;
    if (p.revents & (POLLRDHUP | POLLHUP | POLLERR | POLLNVAL)) return 1;
    char c;
    return recv(fd, &c, 1, MSG_PEEK | MSG_DONTWAIT) == 0;
}

static int conn_fd(struct MHD_Connection *c) {
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
    return ci ? ci->connect_fd : -1;
}

static void access_log(const srv *s, const char *method, const char *url, int status, int tokens, double t0) {
    if (!s->o.quiet)
        fprintf(stderr, "%s %.200s %d %d tokens %.3fs\n", method, url, status, tokens, srv_now() - t0);
}

static enum MHD_Result reply(srv *s, struct MHD_Connection *c, int status, char *body, const char *ctype) {
    size_t n = body ? strlen(body) : 0;
    struct MHD_Response *rsp = MHD_create_response_from_buffer(n, body ? body : (void *)"", body ? MHD_RESPMEM_MUST_FREE
                                                                                          : MHD_RESPMEM_PERSISTENT);
    if (!rsp) { free(body); return MHD_NO; }
    if (ctype) MHD_add_response_header(rsp, "Content-Type", ctype);
    MHD_add_response_header(rsp, "Access-Control-Allow-Origin", s->o.origins);
    enum MHD_Result ok = MHD_queue_response(c, (unsigned)status, rsp);
    MHD_destroy_response(rsp);
    return ok;
}

static enum MHD_Result reply_error(srv *s, struct MHD_Connection *c, int status, const char *msg, const char *param,
                                   const char *method, const char *url, double t0) {
    const char *type = status == 401 ? "authentication_error" : status == 404 ? "not_found_error"
                     : status == 429 ? "rate_limit_error" : status >= 500 ? "server_error" : "invalid_request_error";
    access_log(s, method, url, status, 0, t0);
    return reply(s, c, status, srv_error_json(msg, type, param, status), "application/json");
}

/* ------------------------------------------------------------ streaming */

static ssize_t stream_read(void *cls, uint64_t pos, char *out, size_t max) {
    (void)pos;
    stream *st = cls;
    srv_req *r = st->r;
    while (st->off == st->len) {
        st->off = st->len = 0;
        if (st->tail_done) return MHD_CONTENT_READER_END_OF_STREAM;
        pthread_mutex_lock(&r->mu);
        while (r->n_ev == st->ev_read && !r->done) {
            struct timespec ts;
            clock_gettime(CLOCK_REALTIME, &ts);
            ts.tv_nsec += 200 * 1000 * 1000;
            if (ts.tv_nsec >= 1000000000) { ts.tv_sec++; ts.tv_nsec -= 1000000000; }
            pthread_cond_timedwait(&r->cv, &r->mu, &ts);
            if (r->n_ev == st->ev_read && !r->done && client_gone(st->fd)) {
                pthread_mutex_unlock(&r->mu);
                return MHD_CONTENT_READER_END_WITH_ERROR;
            }
        }
        int ok = srv_sse_events(st->s, r, st->ev_read, r->n_ev, &st->ss, &st->buf, &st->len, &st->cap);
        st->ev_read = r->n_ev;
        if (ok && r->done) {
            ok = srv_sse_tail(st->s, r, &st->buf, &st->len, &st->cap);
            st->tail_done = 1;
        }
        pthread_mutex_unlock(&r->mu);
        if (!ok) return MHD_CONTENT_READER_END_WITH_ERROR;
    }
    size_t n = st->len - st->off < max ? st->len - st->off : max;
    memcpy(out, st->buf + st->off, n);
    st->off += n;
    return (ssize_t)n;
}

static void stream_free(void *cls) {
    stream *st = cls;
    atomic_store(&st->r->cancelled, 1);   /* a no-op when it finished; frees its sequences when the client left */
    pthread_mutex_lock(&st->s->mu);
    pthread_cond_signal(&st->s->cv);
    pthread_mutex_unlock(&st->s->mu);
    pthread_mutex_lock(&st->r->mu);
    int toks = st->r->completion_tokens;
    pthread_mutex_unlock(&st->r->mu);
    access_log(st->s, "POST", st->path, 200, toks, st->r->t_start);
    srv_req_unref(st->r);
    srv_sse_state_free(&st->ss);
    free(st->buf);
    free(st);
}

static enum MHD_Result reply_stream(srv *s, struct MHD_Connection *c, srv_req *r, const char *url) {
    stream *st = calloc(1, sizeof *st);
    if (!st) return MHD_NO;
    st->s = s;
    st->r = r;
    st->fd = conn_fd(c);
    snprintf(st->path, sizeof st->path, "%s", url);
    struct MHD_Response *rsp = MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 16384, stream_read, st, stream_free);
    if (!rsp) { free(st); srv_req_unref(r); return MHD_NO; }
    MHD_add_response_header(rsp, "Content-Type", "text/event-stream");
    MHD_add_response_header(rsp, "Cache-Control", "no-cache");
    MHD_add_response_header(rsp, "Access-Control-Allow-Origin", s->o.origins);
    enum MHD_Result ok = MHD_queue_response(c, 200, rsp);
    MHD_destroy_response(rsp);
    return ok;
}

/* ------------------------------------------------------------ generation */

static enum MHD_Result generate(srv *s, struct MHD_Connection *c, conn *cn, const char *url) {
    char msg[512], param[64];
    if (atomic_load(&s->ready) != 1)
        return reply_error(s, c, 503, atomic_load(&s->ready) < 0 ? "the model failed to load" : "the model is loading",
                           NULL, "POST", url, cn->t0);
    srv_req *r = NULL;
    int rc = srv_parse_request(s, cn->kind, cn->body ? cn->body : "", cn->len, &r, msg, sizeof msg, param, sizeof param);
    if (rc) return reply_error(s, c, rc, msg, param, "POST", url, cn->t0);
    long id = atomic_fetch_add(&s->next_id, 1);
    snprintf(r->id, sizeof r->id, "%s-%ld", r->kind == SRV_CHAT ? "chatcmpl" : "cmpl", id);
    r->created = (long)time(NULL);
    rc = srv_submit(s, r);
    if (rc) {
        srv_req_unref(r);
        return reply_error(s, c, rc, rc == 429 ? "too many requests are queued; retry later"
                                   : rc == 400 ? "'n' is larger than the server's --max-batch" : "the server is not ready",
                           rc == 400 ? "n" : NULL, "POST", url, cn->t0);
    }
    if (r->stream) return reply_stream(s, c, r, url);
    int fd = conn_fd(c);
    pthread_mutex_lock(&r->mu);
    while (!r->done) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_nsec += 200 * 1000 * 1000;
        if (ts.tv_nsec >= 1000000000) { ts.tv_sec++; ts.tv_nsec -= 1000000000; }
        pthread_cond_timedwait(&r->cv, &r->mu, &ts);
        if (!r->done && client_gone(fd)) {
            atomic_store(&r->cancelled, 1);
            pthread_mutex_unlock(&r->mu);
            srv_req_unref(r);
            access_log(s, "POST", url, 499, 0, cn->t0);
            return MHD_NO;
        }
    }
    int status = r->err_status;
    char *body = status ? srv_error_json(r->err, "server_error", NULL, status) : srv_final_json(s, r);
    int toks = r->completion_tokens;
    pthread_mutex_unlock(&r->mu);
    srv_req_unref(r);
    access_log(s, "POST", url, status ? status : 200, toks, cn->t0);
    return reply(s, c, status ? status : 200, body, "application/json");
}

/* ------------------------------------------------------------ routing */

static int authorized(const srv *s, struct MHD_Connection *c) {
    if (!s->o.api_key) return 1;
    const char *h = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Authorization");
    if (!h || strncmp(h, "Bearer ", 7)) return 0;
    const char *k = h + 7, *want = s->o.api_key;
    size_t n = strlen(want), m = strlen(k);
    unsigned diff = (unsigned)(n ^ m);
    for (size_t i = 0; i < n; i++) diff |= (unsigned char)want[i] ^ (unsigned char)(i < m ? k[i] : 0);
    return diff == 0;   /* compared in time independent of where they differ */
}

static int route_kind(const char *url) {
    if (!strcmp(url, "/v1/completions") || !strcmp(url, "/completions")) return SRV_COMPLETION;
    if (!strcmp(url, "/v1/chat/completions") || !strcmp(url, "/chat/completions")) return SRV_CHAT;
    return -1;
}

static enum MHD_Result handle_get(srv *s, struct MHD_Connection *c, const char *url, double t0) {
    if (!strcmp(url, "/health")) {
        int ready = atomic_load(&s->ready);
        pthread_mutex_lock(&s->mu);
        json_t *o = json_pack("{s:s,s:i,s:i,s:i,s:I,s:I,s:I}", "status", ready == 1 ? "ok" : ready < 0 ? "error" : "loading",
                              "running", s->st.running, "waiting", s->st.waiting + s->q_len, "cached_prefixes",
                              s->st.cached, "kv_bytes", (json_int_t)s->st.kv_held, "kv_budget", (json_int_t)s->st.kv_budget,
                              "preempted", (json_int_t)s->st.preempted);
        pthread_mutex_unlock(&s->mu);
        char *b = o ? json_dumps(o, JSON_COMPACT) : NULL;
        json_decref(o);
        access_log(s, "GET", url, ready == 1 ? 200 : 503, 0, t0);
        return reply(s, c, ready == 1 ? 200 : 503, b, "application/json");
    }
    if (!strcmp(url, "/v1/models") || !strncmp(url, "/v1/models/", 11)) {
        if (!authorized(s, c)) return reply_error(s, c, 401, "invalid or missing API key", NULL, "GET", url, t0);
        if (url[10] == '/' && strcmp(url + 11, s->o.model_id))
            return reply_error(s, c, 404, "no such model", "model", "GET", url, t0);
        access_log(s, "GET", url, 200, 0, t0);
        if (url[10] != '/') return reply(s, c, 200, srv_models_json(s), "application/json");
        json_t *o = json_pack("{s:s,s:s,s:i,s:s}", "id", s->o.model_id, "object", "model", "created", 0, "owned_by", "cinfer");
        char *b = o ? json_dumps(o, JSON_COMPACT) : NULL;
        json_decref(o);
        return reply(s, c, 200, b, "application/json");
    }
    return reply_error(s, c, route_kind(url) >= 0 ? 405 : 404, route_kind(url) >= 0 ? "use POST" : "no such route",
                       NULL, "GET", url, t0);
}

static enum MHD_Result handler(void *cls, struct MHD_Connection *c, const char *url, const char *method,
                               const char *version, const char *upload, size_t *upload_size, void **con_cls) {
    (void)version;
    srv *s = cls;
    conn *cn = *con_cls;
    if (!cn) {
        if (!(cn = calloc(1, sizeof *cn))) return MHD_NO;
        *con_cls = cn;
        cn->t0 = srv_now();
        if (!strcmp(method, "OPTIONS")) {
            struct MHD_Response *rsp = MHD_create_response_from_buffer(0, (void *)"", MHD_RESPMEM_PERSISTENT);
            if (!rsp) return MHD_NO;
            MHD_add_response_header(rsp, "Access-Control-Allow-Origin", s->o.origins);
            MHD_add_response_header(rsp, "Access-Control-Allow-Methods", "GET, POST, OPTIONS");
            MHD_add_response_header(rsp, "Access-Control-Allow-Headers", "Content-Type, Authorization");
            MHD_add_response_header(rsp, "Access-Control-Max-Age", "86400");
            enum MHD_Result ok = MHD_queue_response(c, 204, rsp);
            MHD_destroy_response(rsp);
            access_log(s, method, url, 204, 0, cn->t0);
            return ok;
        }
        if (!strcmp(method, "GET") || !strcmp(method, "HEAD")) return handle_get(s, c, url, cn->t0);
        cn->kind = route_kind(url);
        if (strcmp(method, "POST"))
            return reply_error(s, c, 405, "method not allowed", NULL, method, url, cn->t0);
        if (cn->kind < 0) return reply_error(s, c, 404, "no such route", NULL, method, url, cn->t0);
        if (!authorized(s, c)) return reply_error(s, c, 401, "invalid or missing API key", NULL, method, url, cn->t0);
        const char *cl = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Content-Length");
        char *end = NULL;
        unsigned long long n = cl ? strtoull(cl, &end, 10) : 0;
        if (!cl || end == cl || *end) return reply_error(s, c, 411, "a Content-Length header is required", NULL, method, url, cn->t0);
        if (n > s->o.max_body) {
            char m[128];
            snprintf(m, sizeof m, "the body is larger than the server's limit (--max-body %zu bytes)", s->o.max_body);
            return reply_error(s, c, 413, m, NULL, method, url, cn->t0);
        }
        cn->cap = (size_t)n + 1;
        if (!(cn->body = malloc(cn->cap))) return reply_error(s, c, 500, "out of memory", NULL, method, url, cn->t0);
        return MHD_YES;
    }
    if (*upload_size) {
        if (cn->len + *upload_size >= cn->cap) {   /* more than Content-Length said: MHD prevents this; be sure */
            *upload_size = 0;
            cn->status = 413;
            return MHD_YES;
        }
        memcpy(cn->body + cn->len, upload, *upload_size);
        cn->len += *upload_size;
        *upload_size = 0;
        return MHD_YES;
    }
    if (cn->status) return reply_error(s, c, cn->status, "the body is larger than its Content-Length", NULL, method, url, cn->t0);
    cn->body[cn->len] = 0;
    return generate(s, c, cn, url);
}

static void completed(void *cls, struct MHD_Connection *c, void **con_cls, enum MHD_RequestTerminationCode toe) {
    (void)cls; (void)c; (void)toe;
    conn *cn = *con_cls;
    if (!cn) return;
    free(cn->body);
    free(cn);
    *con_cls = NULL;
}

srv_http *srv_http_start(srv *s, char *err, size_t err_len) {
    struct addrinfo hints = {0}, *ai = NULL;
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
    char port[16];
    snprintf(port, sizeof port, "%d", s->o.port);
    int gai = getaddrinfo(s->o.host, port, &hints, &ai);
    if (gai) { snprintf(err, err_len, "cannot resolve --host %s: %s", s->o.host, gai_strerror(gai)); return NULL; }
    srv_http *h = calloc(1, sizeof *h);
    if (!h) { freeaddrinfo(ai); return NULL; }
    h->s = s;
    unsigned flags = MHD_USE_THREAD_PER_CONNECTION | MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_POLL;
    if (ai->ai_family == AF_INET6) flags |= MHD_USE_IPv6;
    h->d = MHD_start_daemon(flags, (uint16_t)s->o.port, NULL, NULL, handler, s, MHD_OPTION_SOCK_ADDR, ai->ai_addr,
                            MHD_OPTION_CONNECTION_LIMIT, (unsigned)s->o.max_conn, MHD_OPTION_CONNECTION_TIMEOUT,
                            (unsigned)(s->o.timeout_s + 5), MHD_OPTION_THREAD_STACK_SIZE, (size_t)(1 << 20),
                            MHD_OPTION_NOTIFY_COMPLETED, completed, NULL, MHD_OPTION_LISTENING_ADDRESS_REUSE, 1u,
                            MHD_OPTION_END);
    freeaddrinfo(ai);
    if (!h->d) {
        snprintf(err, err_len, "cannot listen on %s:%d (in use, or not an address of this machine)", s->o.host, s->o.port);
        free(h);
        return NULL;
    }
    return h;
}

void srv_http_stop(srv_http *h) {
    if (!h) return;
    MHD_stop_daemon(h->d);
    free(h);
}

int srv_http_port(const srv_http *h) {
    const union MHD_DaemonInfo *di = MHD_get_daemon_info(h->d, MHD_DAEMON_INFO_BIND_PORT);
    return di ? di->port : -1;
}
