/*
 * test-state.c — reuse of the cache through the public API: cinfer_ctx_trim
 * then a multi-token tail, batches of rows that start at different positions
 * (pos0), the NULL defaults of cinfer_forward (pos0: continue each row, lens:
 * all L, out_rows: each row's last position), trim on a batch, and
 * cinfer_ctx_cache_bytes against the bytes the cached tokens need.
 *
 * Model: tests/fixtures/models/llama-long-f32 (300 tokens, head_dim 64), so
 * the reused prefixes are long (GEMM attention). Every logit is checked two
 * ways: against a fresh prefill of the same tokens through cinfer (<= 1e-5
 * of the logit range; the reuse must change nothing but rounding) and, for
 * the fixture's own sequence, against transformers' logits.npy (<= 5e-6 of
 * range, test-model.c's bar).
 */
#include <jansson.h>
#include "check.h"
#include "golden.h"
#include "cinfer.h"
#include "io/npy.h"

#define DIR "tests/fixtures/models/llama-long-f32"
#define REUSE_TOL 1e-5   /* vs a fresh prefill (the bar); achieved <= 1.7e-6 */
#define HF_TOL 5e-6      /* vs transformers, as test-model.c; achieved <= 2.0e-6 */

static int V;
static const float *full, *full2, *hf;   /* [n][V]: ids fresh, ids2 fresh, transformers for ids */
static double range_of(const float *x, size_t n) {
    float lo = x[0], hi = x[0];
    for (size_t i = 0; i < n; i++) { lo = x[i] < lo ? x[i] : lo; hi = x[i] > hi ? x[i] : hi; }
    return hi - lo;
}

/* max |got - want| over n logit rows / the range of the whole reference `all` [N][V] */
static double err_rows(const float *got, const float *want, int n, const float *all, int N) {
    double mx = 0;
    for (size_t i = 0; i < (size_t)n * V; i++) {
        double d = fabs((double)got[i] - want[i]);
        if (!(d <= mx)) mx = d;
    }
    return mx / range_of(all, (size_t)N * V);
}

static cinfer_ctx *ctx_new(cinfer_model *m, int kv_f16) {
    cinfer_ctx *c = NULL;
    cinfer_ctx_opts o = {.kv_f16 = kv_f16};
    char err[256];
    if (cinfer_ctx_new(m, &o, &c, err, sizeof err)) printf("# ctx: %s\n", err);
    return c;
}

/* prefill k, trim to t, feed the tail [s, e) with s = min(t, k): its logits == the fresh prefill's */
static void trim_then_tail(cinfer_model *m, const int32_t *ids, int n, int k, int t, int e) {
    cinfer_ctx *c = ctx_new(m, 0);
    int s = t < k ? t : k;
    float *lg = malloc(sizeof(float) * (size_t)(e - s) * V);
    int ok = c && lg && !cinfer_eval(c, ids, k, 0, NULL);
    int pos_k = c ? cinfer_ctx_pos(c) : -1;
    if (ok) cinfer_ctx_trim(c, t);
    int pos_t = c ? cinfer_ctx_pos(c) : -1;
    ok = ok && !cinfer_eval(c, ids + s, e - s, 1, lg);
    double ef = ok ? err_rows(lg, full + (size_t)s * V, e - s, full, n) : 1;
    double eh = ok ? err_rows(lg, hf + (size_t)s * V, e - s, hf, n) : 1;
    CHECK(ok && pos_k == k && pos_t == s && cinfer_ctx_pos(c) == e && ef <= REUSE_TOL && eh <= HF_TOL,
          "prefill %d, trim(%d), feed %d tokens: pos %d -> %d -> %d; logits vs fresh prefill %.1e, vs transformers %.1e",
          k, t, e - s, pos_k, pos_t, c ? cinfer_ctx_pos(c) : -1, ef, eh);
    free(lg);
    cinfer_ctx_free(c);
}

