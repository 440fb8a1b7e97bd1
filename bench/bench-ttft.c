/*
 * bench-ttft.c — time to first token with a long shared prefix: cold (the
 * whole prompt prefilled), warm from the cache directory (the same prompt
 * again, and another suffix after the same prefix, served by the block
 * checkpoint), warm from an mlx-lm prompt-cache file of the prefix; next to
 * the time to read the entry at the disk's read speed (measured here with
 * O_DIRECT on the entry itself, so the page cache does not answer).
 *
 * usage: bench-ttft MODEL_DIR [--prefix N] [--suffix N] [--threads N] [--kv-dtype D] [--dir DIR]
 *        [--fp-only 1] [--device cpu|cuda]
 */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#include "cinfer.h"

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

typedef struct first { double t0, t; } first;

static int on_tok(int32_t tok, const char *text, void *user) {
    first *f = user;
    (void)tok;
    (void)text;
    if (!f->t) f->t = now() - f->t0;
    return 1;
}

/* TTFT of feeding ids[n] after what c holds (from t0) */
static double gen_first(cinfer_ctx *c, const int32_t *ids, int n, double t0) {
    cinfer_sampler_params sp = cinfer_sampler_defaults();
    first f = {t0, 0};
    if (cinfer_generate(c, ids, n, &sp, 1, on_tok, &f, NULL)) { fprintf(stderr, "generate: %s\n", cinfer_ctx_error(c)); exit(1); }
    return f.t;
}

/* bytes/s reading path with O_DIRECT (no page cache) */
static double direct_read(const char *path, size_t *bytes) {
    int fd = open(path, O_RDONLY | O_DIRECT);
    if (fd < 0) return 0;
    size_t cap = 8u << 20, got = 0;
    void *buf = NULL;
    if (posix_memalign(&buf, 4096, cap)) { close(fd); return 0; }
    double t0 = now();
    ssize_t r;
    while ((r = read(fd, buf, cap)) > 0) got += (size_t)r;
    double dt = now() - t0;
    free(buf);
    close(fd);
    *bytes = got;
    return dt > 0 ? got / dt : 0;
}

