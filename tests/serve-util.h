/*
 * serve-util.h — helpers of tests/test-serve.c: start `cinfer serve` on a
 * free loopback port and stop it, and a minimal HTTP/1.1 client over raw
 * sockets (so hostile requests can be malformed on purpose). Responses are
 * read to the end (Connection: close) and de-chunked.
 */
#ifndef CINFER_SERVE_UTIL_H
#define CINFER_SERVE_UTIL_H
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

typedef struct server { pid_t pid; int port; char log[128]; } server;

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static int tcp_connect(int port) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0) return -1;
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    struct timeval tv = {60, 0};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
    if (connect(fd, (struct sockaddr *)&a, sizeof a)) { close(fd); return -1; }
    return fd;
}

static int send_all(int fd, const char *p, size_t n) {
    while (n) {
        ssize_t k = send(fd, p, n, MSG_NOSIGNAL);
        if (k <= 0) return -1;
        p += k;
        n -= (size_t)k;
    }
    return 0;
}

/* reads until the peer closes; returns a malloc'd buffer */
static char *read_all(int fd, size_t *len) {
    size_t cap = 65536, n = 0;
    char *b = malloc(cap);
    for (;;) {
        if (n + 4096 > cap) b = realloc(b, cap *= 2);
        ssize_t k = recv(fd, b + n, cap - n - 1, 0);
        if (k <= 0) break;
        n += (size_t)k;
    }
    b[n] = 0;
    if (len) *len = n;
    return b;
}

/* de-chunks a chunked body in place */
static void dechunk(char *b) {
    char *r = b, *w = b;
    for (;;) {
        char *end;
        long n = strtol(r, &end, 16);
        if (end == r || n <= 0) break;
        r = strstr(end, "\r\n");
        if (!r) break;
        r += 2;
        memmove(w, r, (size_t)n);
        w += n;
        r += n + 2;
    }
    *w = 0;
}

/* one request; returns the status (-1: no response) and the body in *body (malloc'd) */
static int http_raw(int port, const char *req, size_t req_len, char **body) {
    if (body) *body = NULL;
    int fd = tcp_connect(port);
    if (fd < 0) return -1;
    send_all(fd, req, req_len);   /* a refused body (413) may fail half way: read the answer anyway */
    char *r = read_all(fd, NULL);
    close(fd);
    int status = -1;
    if (sscanf(r, "HTTP/1.%*d %d", &status) != 1) status = -1;
    char *b = strstr(r, "\r\n\r\n");
    if (b && body) {
        int chunked = strcasestr(r, "transfer-encoding: chunked") && strcasestr(r, "transfer-encoding: chunked") < b;
        memmove(r, b + 4, strlen(b + 4) + 1);
        if (chunked) dechunk(r);
        *body = r;
    } else free(r);
    return status;
}

static const char *g_key = "sk-test";

static int http(int port, const char *method, const char *path, const char *json, char **body) {
    size_t jl = json ? strlen(json) : 0;
    char *req = malloc(jl + 512);
    int n = snprintf(req, 512, "%s %s HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\nAuthorization: Bearer %s\r\n"
                     "Content-Type: application/json\r\nContent-Length: %zu\r\n\r\n", method, path, g_key, jl);
    if (json) memcpy(req + n, json, jl);
    int st = http_raw(port, req, (size_t)n + jl, body);
    free(req);
    return st;
}

static int start_server(server *s, const char *bin, const char *const *args) {
    snprintf(s->log, sizeof s->log, "/tmp/cinfer-serve-%d-XXXXXX", (int)getpid());
    int lf = mkstemp(s->log);
    if (lf < 0) return -1;
    const char *argv[64];
    int k = 0;
    argv[k++] = bin;
    argv[k++] = "serve";
    for (int i = 0; args[i] && k < 60; i++) argv[k++] = args[i];
    argv[k++] = "--port";
    argv[k++] = "0";
    argv[k] = NULL;
    s->pid = fork();
    if (s->pid == 0) {
        dup2(lf, 2);
        int nul = open("/dev/null", O_WRONLY);
        dup2(nul, 1);
        execv(bin, (char *const *)argv);
        _exit(127);
    }
    close(lf);
    s->port = 0;
    for (double t0 = now_s(); now_s() - t0 < 60; usleep(20000)) {
        FILE *f = fopen(s->log, "r");
        char line[512];
        while (f && fgets(line, sizeof line, f)) {
            char *p = strstr(line, "listening on http://127.0.0.1:");
            if (p) s->port = atoi(p + strlen("listening on http://127.0.0.1:"));
        }
        if (f) fclose(f);
        if (s->port > 0) {
            char *b = NULL;
            int st = http(s->port, "GET", "/health", NULL, &b);
            free(b);
            if (st == 200) return 0;
        }
        int status;
        if (waitpid(s->pid, &status, WNOHANG) == s->pid) return -1;
    }
    return -1;
}

/* SIGTERM, then the exit status (-1: had to be killed) */
static int stop_server(server *s) {
    kill(s->pid, SIGTERM);
    int status = 0;
    for (double t0 = now_s(); now_s() - t0 < 30; usleep(20000))
        if (waitpid(s->pid, &status, WNOHANG) == s->pid) return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
    kill(s->pid, SIGKILL);
    waitpid(s->pid, &status, 0);
    return -1;
}

static long rss_kb(pid_t pid) {
    char p[64], line[256];
    snprintf(p, sizeof p, "/proc/%d/status", (int)pid);
    FILE *f = fopen(p, "r");
    long kb = -1;
    while (f && fgets(line, sizeof line, f))
        if (!strncmp(line, "VmRSS:", 6)) kb = atol(line + 6);
    if (f) fclose(f);
    return kb;
}
#endif
