/*
 * cmd-serve.c — `cinfer serve`: flags, startup and graceful shutdown of the
 * OpenAI-compatible server (serve.h describes its threads). The HTTP side
 * listens first so that clients see 503 while the model loads; SIGTERM or
 * SIGINT stops admitting requests, lets running ones finish (10 s grace),
 * then exits 0.
 */
#include <getopt.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include "cli.h"
#include "serve.h"

static void serve_help(FILE *f) {
    fprintf(f,
        "usage: cinfer serve -m DIR [options]\n\n"
        "An OpenAI-compatible HTTP server: POST /v1/completions, /v1/chat/completions; GET /v1/models,\n"
        "/health. All running requests decode together in one batch; cached prompt prefixes are reused.\n\n"
        "  -m, --model DIR            model directory\n"
        "      --host ADDR            address to listen on (default 127.0.0.1)\n"
        "      --port N               port (default 8080; 0 picks a free one)\n"
        "      --model-id ID          the model's name in the API (default: the directory's name)\n"
        "      --api-key KEY          require 'Authorization: Bearer KEY'\n"
        "      --allowed-origins O    Access-Control-Allow-Origin (default *)\n"
        "      --chat-template T      a chat template: a file, or the template text itself\n"
        "      --max-batch N          sequences decoded together (default 32)\n"
        "      --max-tokens N         default max_tokens of a request (default 512)\n"
        "      --max-queue N          requests waiting beyond which the server answers 429 (default 256)\n"
        "      --max-body SIZE        largest request body (default 16M)\n"
        "      --max-connections N    open connections (default 1024)\n"
        "      --timeout S            seconds a request may take (default 600)\n"
        "      --step-tokens N        tokens per engine step: decode rows + prompt chunks (default 512)\n"
        "      --prompt-cache-size N  cached prompt prefixes (default 16)\n"
        "      --cache-dir DIR        a second level of the prefix cache on disk: a prompt missing in\n"
        "                             memory is looked up there; prompts are stored by a writer thread\n"
        "      --cache-dir-max-gb G   evict least recently used entries past G GB\n"
        "      --batch-invariant      each result bit for bit independent of the batch (CPU;\n"
        "                             CUDA: f32 matmuls, within float rounding)\n"
        "  -t, --threads N            CPU threads (default: all cores)\n"
        "      --device cpu|cuda      backend (default cpu)\n"
        CLI_KV_HELP
        "                             (serve on CUDA: the KV cache defaults to a bf16/f16 model's own dtype,\n"
        "                             as mlx-lm's cache and llama-server's do; --kv-dtype f32 keeps f32)\n"
        "  -q, --quiet                no access log\n"
        "  -h, --help                 this help\n");
}

enum { O_HOST = 0x300, O_PORT, O_ID, O_KEY, O_ORIG, O_TMPL, O_BATCH, O_MAXTOK, O_QUEUE, O_BODY, O_CONN, O_TIMEOUT,
       O_STEP, O_PCACHE, O_BINV, O_DEV, O_LOG };