int main(int argc, char **argv) {
    if (argc < 2) { fprintf(stderr, "usage: bench-ttft MODEL_DIR [--prefix N] [--suffix N] [--threads N] [--kv-dtype D] [--dir DIR] [--fp-only 1] [--device cpu|cuda]\n"); return 2; }
    int np = 4000, ns = 16, threads = 0, fp_only = 0;
    const char *kvdt = "f16", *dir = "/tmp/cinfer-bench-ttft", *device = NULL;
    for (int i = 2; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--prefix")) np = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--suffix")) ns = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--threads")) threads = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--kv-dtype")) kvdt = argv[i + 1];
        else if (!strcmp(argv[i], "--dir")) dir = argv[i + 1];
        else if (!strcmp(argv[i], "--fp-only")) fp_only = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--device")) device = argv[i + 1];
    }
    setvbuf(stdout, NULL, _IOLBF, 0);
    char err[512], cmd[1200], fp[33];
    cinfer_load_opts lo = {0};
    lo.n_threads = threads;
    lo.device = device;
    cinfer_model *m = NULL;
    double t0 = now();
    if (cinfer_model_load(argv[1], &lo, &m, err, sizeof err)) { fprintf(stderr, "%s\n", err); return 1; }
    double t_load = now() - t0;
    {   /* opening a tier: the first time the fingerprints are computed and memoised, then a stat per file */
        char fdir[700];
        snprintf(fdir, sizeof fdir, "%s-fp", dir);
        snprintf(cmd, sizeof cmd, "rm -rf %s", fdir);
        if (system(cmd)) return 1;
        double to[3];
        for (int k = 0; k < 3; k++) {
            cinfer_tier *ft = NULL;
            double t1 = now();
            if (cinfer_tier_open(fdir, m, NULL, &ft, err, sizeof err)) { fprintf(stderr, "%s\n", err); return 1; }
            to[k] = now() - t1;
            cinfer_tier_free(ft);
        }
        printf("# tier open: first %.2f ms (fingerprints computed with the weights as the page cache has them, memo written), repeat %.3f / %.3f ms (memo: a stat per "
               "file); load %.2f ms; repeat / load = %.2f%%\n", to[0] * 1e3, to[1] * 1e3, to[2] * 1e3, t_load * 1e3,
               100 * (to[1] < to[2] ? to[1] : to[2]) / t_load);
        if (fp_only) return 0;
    }
    t0 = now();
    cinfer_model_fingerprint(m, fp);
    double t_fp = now() - t0;
    cinfer_model_info mi;
    cinfer_model_get_info(m, &mi);
    cinfer_ctx_opts co = {0};
    co.n_threads = threads;
    co.kv_dtype = kvdt;
    co.max_seqs = 1;
    cinfer_ctx *c = NULL;
    if (cinfer_ctx_new(m, &co, &c, err, sizeof err)) { fprintf(stderr, "%s\n", err); return 1; }
    int32_t *a = malloc(sizeof(int32_t) * (np + ns)), *b = malloc(sizeof(int32_t) * (np + ns));
    uint32_t r = 12345;
    for (int i = 0; i < np + ns; i++) { r = r * 1664525u + 1013904223u; a[i] = b[i] = 3 + (int32_t)((r >> 8) % (uint32_t)(mi.n_vocab - 3)); }
    for (int i = np; i < np + ns; i++) b[i] = 3 + (a[i] + 7) % (mi.n_vocab - 3);   /* another suffix */
    snprintf(cmd, sizeof cmd, "rm -rf %s && mkdir -p %s", dir, dir);
    if (system(cmd)) return 1;
    printf("# %s: %d layers, %d KV heads x %d, KV %s; prefix %d + suffix %d tokens; load %.3f s (weights mapped, read "
           "lazily: %.2f GB), model fingerprint again %.1f ms\n", argv[1], mi.n_layer, mi.n_kv_head, mi.head_dim, kvdt, np, ns, t_load,
           mi.weight_bytes / 1e9, t_fp * 1e3);

    double cold = gen_first(c, a, np + ns, now());
    printf("cold (prefill %d tokens)                         TTFT %8.3f s\n", np + ns, cold);

    char tdir[700], pcf[700];
    snprintf(tdir, sizeof tdir, "%s/tier", dir);
    snprintf(pcf, sizeof pcf, "%s/prefix.safetensors", dir);
    cinfer_tier *t = NULL;
    if (cinfer_tier_open(tdir, m, NULL, &t, err, sizeof err)) { fprintf(stderr, "%s\n", err); return 1; }
    int nc = 0, n = np + ns;
    cinfer_ctx_reset(c);
    t0 = now();
    cinfer_tier_prefill(t, c, 0, a, n, &nc);
    double fill = gen_first(c, a + n - 1, 1, t0);
    printf("--cache-dir, first run (prefill + store entries)  TTFT %8.3f s\n", fill);
    cinfer_ctx_reset(c);
    t0 = now();
    cinfer_tier_prefill(t, c, 0, a, n, &nc);
    double same = gen_first(c, a + n - 1, 1, t0);
    printf("--cache-dir, same prompt again (%d from disk)    TTFT %8.3f s\n", nc, same);
    cinfer_ctx_reset(c);
    t0 = now();
    cinfer_tier_prefill(t, c, 0, b, n, &nc);
    double other = gen_first(c, b + n - 1, 1, t0);
    printf("--cache-dir, same prefix, other suffix (%d from disk, %d fed) TTFT %8.3f s\n", nc, n - 1 - nc, other);

    cinfer_ctx_reset(c);
    cinfer_forward(c, a, 1, np, NULL, NULL, NULL, 0, NULL);
    if (cinfer_prompt_cache_save(c, 0, pcf, NULL, a, np)) { fprintf(stderr, "%s\n", cinfer_ctx_error(c)); return 1; }
    cinfer_ctx_reset(c);
    t0 = now();
    if (cinfer_prompt_cache_load(c, 0, pcf, NULL, NULL)) { fprintf(stderr, "%s\n", cinfer_ctx_error(c)); return 1; }
    double pc = gen_first(c, b + np, ns, t0);
    printf("--prompt-cache-file of the prefix (+%d fed)       TTFT %8.3f s\n", ns, pc);

    size_t bytes = 0;
    struct stat sb;
    double bw = direct_read(pcf, &bytes);
    if (!stat(pcf, &sb)) printf("# prefix state: %.1f MB; O_DIRECT read of it: %.2f GB/s -> %.3f s at the disk's read speed\n",
                                sb.st_size / 1e6, bw / 1e9, bw > 0 ? sb.st_size / bw : 0.0);
    cinfer_tier_free(t);
    cinfer_ctx_free(c);
    cinfer_model_free(m);
    free(a);
    free(b);
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    return system(cmd) ? 1 : 0;
}