static void test_trim(cinfer_model *m, const int32_t *ids, int n) {
    trim_then_tail(m, ids, n, 200, 150, 200);   /* a tail of 50 over a reused prefix of 150 */
    trim_then_tail(m, ids, n, 120, 119, 300);   /* drop one token, feed 181 */
    trim_then_tail(m, ids, n, 64, 0, 40);       /* trim to 0 = a fresh start */
    trim_then_tail(m, ids, n, 100, 100, 130);   /* trim to the cached length: no change */
    trim_then_tail(m, ids, n, 100, 500, 130);   /* trim past the cached length: no change */
}

/* two rows (different sequences) with different prefixes, then tails at pos0 = their lengths,
 * then NULL pos0/lens/out_rows, then trim on the batch */
static void test_batch(cinfer_model *m, const int32_t *ids, const int32_t *ids2, int n) {
    cinfer_ctx *c = ctx_new(m, 0);
    int L = 100, k0 = 100, k1 = 37;
    int32_t *b = calloc((size_t)2 * 300, sizeof *b);
    float *lg = malloc(sizeof(float) * 64 * V);
    int lens[2] = {k0, k1}, pos0[2] = {0, 0}, ok = c && b && lg;
    for (int i = 0; i < L; i++) { b[i] = ids[i]; b[L + i] = i < k1 ? ids2[i] : 0; }
    ok = ok && !cinfer_forward(c, b, 2, L, lens, pos0, NULL, 0, NULL);
    CHECK(ok, "B=2 prefill of %d and %d tokens (right-padded)", k0, k1);
    /* tails of 20 and 13 at pos0 = 100 and 37; every position's logits */
    int l0 = 20, l1 = 13, pairs[2 * 33], np = 0;
    L = 20;
    for (int i = 0; i < L; i++) { b[i] = ids[k0 + i]; b[L + i] = i < l1 ? ids2[k1 + i] : 0; }
    for (int i = 0; i < l0; i++) { pairs[2 * np] = 0; pairs[2 * np + 1] = i; np++; }
    for (int i = 0; i < l1; i++) { pairs[2 * np] = 1; pairs[2 * np + 1] = i; np++; }
    int lens2[2] = {l0, l1}, pos2[2] = {k0, k1};
    ok = ok && !cinfer_forward(c, b, 2, L, lens2, pos2, pairs, np, lg);
    double e0 = ok ? err_rows(lg, full + (size_t)k0 * V, l0, full, n) : 1;
    double e1 = ok ? err_rows(lg + (size_t)l0 * V, full2 + (size_t)k1 * V, l1, full2, n) : 1;
    double eh = ok ? err_rows(lg, hf + (size_t)k0 * V, l0, hf, n) : 1;
    CHECK(ok && e0 <= REUSE_TOL && e1 <= REUSE_TOL && eh <= HF_TOL,
          "B=2 tails at pos0 %d and %d: each row == its fresh prefill (%.1e, %.1e), row 0 vs transformers %.1e", k0, k1, e0, e1, eh);
    /* NULL pos0 (continue from 120 and 50), NULL lens (all 5), NULL out_rows (last position) */
    L = 5;
    for (int i = 0; i < L; i++) { b[i] = ids[120 + i]; b[L + i] = ids2[50 + i]; }
    ok = ok && !cinfer_forward(c, b, 2, L, NULL, NULL, NULL, 0, lg);
    e0 = ok ? err_rows(lg, full + (size_t)124 * V, 1, full, n) : 1;
    e1 = ok ? err_rows(lg + V, full2 + (size_t)54 * V, 1, full2, n) : 1;
    CHECK(ok && e0 <= REUSE_TOL && e1 <= REUSE_TOL,
          "B=2 with pos0, lens and out_rows NULL: rows continue at 120 and 50, logits of each last position (%.1e, %.1e)", e0, e1);
    /* trim the batch to 40: both rows restart at 40 */
    cinfer_ctx_trim(c, 40);
    int pos_after = cinfer_ctx_pos(c);
    L = 10;
    for (int i = 0; i < L; i++) { b[i] = ids[40 + i]; b[L + i] = ids2[40 + i]; }
    ok = ok && !cinfer_forward(c, b, 2, L, NULL, NULL, NULL, 0, lg);
    e0 = ok ? err_rows(lg, full + (size_t)49 * V, 1, full, n) : 1;
    e1 = ok ? err_rows(lg + V, full2 + (size_t)49 * V, 1, full2, n) : 1;
    CHECK(ok && pos_after == 40 && e0 <= REUSE_TOL && e1 <= REUSE_TOL,
          "trim(40) on a batch of rows at 125 and 55: both continue at 40 (pos %d; %.1e, %.1e)", pos_after, e0, e1);
    free(lg);
    free(b);
    cinfer_ctx_free(c);
}

