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
#include "io/npy.h"

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

/* DIR/FILE as float32 [n][V], NULL (and a # line) when absent or of another shape */
static inline float *golden_read_npy(const char *dir, const char *file, int n, int V) {
    char path[512], err[256] = "";
    snprintf(path, sizeof path, "%s/%s", dir, file);
    float *ref = NULL;
    int nd = 0;
    int64_t sh[4];
    if (npy_read_f32(path, &ref, &nd, sh, err, sizeof err) || nd != 2 || sh[0] != n || sh[1] != V) {
        printf("# %s: %s\n", path, err[0] ? err : "unexpected shape");
        free(ref);
        return NULL;
    }
    return ref;
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

/* logits [n][V] of ids through a fresh context made with opts o, NULL on failure; prefill_f32: with
 * f32 activations everywhere (prefill_act "f32", the definition the golden files hold: on a CPU with
 * AVX-512 BF16 the default rounds a quantized model's prefill activations to bf16), where the backend
 * has that setting (CUDA has its own precision and refuses it) */
static inline float *golden_eval_opts(cinfer_model *m, const cinfer_ctx_opts *o, int prefill_f32, const int32_t *ids,
                                      int n, int V) {
    cinfer_ctx *c = NULL;
    char err[256];
    float *lg = malloc(sizeof(float) * n * V);
    cinfer_ctx_opts f = o ? *o : (cinfer_ctx_opts){0};
    f.prefill_act = "f32";
    if (prefill_f32 && lg && cinfer_ctx_new(m, &f, &c, err, sizeof err)) c = NULL;
    if (!lg || (!c && cinfer_ctx_new(m, o, &c, err, sizeof err)) || cinfer_eval(c, ids, n, 1, lg)) {
        printf("# eval: %s\n", c ? cinfer_ctx_error(c) : err);
        free(lg);
        lg = NULL;
    }
    cinfer_ctx_free(c);
    return lg;
}
static inline float *golden_eval_all(cinfer_model *m, const int32_t *ids, int n, int V) {
    return golden_eval_opts(m, NULL, 1, ids, n, V);
}
/* ids scored as row 0 of a right-padded batch of 2 rows (row 1 = the first
 * n-3 tokens): the largest error of each row against `full`, the logits of
 * the sequence alone. Returns 0 when the forward fails. */
static inline int golden_padded_err(cinfer_model *m, const int32_t *ids, int n, int V, const float *full,
                                    double *e0, double *e1) {
    int L = n, l1 = n > 3 ? n - 3 : 1;
    int32_t *batch = calloc((size_t)2 * L, sizeof *batch);
    int *rows = malloc(sizeof(int) * 2 * (n + l1));
    float *lg = malloc(sizeof(float) * (size_t)(n + l1) * V);
    int lens[2] = {n, l1}, pos0[2] = {0, 0}, k = 0;
    cinfer_ctx *c = NULL;
    char err[256];
    int ok = batch && rows && lg;
    for (int i = 0; ok && i < L; i++) batch[i] = ids[i];
    for (int i = 0; ok && i < l1; i++) batch[L + i] = ids[i];
    for (int i = 0; ok && i < n; i++) { rows[2 * k] = 0; rows[2 * k + 1] = i; k++; }
    for (int i = 0; ok && i < l1; i++) { rows[2 * k] = 1; rows[2 * k + 1] = i; k++; }
    ok = ok && !cinfer_ctx_new(m, NULL, &c, err, sizeof err) && !cinfer_forward(c, batch, 2, L, lens, pos0, rows, k, lg);
    *e0 = ok ? golden_rel_err(lg, full, (size_t)n * V) : 1;
    *e1 = ok ? golden_rel_err(lg + (size_t)n * V, full, (size_t)l1 * V) : 1;
    cinfer_ctx_free(c);
    free(lg);
    free(rows);
    free(batch);
    return ok;
}
/* ids fed one token at a time through c (its cache), each step's logits against full[i][V];
 * *worst = the largest golden_rel_err; 1 when every step evaluated */
static inline int golden_decode_err(cinfer_ctx *c, const int32_t *ids, int n, int V, const float *full, double *worst) {
    float *one = malloc(sizeof(float) * V);
    int ok = c && one;
    *worst = 0;
    for (int i = 0; ok && i < n; i++) {
        ok = !cinfer_eval(c, ids + i, 1, 0, one);
        double e = golden_rel_err(one, full + (size_t)i * V, V);
        if (!(e <= *worst)) *worst = e;
    }
    free(one);
    return ok;
}

#endif
