/*
 * serve-util.c — small helpers shared by the server's files (and compiled
 * into tests/test-serve-parse.c with the request parser).
 */
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include "serve.h"

double srv_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

size_t srv_tail_prefix(const char *h, size_t n, const char *s) {
    size_t t = strlen(s);
    for (size_t k = n < t - 1 ? n : t - 1; t && k > 0; k--)
        if (!memcmp(h + n - k, s, k)) return k;
    return 0;
}

int srv_buf_put(char **buf, size_t *len, size_t *cap, const char *s, size_t n) {
    if (*len + n + 1 > *cap) {
        size_t nc = (*len + n + 1) * 2;
        char *nb = realloc(*buf, nc);
        if (!nb) return 0;
        *buf = nb;
        *cap = nc;
    }
    memcpy(*buf + *len, s, n);
    *len += n;
    (*buf)[*len] = 0;
    return 1;
}