static int parse_serve(int argc, char **argv, srv_opts *o) {
    static const struct option lo[] = {
        {"model", 1, 0, 'm'}, {"host", 1, 0, O_HOST}, {"port", 1, 0, O_PORT}, {"model-id", 1, 0, O_ID},
        {"api-key", 1, 0, O_KEY}, {"allowed-origins", 1, 0, O_ORIG}, {"chat-template", 1, 0, O_TMPL},
        {"max-batch", 1, 0, O_BATCH}, {"decode-concurrency", 1, 0, O_BATCH}, {"max-tokens", 1, 0, O_MAXTOK},
        {"max-queue", 1, 0, O_QUEUE}, {"max-body", 1, 0, O_BODY}, {"max-connections", 1, 0, O_CONN},
        {"timeout", 1, 0, O_TIMEOUT}, {"step-tokens", 1, 0, O_STEP}, {"prompt-cache-size", 1, 0, O_PCACHE},
        {"batch-invariant", 0, 0, O_BINV}, {"threads", 1, 0, 't'}, {"device", 1, 0, O_DEV}, {"log-level", 1, 0, O_LOG},
        {"quiet", 0, 0, 'q'}, {"help", 0, 0, 'h'}, CLI_KV_LONGOPTS, CLI_TIER_LONGOPTS, {0, 0, 0, 0}};
    memset(o, 0, sizeof *o);
    o->host = "127.0.0.1";
    o->origins = "*";
    o->port = 8080;
    o->max_batch = 32;
    o->max_tokens = 512;
    o->max_queue = 256;
    o->max_body = 16u << 20;
    o->max_conn = 1024;
    o->timeout_s = 600;
    o->step_tokens = 512;
    o->prompt_cache = 16;
    optind = 1;
    opterr = 0;
    int c;
    const char *cmd = "serve";
    while ((c = getopt_long(argc, argv, "m:t:qh", lo, NULL)) != -1) {
        cli_cache cc = {0};
        int kv = cli_kv_flag(cmd, c, optarg, &o->co);
        if (!kv && (kv = cli_cache_flag(cmd, c, optarg, &cc)) > 0) {
            if (cc.dir) o->cache_dir = cc.dir;
            else o->cache_max = cc.max_bytes;
        }
        if (kv < 0) return 2;
        if (kv) continue;
        switch (c) {
        case 'm': o->model_dir = optarg; break;
        case O_HOST: o->host = optarg; break;
        case O_PORT: if (!cli_int(cmd, "--port", optarg, 0, 65535, &o->port)) return 2; break;
        case O_ID: o->model_id = optarg; break;
        case O_KEY: o->api_key = optarg; break;
        case O_ORIG: o->origins = optarg; break;
        case O_TMPL: o->chat_template = optarg; break;
        case O_BATCH: if (!cli_int(cmd, "--max-batch", optarg, 1, 4096, &o->max_batch)) return 2; break;
        case O_MAXTOK: if (!cli_int(cmd, "--max-tokens", optarg, 0, 1 << 24, &o->max_tokens)) return 2; break;
        case O_QUEUE: if (!cli_int(cmd, "--max-queue", optarg, 1, 1 << 20, &o->max_queue)) return 2; break;
        case O_BODY:
            if (!cli_size(optarg, &o->max_body)) { fprintf(stderr, "cinfer serve: bad value for --max-body\n"); return 2; }
            break;
        case O_CONN: if (!cli_int(cmd, "--max-connections", optarg, 1, 1 << 20, &o->max_conn)) return 2; break;
        case O_TIMEOUT: if (!cli_int(cmd, "--timeout", optarg, 1, 1 << 24, &o->timeout_s)) return 2; break;
        case O_STEP: if (!cli_int(cmd, "--step-tokens", optarg, 1, 1 << 20, &o->step_tokens)) return 2; break;
        case O_PCACHE: if (!cli_int(cmd, "--prompt-cache-size", optarg, 0, 1 << 16, &o->prompt_cache)) return 2; break;
        case O_BINV: o->co.batch_invariant = 1; break;
        case 't': if (!cli_int(cmd, "--threads", optarg, 1, 1024, &o->threads)) return 2; break;
        case O_DEV: o->device = optarg; break;
        case O_LOG: o->quiet = !strcmp(optarg, "error") || !strcmp(optarg, "warning") || !strcmp(optarg, "critical"); break;
        case 'q': o->quiet = 1; break;
        case 'h': serve_help(stdout); return -1;
        default:
            fprintf(stderr, "cinfer serve: unknown or incomplete option '%s'\n", argv[optind - 1]);
            serve_help(stderr);
            return 2;
        }
    }
    if (optind < argc) { fprintf(stderr, "cinfer serve: unexpected argument '%s'\n", argv[optind]); return 2; }
    if (!o->model_dir) { fprintf(stderr, "cinfer serve: -m DIR is required (try --help)\n"); return 2; }
    return 0;
}

/* the directory's last component: the default --model-id */
static void default_id(srv_opts *o, char *buf, size_t n) {
    size_t l = strlen(o->model_dir);
    while (l > 1 && o->model_dir[l - 1] == '/') l--;
    size_t b = l;
    while (b > 0 && o->model_dir[b - 1] != '/') b--;
    snprintf(buf, n, "%.*s", (int)(l - b), o->model_dir + b);
    o->model_id = buf;
}

int cmd_serve(int argc, char **argv) {
    srv s;
    memset(&s, 0, sizeof s);
    int rc = parse_serve(argc, argv, &s.o);
    if (rc) return rc < 0 ? 0 : rc;
    char idbuf[256], err[512];
    if (!s.o.model_id) default_id(&s.o, idbuf, sizeof idbuf);
    if (s.o.chat_template) {   /* a readable file, else the template text itself */
        struct stat stt;
        s.chat_template = stat(s.o.chat_template, &stt) == 0 && S_ISREG(stt.st_mode) ? cli_read_file(s.o.chat_template, NULL, NULL)
                                                                                   : strdup(s.o.chat_template);
        if (!s.chat_template) { fprintf(stderr, "cinfer serve: cannot read --chat-template\n"); return 1; }
    }
    pthread_mutex_init(&s.mu, NULL);
    pthread_cond_init(&s.cv, NULL);
    /* every thread inherits this mask; main alone takes the signals, in sigwait */
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGTERM);
    sigaddset(&set, SIGINT);
    sigaddset(&set, SIGPIPE);
    pthread_sigmask(SIG_BLOCK, &set, NULL);
    srv_http *h = srv_http_start(&s, err, sizeof err);
    if (!h) { fprintf(stderr, "cinfer serve: %s\n", err); free(s.chat_template); return 1; }
    fprintf(stderr, "cinfer serve: listening on http://%s:%d\n", s.o.host, srv_http_port(h));
    if (srv_engine_start(&s)) {
        fprintf(stderr, "cinfer serve: cannot start the engine thread\n");
        rc = 1;
    } else {
        sigdelset(&set, SIGPIPE);
        for (;;) {   /* wait for a signal, or for the model to fail loading */
            struct timespec ts = {0, 200 * 1000 * 1000};
            int sig = sigtimedwait(&set, NULL, &ts);
            if (sig == SIGTERM || sig == SIGINT) break;
            if (atomic_load(&s.ready) < 0) { rc = 1; break; }
        }
        if (!rc) fprintf(stderr, "cinfer serve: shutting down\n");
    }
    srv_engine_stop(&s);
    srv_http_stop(h);
    srv_engine_free(&s);
    free(s.chat_template);
    pthread_mutex_destroy(&s.mu);
    pthread_cond_destroy(&s.cv);
    return rc;
}