/* the cache holds at least K and V of every cached token: 2 x layers x kv heads x head_dim x tokens x
 * element size, from config.json (f32: 4 bytes, f16: 2) */
static void test_cache_bytes(cinfer_model *m, const int32_t *ids, int n) {
    json_t *cfg = json_load_file(DIR "/config.json", 0, NULL);
    size_t per_tok = 2 * (size_t)json_integer_value(json_object_get(cfg, "num_hidden_layers")) *
                     (size_t)json_integer_value(json_object_get(cfg, "num_key_value_heads")) *
                     (size_t)json_integer_value(json_object_get(cfg, "head_dim"));
    json_decref(cfg);
    for (int f16 = 0; f16 < 2; f16++) {
        cinfer_ctx *c = ctx_new(m, f16);
        size_t el = f16 ? 2 : 4, b0 = c ? cinfer_ctx_cache_bytes(c) : 0;
        int ok = c && !cinfer_eval(c, ids, n, 0, NULL);
        size_t b1 = ok ? cinfer_ctx_cache_bytes(c) : 0;
        CHECK(ok && per_tok > 0 && b1 >= per_tok * el * n && b1 > b0,
              "cache bytes, %s KV: %zu after %d tokens >= %zu needed (%zu before)", f16 ? "f16" : "f32", b1, n, per_tok * el * n, b0);
        cinfer_ctx_free(c);
    }
}

int main(void) {
    json_t *ref = json_load_file(DIR "/reference.json", 0, NULL);
    cinfer_model *m = golden_load(DIR, NULL, 1);
    int32_t ids[512], ids2[512];
    int n = ref ? golden_ids(json_object_get(ref, "tokens"), ids, 512) : 0;
    float *h = NULL;
    int nd = 0;
    int64_t sh[4];
    char err[256];
    int ok = m && n == 300 && !npy_read_f32(DIR "/logits.npy", &h, &nd, sh, err, sizeof err) && nd == 2 && sh[0] == n;
    CHECK(ok, "llama-long-f32: model, 300 tokens and logits.npy load");
    if (ok) {
        cinfer_model_info info;
        cinfer_model_get_info(m, &info);
        V = info.n_vocab;
        for (int i = 0; i < n; i++) ids2[i] = ids[n - 1 - i];   /* a second sequence: the first reversed */
        hf = h;
        full = golden_eval_all(m, ids, n, V);
        full2 = golden_eval_all(m, ids2, n, V);
        ok = full && full2 && sh[1] == V;
        CHECK(ok && err_rows(full, hf, n, hf, n) <= HF_TOL, "fresh prefill of 300 tokens == transformers (%.1e)",
              ok ? err_rows(full, hf, n, hf, n) : 1.0);
        if (ok) {
            test_trim(m, ids, n);
            test_batch(m, ids, ids2, n);
            test_cache_bytes(m, ids, n);
        }
        free((void *)full);
        free((void *)full2);
    }
    free(h);
    cinfer_model_free(m);
    json_decref(ref);
    return CHECK_DONE();
}
