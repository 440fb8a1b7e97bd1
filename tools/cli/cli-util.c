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
