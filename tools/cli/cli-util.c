/*
 * cli-util.c — helpers shared by the CLI commands: strict number parsing
 * with messages that name the flag, whole-file reads, model loading with the
 * library's error printed.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "cli.h"

int cli_int(const char *cmd, const char *flag, const char *v, long lo, long hi, int *out) {
    char *e;
    errno = 0;
    long x = v ? strtol(v, &e, 10) : 0;
    if (!v || !*v || *e || errno || x < lo || x > hi) {
        fprintf(stderr, "cinfer %s: bad value for %s: '%s' (expected an integer in [%ld, %ld])\n", cmd, flag, v ? v : "", lo, hi);
        return 0;
    }
    *out = (int)x;
    return 1;
}

int cli_float(const char *cmd, const char *flag, const char *v, float *out) {
    char *e;
    errno = 0;
    float x = v ? strtof(v, &e) : 0;
    if (!v || !*v || *e || errno || x != x) {
        fprintf(stderr, "cinfer %s: bad value for %s: '%s' (expected a number)\n", cmd, flag, v ? v : "");
        return 0;
    }
    *out = x;
    return 1;
}

int cli_parse_ids(const char *s, int32_t **ids, int *n) {
    int cap = 16, ok = 1;
    *n = 0;
    *ids = malloc(sizeof(int32_t) * cap);
    while (*ids && *s && ok) {
        char *e;
        long v = strtol(s, &e, 10);
        ok = e != s && v >= 0 && v <= 2147483647 && (!*e || *e == ',');
        if (ok && *n == cap) {
            int32_t *p = realloc(*ids, sizeof(int32_t) * (cap *= 2));
            if (!p) { ok = 0; break; }
            *ids = p;
        }
        if (ok) (*ids)[(*n)++] = (int32_t)v;
        s = *e ? e + 1 : e;
    }
    if (!*ids || !ok || *n == 0) {
        free(*ids);
        *ids = NULL;
        return 0;
    }
    return 1;
}

char *cli_read_file(const char *path, size_t *len) {
    FILE *f = strcmp(path, "-") ? fopen(path, "rb") : stdin;
    if (!f) return NULL;
    size_t cap = 1 << 16, n = 0;
    char *buf = malloc(cap);
    while (buf) {
        size_t got = fread(buf + n, 1, cap - n - 1, f);
        n += got;
        if (n + 1 < cap) break;
        char *nb = realloc(buf, cap * 2);
        if (!nb) { free(buf); buf = NULL; break; }
        buf = nb;
        cap *= 2;
    }
    int bad = ferror(f);
    if (f != stdin) fclose(f);
    if (!buf || bad) { free(buf); return NULL; }
    buf[n] = 0;
    if (len) *len = n;
    return buf;
}

cinfer_model *cli_load_model(const char *cmd, const char *dir, const char *device, int n_threads) {
    char err[1024];
    cinfer_load_opts o = {device, n_threads, 0};
    cinfer_model *m = NULL;
    cinfer_status st = cinfer_model_load(dir, &o, &m, err, sizeof err);
    if (st) {
        fprintf(stderr, "cinfer %s: %s\n", cmd, err);
        return NULL;
    }
    return m;
}

int cli_size(const char *v, size_t *out) {
    char *end;
    errno = 0;
    double x = strtod(v, &end);
    if (end == v || errno || !(x > 0)) return 0;
    double mul = 1;
    switch (*end) {
    case 'k': case 'K': mul = 1024.0; end++; break;
    case 'm': case 'M': mul = 1024.0 * 1024; end++; break;
    case 'g': case 'G': mul = 1024.0 * 1024 * 1024; end++; break;
    case 't': case 'T': mul = 1024.0 * 1024 * 1024 * 1024; end++; break;
    default: break;
    }
    if (mul > 1 && *end == 'i') end++;
    if (*end == 'B' || *end == 'b') end++;
    if (*end || x * mul > 1e15 || x * mul < 1) return 0;
    *out = (size_t)(x * mul);
    return 1;
}

int cli_kv_flag(const char *cmd, int code, const char *v, cinfer_ctx_opts *co) {
    switch (code) {
    case KV_MEMORY:
        if (cli_size(v, &co->kv_memory)) return 1;
        fprintf(stderr, "cinfer %s: bad value for --kv-memory: '%s' (a size such as 4G, 512M or a byte count)\n", cmd, v);
        return -1;
    case KV_DTYPE:
        if (!strcmp(v, "f32") || !strcmp(v, "f16") || !strcmp(v, "bf16")) { co->kv_dtype = v; return 1; }
        fprintf(stderr, "cinfer %s: bad value for --kv-dtype: '%s' (f32, f16 or bf16)\n", cmd, v);
        return -1;
    case KV_MAX_SIZE: return cli_int(cmd, "--max-kv-size", v, 2, 1 << 30, &co->max_kv_size) ? 1 : -1;
    case KV_PREFILL: return cli_int(cmd, "--prefill-step-size", v, 1, 1 << 30, &co->prefill_step_size) ? 1 : -1;
    case KV_PAGE:
        if (cli_int(cmd, "--kv-page", v, 1, 65536, &co->kv_page) && !(co->kv_page & (co->kv_page - 1))) return 1;
        fprintf(stderr, "cinfer %s: bad value for --kv-page: '%s' (a power of two up to 65536)\n", cmd, v);
        return -1;
    default: return 0;
    }
}
