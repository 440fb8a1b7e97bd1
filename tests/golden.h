/*
 * golden.h — helpers shared by the tests that compare logits with the
 * transformers fixtures in tests/fixtures/models (test-model.c on the CPU,
 * tests/gpu/test-cuda-model.c on CUDA): loading, token lists from
 * reference.json, whole-sequence evaluation, and the error measure
 * max |a - b| / range(b) that the bars of issues 2 and 5 are stated in.
 */
#ifndef CINFER_GOLDEN_H
#define CINFER_GOLDEN_H
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include "cinfer.h"

/* dev NULL = cpu; no_tok skips tokenizer files */
static inline cinfer_model *golden_load(const char *dir, const char *dev, int no_tok) {
    char err[1024];
    cinfer_load_opts o = {0};
    o.device = dev;
    o.no_tokenizer = no_tok;
    cinfer_model *m = NULL;
    if (cinfer_model_load(dir, &o, &m, err, sizeof err)) printf("# load %s on %s: %s\n", dir, dev ? dev : "cpu", err);
    return m;
}

static inline int golden_ids(json_t *a, int32_t *out, int cap) {
    int n = 0;
    size_t i;
    json_t *v;
    json_array_foreach(a, i, v) if (n < cap) out[n++] = (int32_t)json_integer_value(v);
    return n;
}

/* max |a-b| over n / range of b; NaN -> infinity */
static inline double golden_rel_err(const float *a, const float *b, size_t n) {
    float lo = b[0], hi = b[0];
    double mx = 0;
    for (size_t i = 0; i < n; i++) {
        lo = b[i] < lo ? b[i] : lo;
        hi = b[i] > hi ? b[i] : hi;
        double d = fabs((double)a[i] - b[i]);
        if (!(d <= mx)) mx = d;
    }
    return mx != mx ? INFINITY : mx / (hi - lo);
}

/* logits [n][V] of ids through a fresh context, NULL on failure */
static inline float *golden_eval_all(cinfer_model *m, const int32_t *ids, int n, int V) {
    cinfer_ctx *c = NULL;
    char err[256];
    float *lg = malloc(sizeof(float) * n * V);
    if (!lg || cinfer_ctx_new(m, NULL, &c, err, sizeof err) || cinfer_eval(c, ids, n, 1, lg)) {
        printf("# eval: %s\n", c ? cinfer_ctx_error(c) : err);
        free(lg);
        lg = NULL;
    }
    cinfer_ctx_free(c);
    return lg;
}
#endif
