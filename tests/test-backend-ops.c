/*
 * test-backend-ops.c — every op of a backend's table against its scalar
 * reference (cpu/ref.c or an inline definition) on fresh random inputs,
 * through the be_ops table, in the spirit of llama.cpp's test-backend-ops:
 * one harness for every backend — the CPU in CI (make test), CUDA on the GPU
 * machine (CINFER_TEST_DEVICE=cuda, tests/gpu/run.sh). Optional ops a
 * backend's table lacks are reported as such, not tested.
 * Each output buffer is poisoned with NaN and framed by guard words before
 * the op: every output element must be written (NaN fails the comparison)
 * and no guard may change (nothing outside the output is written). Also:
 * decode-step graphs (capture, replay with new host arguments, fall back on a
 * changed op sequence) give the eager results. The cache ops (kv_write,
 * rope_kv_write, attention) run over random paged layouts: scattered page
 * ids, several sequences, windows with sink tokens and a run, f32/f16/bf16
 * pools, pages of 1 to 256 slots, against be_ref_* on the same pages. Errors
 * are reported once and cleared (issue 10 item 9, CUDA). Bars: f32 sums
 * 2e-5 of the largest reference value everywhere; CUDA's 16-bit batched
 * matmuls (activations rounded for cuBLAS) and flash prefill (f16 tensor
 * cores) have their own, stated at each check.
 */
#include <stdint.h>
#include "check.h"
#include "paged.h"
#include "backend/backend.h"
#include "backend/cpu/cpu.h"
#include "quant/affine.h"
#ifdef CINFER_CUDA
#include "backend/cuda/cuda-api.h"
#endif

#define GUARD 64                 /* guard floats on each side */
/* matmuls of one row take the GEMV on f32 activations (exact to f32 rounding); more rows go to
 * cuBLAS, 16-bit weights with activations rounded to the weight dtype (gemm.cu) */
#define POISON 0x7fa5a5a5u       /* a NaN */

static const be_ops *be;
static be_ctx *bc;
static uint64_t rng = 88172645463325252ull;

static float frand(void) {   /* uniform [-1, 1) */
    rng ^= rng << 13; rng ^= rng >> 7; rng ^= rng << 17;
    return (float)((rng >> 40) * (1.0 / 8388608.0) - 1.0);
}
static int irand(int n) { return paged_rand(&rng, n); }

/* a device buffer of n floats framed by guards, every word poisoned */
typedef struct gbuf { float *base, *p; size_t n; } gbuf;

static gbuf gb_new(size_t n) {
    gbuf g = {0};
    size_t tot = n + 2 * GUARD;
    g.base = be->alloc(bc, tot * sizeof(float));
    g.p = g.base + GUARD;
    g.n = n;
    uint32_t *h = malloc(tot * 4);
    for (size_t i = 0; i < tot; i++) h[i] = POISON;
    be->from_host(bc, g.base, h, tot * 4);
    free(h);
    return g;
}
/* uploads host floats into the payload */
static void gb_put(gbuf *g, const float *h) { be->from_host(bc, g->p, h, g->n * sizeof(float)); }
/* downloads the payload; returns 1 when both guards are intact */
static int gb_get(gbuf *g, float *h) {
    size_t tot = g->n + 2 * GUARD;
    uint32_t *all = malloc(tot * 4);
    be->to_host(bc, all, g->base, tot * 4);
    int ok = 1;
    for (size_t i = 0; i < GUARD; i++) ok &= all[i] == POISON && all[GUARD + g->n + i] == POISON;
    memcpy(h, all + GUARD, g->n * 4);
    free(all);
    return ok;
}
static void gb_free(gbuf *g) { be->free(bc, g->base); }

/* max |a-b| / max |b|; NaN anywhere -> infinity */
static double relerr(const float *a, const float *b, size_t n) {
    double mx = 0, sc = 0;
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)a[i] - b[i]);
        if (!(d == d) || a[i] != a[i]) return INFINITY;
        if (d > mx) mx = d;
        if (fabs(b[i]) > sc) sc = fabs(b[i]);
    }
    return mx / (sc > 0 ? sc : 1);
}

static float *rnd(size_t n, float s) {
    float *p = malloc(n * sizeof(float));
    for (size_t i = 0; i < n; i++) p[i] = frand() * s;
    return p;
}

/* a host weight matrix in dtype dt, uploaded */
static be_mat mk_mat(be_dtype dt, int64_t rows, int64_t cols, float s) {
    be_mat m = {0};
    size_t n = (size_t)rows * cols;
    void *d = malloc(n * be_dtype_size(dt));
    for (size_t i = 0; i < n; i++) {
        float v = frand() * s;
        if (dt == BE_F32) ((float *)d)[i] = v;
        else if (dt == BE_F16) ((uint16_t *)d)[i] = be_f32_to_f16(v);
        else ((uint16_t *)d)[i] = be_f32_to_bf16(v);
    }
    m.data = d;
    m.dt = dt;
    m.rows = rows;
    m.cols = cols;
    if (be->mat_prepare(bc, &m)) printf("# mat_prepare failed\n");
    return m;
}
static void free_mat(be_mat *m) { be->mat_release(bc, m); free((void *)m->data); }

static int on_cuda;   /* the backend under test is CUDA (its own bars for rounded activations) */

/* CUDA runs matmuls of more than one row on 16-bit weights through cuBLAS with the activations
 * rounded to the weights' type: the reference rounds them the same way (rounded_x), so one bar
 * holds everywhere — f32 sums of exactly the same products, 2e-5 of the largest value (achieved
 * on the H200 at 10:17 UTC 2026-12-01: <= 3.9e-6, tests/gpu/last-run/backend-ops-cuda.log; a reference on unrounded activations would need 3e-3 for f16, 2e-2 for bf16) */
static double mm_tol(int n, int dt) {
    (void)n;
    (void)dt;
    return 2e-5;
}

/* the activations a matmul of n rows on dt weights multiplies: x itself, or on CUDA (n > 1,
 * 16-bit weights) x rounded to dt; malloc'd copy, free with free() */
static float *rounded_x(const float *x, int n, int64_t k, int dt) {
    float *r = malloc(sizeof(float) * (size_t)n * k);
    for (size_t i = 0; i < (size_t)n * k; i++) {
        float v = x[i];
        if (on_cuda && n > 1 && dt != BE_F32) be_kv_put(&v, (be_dtype)dt, 0, x[i]), v = be_kv_get(&v, (be_dtype)dt, 0);
        r[i] = v;
    }
    return r;
}

static void ref_mm(const float *x, int n, const be_mat *w, const be_mat *bias, float *y) {
    float *xr = rounded_x(x, n, w->cols, w->dt);
    be_ref_matmul(xr, n, w, bias, y);
    free(xr);
}

/* an optional op the backend's table lacks: said, not tested */
static int have(const void *op, const char *name) {
    if (!op) printf("# %s: not in the %s table\n", name, be->name);
    return op != NULL;
}

static void test_matmul(void) {
    const int ns[] = {1, 2, 3, 5, 8, 9, 33, 64, 65};
    /* {48, 256} and {1040, 2048}: tile-aligned shapes (rows % 16, k % 256), as the models' are;
     * {3000, 3000}: more row groups than the persistent grid */
    const int shapes[][2] = {{37, 64}, {64, 200}, {300, 1024}, {130, 36}, {48, 256}, {1000, 4096}, {3000, 3000}, {1040, 2048}};
    for (int dt = 0; dt < 3; dt++)
        for (size_t si = 0; si < sizeof shapes / sizeof *shapes - (on_cuda ? 0 : 3); si++)   /* the big three: CUDA's grids */
            for (size_t ni = 0; ni < sizeof ns / sizeof *ns; ni++) {
                int n = ns[ni], m = shapes[si][0], k = shapes[si][1];
                int with_bias = (si + ni) % 3 == 0;
                be_mat w = mk_mat((be_dtype)dt, m, k, 1.0f), b = {0};
                if (with_bias) b = mk_mat(BE_BF16, 1, m, 1.0f);
                float *x = rnd((size_t)n * k, 1.0f), *ref = malloc(sizeof(float) * n * m), *got = malloc(sizeof(float) * n * m);
                gbuf gx = gb_new((size_t)n * k), gy = gb_new((size_t)n * m);
                gb_put(&gx, x);
                be->matmul(bc, gx.p, n, &w, with_bias ? &b : NULL, gy.p);
                int guards = gb_get(&gy, got);
                ref_mm(x, n, &w, with_bias ? &b : NULL, ref);
                double e = relerr(got, ref, (size_t)n * m);
                /* n > 8 on 16-bit weights runs cuBLAS on activations rounded to the weight dtype */
                double tol = mm_tol(n, dt);
                CHECK(guards && e <= tol, "matmul %s n=%d m=%d k=%d%s: err %.2e (tol %.0e), guards %s", be_dtype_name((be_dtype)dt), n, m,
                      k, with_bias ? " +bias" : "", e, tol, guards ? "intact" : "WRITTEN");
                gb_free(&gx); gb_free(&gy);
                free(x); free(ref); free(got);
                free_mat(&w);
                if (with_bias) free_mat(&b);
            }
}

/* MLX affine weights (bits 2-8, groups 32/64/128, f32/f16/bf16 scales): the GEMV rows (f32 activations) against
 * be_ref_matmul; on CUDA more than AFF_CHUNKED_N (32) rows dequantize the matrix (s*q + b rounded to bf16, f16 with f16
 * scales) for cuBLAS on activations rounded the same way, and the reference multiplies those rounded values; the
 * residual add (matmul_add); embedding rows equal aq_dequant_row bit for bit */
static be_mat mk_affine(int bits, int group, be_dtype sdt, int64_t rows, int64_t cols) {
    be_mat m = {0};
    size_t rb = aq_row_bytes(cols, bits), ng = (size_t)(cols / group), ss = be_dtype_size(sdt);
    uint8_t *codes = malloc(rb * (size_t)rows);
    char *sc = malloc(ng * ss * (size_t)rows), *bi = malloc(ng * ss * (size_t)rows);
    float *row = malloc(sizeof(float) * (size_t)cols);
    for (int64_t r = 0; r < rows; r++) {
        for (int64_t i = 0; i < cols; i++) row[i] = frand();
        aq_quantize_row(row, cols, bits, group, AQ_ROUND_GPU, sdt, codes + (size_t)r * rb, sc + (size_t)r * ng * ss, bi + (size_t)r * ng * ss);
    }
    free(row);
    be_dtype_affine(bits, &m.dt);
    m.data = codes;
    m.rows = rows;
    m.cols = cols;
    m.scales = sc;
    m.biases = bi;
    m.sdt = sdt;
    m.group = group;
    if (be->mat_prepare(bc, &m)) printf("# mat_prepare failed\n");
    return m;
}
static void free_affine(be_mat *m) {
    be->mat_release(bc, m);
    free((void *)m->data); free((void *)m->scales); free((void *)m->biases);
}
/* y[n][rows] (+ y when add) as the backend computes it for affine w: see above */
static void ref_affine(const float *x, int n, const be_mat *w, float *y, int add) {
    float *yr = malloc(sizeof(float) * (size_t)n * w->rows);
    if (on_cuda && n > 32) {   /* the dequantized matrix and x, each rounded to the 16-bit type */
        be_dtype dt = w->sdt == BE_F16 ? BE_F16 : BE_BF16;
        int64_t k = w->cols, ng = k / w->group;
        size_t rb = aq_row_bytes(k, be_traits(w->dt)->bits), ss = be_dtype_size(w->sdt);
        uint16_t *d = malloc(sizeof(uint16_t) * (size_t)w->rows * k);
        float *row = malloc(sizeof(float) * (size_t)k);
        for (int64_t r = 0; r < w->rows; r++) {
            aq_dequant_row((const uint8_t *)w->data + r * rb, (const char *)w->scales + r * ng * ss, (const char *)w->biases + r * ng * ss,
                           w->sdt, be_traits(w->dt)->bits, w->group, 0, k, row);
            for (int64_t i = 0; i < k; i++) be_kv_put(d, dt, (size_t)(r * k + i), row[i]);
        }
        be_mat dm = {.data = d, .dt = dt, .rows = w->rows, .cols = k};
        float *xr = rounded_x(x, n, k, dt);
        be_ref_matmul(xr, n, &dm, NULL, yr);
        free(xr); free(row); free(d);
    } else {
        be_ref_matmul(x, n, w, NULL, yr);
    }
    for (size_t i = 0; i < (size_t)n * w->rows; i++) y[i] = add ? y[i] + yr[i] : yr[i];
    free(yr);
}
static void test_matmul_affine(void) {
    static const int bitsv[] = {2, 3, 4, 5, 6, 8}, groups[] = {32, 64, 128}, ns[] = {1, 3, 8, 9, 40};
    static const be_dtype sdts[] = {BE_BF16, BE_F16, BE_F32};
    int cases = 0, fails = 0, efails = 0, afails = 0;
    double worst = 0;
    for (int bi = 0; bi < 6; bi++)
        for (int gi = 0; gi < 3; gi++) {
            be_dtype sdt = sdts[(bi + gi) % 3];
            int64_t m = (bi + gi) % 2 ? 37 : 300, k = groups[gi] * (gi == 2 ? 3 : 4);
            be_mat w = mk_affine(bitsv[bi], groups[gi], sdt, m, k);
            for (size_t ni = 0; ni < sizeof ns / sizeof *ns; ni++) {
                int n = ns[ni];
                float *x = rnd((size_t)n * k, 1.0f), *ref = malloc(sizeof(float) * n * m), *got = malloc(sizeof(float) * n * m);
                gbuf gx = gb_new((size_t)n * k), gy = gb_new((size_t)n * m);
                gb_put(&gx, x);
                be->matmul(bc, gx.p, n, &w, NULL, gy.p);
                int guards = gb_get(&gy, got);
                ref_affine(x, n, &w, ref, 0);
                double e = relerr(got, ref, (size_t)n * m);
                if (!(e <= worst)) worst = e;
                cases++;
                if (!(guards && e <= 2e-5)) {
                    fails++;
                    printf("# affine matmul q%d g%d %s n=%d m=%d k=%d: err %.2e, guards %s\n", bitsv[bi], groups[gi], be_dtype_name(sdt), n, (int)m,
                           (int)k, e, guards ? "intact" : "WRITTEN");
                }
                if (be->matmul_add && (ni == 1 || ni == 4)) {   /* y += x . w^T (the residual add) */
                    float *y0 = rnd((size_t)n * m, 1.0f);
                    gbuf gt = gb_new((size_t)n * m);
                    gb_put(&gy, y0);
                    be->matmul_add(bc, gx.p, n, &w, NULL, gy.p, gt.p);
                    guards = gb_get(&gy, got);
                    ref_affine(x, n, &w, y0, 1);
                    e = relerr(got, y0, (size_t)n * m);
                    if (!(guards && e <= 2e-5)) {
                        afails++;
                        printf("# affine matmul_add q%d g%d n=%d: err %.2e, guards %s\n", bitsv[bi], groups[gi], n, e, guards ? "intact" : "WRITTEN");
                    }
                    gb_free(&gt);
                    free(y0);
                }
                gb_free(&gx); gb_free(&gy);
                free(x); free(ref); free(got);
            }
            {   /* embedding rows: s*q + b in f32, exactly */
                int32_t ids[5] = {0, (int32_t)m - 1, 3, 3, (int32_t)m / 2};
                gbuf go = gb_new((size_t)5 * k);
                float *got = malloc(sizeof(float) * 5 * k), *want = malloc(sizeof(float) * k);
                be->embed(bc, &w, ids, 5, go.p);
                int ok = gb_get(&go, got);
                size_t rb = aq_row_bytes(k, bitsv[bi]), ss = be_dtype_size(sdt), ng = (size_t)(k / groups[gi]);
                for (int t = 0; t < 5; t++) {
                    aq_dequant_row((const uint8_t *)w.data + ids[t] * rb, (const char *)w.scales + ids[t] * ng * ss,
                                   (const char *)w.biases + ids[t] * ng * ss, sdt, bitsv[bi], groups[gi], 0, k, want);
                    ok &= !memcmp(got + (size_t)t * k, want, sizeof(float) * k);
                }
                efails += !ok;
                gb_free(&go);
                free(got); free(want);
            }
            free_affine(&w);
        }
    CHECK(fails == 0, "affine matmul (bits 2-8 x groups 32/64/128, f32/f16/bf16 scales, n=1..40): %d/%d within 2e-5 of the "
          "reference (worst %.2e), guards intact", cases - fails, cases, worst);
    CHECK(afails == 0, "affine matmul_add: y + x . w^T within 2e-5, every bit width and group");
    CHECK(efails == 0, "affine embedding rows equal aq_dequant_row bit for bit (18 matrices)");
    /* one token's 4-bit rows in number enough that each block of a persistent grid takes many tiles (CUDA: the
     * tensor-core GEMV's scale windows cycle), k whose steps of 128 codes split unevenly over a block's warps */
    static const struct { int group, k; be_dtype sdt; } big[] = {{64, 5632, BE_BF16}, {128, 1536, BE_F32}, {32, 2944, BE_F16}};
    int bfails = 0;
    for (int i = 0; i < 3; i++) {
        int64_t m = 9000, k = big[i].k;
        be_mat w = mk_affine(4, big[i].group, big[i].sdt, m, k);
        float *x = rnd((size_t)k, 1.0f), *ref = malloc(sizeof(float) * m), *got = malloc(sizeof(float) * m);
        gbuf gx = gb_new((size_t)k), gy = gb_new((size_t)m);
        gb_put(&gx, x);
        be->matmul(bc, gx.p, 1, &w, NULL, gy.p);
        int guards = gb_get(&gy, got);
        ref_affine(x, 1, &w, ref, 0);
        double e = relerr(got, ref, (size_t)m);
        if (!(guards && e <= 2e-5)) {
            bfails++;
            printf("# affine matmul q4 g%d %s n=1 m=%d k=%d: err %.2e, guards %s\n", big[i].group, be_dtype_name(big[i].sdt), (int)m, (int)k, e,
                   guards ? "intact" : "WRITTEN");
        }
        gb_free(&gx); gb_free(&gy);
        free(x); free(ref); free(got);
        free_affine(&w);
    }
    CHECK(bfails == 0, "affine matmul q4, one token, 9000 rows (k 5632 g64 bf16, 1536 g128 f32, 2944 g32 f16): within 2e-5");
}

/* the outputs of a multi-matrix op against their references: with glu, ref[0] becomes act(ref[0]) * ref[1] and
 * y[1] is scratch (not compared); returns the largest error, clears *guards when a guard was written; frees
 * ref[i] and the device buffers gy[i] */
static double cmp_outputs(gbuf *gy, float **ref, const int *ms, int count, int n, int glu, int *guards) {
    double worst = 0;
    if (glu) be_ref_glu(ref[0], ref[1], ref[0], (size_t)n * ms[0], glu);
    for (int i = 0; i < count; i++) {
        float *got = malloc(sizeof(float) * n * ms[i]);
        *guards &= gb_get(&gy[i], got);
        double e = glu && i == 1 ? 0 : relerr(got, ref[i], (size_t)n * ms[i]);
        if (!(e <= worst)) worst = e;
        free(got); free(ref[i]);
        gb_free(&gy[i]);
    }
    return worst;
}

/* affine weights in the fused decode ops: rmsnorm + q/k/v (one with a bias), rmsnorm + gate/up + SwiGLU,
 * matmul_multi and the residual add (matmul_add), as one launch on CUDA for 4 and 8 bits (the norm in the prologue
 * while n*k fits, else after a separate rmsnorm; more tokens than fit its shared memory in several launches), one
 * matrix at a time for other widths; against the reference norm, ref_affine and the GLU */
static void test_affine_fused(void) {
    int has_norm = have((const void *)be->norm_matmul, "norm_matmul"), has_multi = have((const void *)be->matmul_multi, "matmul_multi");
    static const struct { int bits, group; be_dtype sdt; } cfg[] = {{4, 64, BE_BF16}, {8, 32, BE_F16}, {4, 128, BE_F32}, {3, 64, BE_BF16},
                                                                     {8, 128, BE_BF16}, {8, 64, BE_F16}, {4, 128, BE_BF16}};
    static const int ns[] = {1, 3, 5, 8, 12};
    for (size_t ci = 0; ci < sizeof cfg / sizeof *cfg; ci++)
        for (size_t ni = 0; ni < sizeof ns / sizeof *ns; ni++)
            for (int v = 0; v < 4; v++) {   /* 0: norm + 3 matrices, 1: norm + gate/up + SwiGLU, 2: matmul_multi, 3: matmul_add */
                if (v == 2 ? !has_multi : v == 3 ? !be->matmul_add : !has_norm) continue;
                static const int ks[] = {512, 1536, 2048};
                int n = ns[ni], k = ks[(ci + ni + v) % 3], glu = v == 1 ? BE_ACT_SILU : 0, count = v == 1 ? 2 : v == 3 ? 1 : 3;
                int ms[3] = {300, v == 1 ? 300 : 64, 72};
                be_mat w[3], bias = mk_mat(BE_F32, 1, ms[1], 1.0f), nw = mk_mat(BE_BF16, 1, k, 0.5f);
                const be_mat *wp[3], *bp[3];
                gbuf gy[3];
                float *y[3], *ref[3];
                float *x = rnd((size_t)n * k, 3.0f), *xn = malloc(sizeof(float) * n * k);
                gbuf gx = gb_new((size_t)n * k), gxn = gb_new((size_t)n * k);
                gb_put(&gx, x);
                for (int i = 0; i < count; i++) {
                    w[i] = mk_affine(cfg[ci].bits, cfg[ci].group, cfg[ci].sdt, ms[i], k);
                    wp[i] = &w[i];
                    bp[i] = i == 1 && !glu ? &bias : NULL;
                    gy[i] = gb_new((size_t)n * ms[i]);
                    y[i] = gy[i].p;
                }
                float *y0 = rnd((size_t)n * ms[0], 1.0f);   /* matmul_add: y0 + x . w^T */
                gbuf gt = gb_new((size_t)n * ms[0]);
                if (v == 3) gb_put(&gy[0], y0);
                if (v == 2) be->matmul_multi(bc, gx.p, n, count, wp, bp, y);
                else if (v == 3) be->matmul_add(bc, gx.p, n, &w[0], NULL, y[0], gt.p);
                else be->norm_matmul(bc, gx.p, n, &nw, 1.0f, 1e-5f, gxn.p, count, wp, bp, y, glu);
                if (v >= 2) memcpy(xn, x, sizeof(float) * n * k);
                else be_ref_rmsnorm(x, n, k, &nw, 1.0f, 1e-5f, xn);
                for (int i = 0; i < count; i++) {
                    ref[i] = malloc(sizeof(float) * n * ms[i]);
                    if (v == 3) memcpy(ref[i], y0, sizeof(float) * n * ms[i]);
                    ref_affine(xn, n, &w[i], ref[i], v == 3);
                    if (bp[i])
                        for (int t = 0; t < n; t++)
                            for (int r = 0; r < ms[i]; r++) ref[i][(size_t)t * ms[i] + r] += ((const float *)bias.data)[r];
                }
                int guards = 1;
                double worst = cmp_outputs(gy, ref, ms, count, n, glu, &guards);
                for (int i = 0; i < count; i++) free_affine(&w[i]);
                CHECK(guards && worst <= 2e-5, "affine q%d g%d %s n=%d k=%d %s: err %.2e (tol 2e-05), guards %s", cfg[ci].bits, cfg[ci].group,
                      be_dtype_name(cfg[ci].sdt), n, k,
                      v == 3 ? "matmul_add" : v == 2 ? "matmul_multi (3 matrices, one with bias)" : glu ? "norm + gate/up + SwiGLU" : "norm + 3 matrices, one with bias",
                      worst, guards ? "intact" : "WRITTEN");
                gb_free(&gt);
                free(y0);
                gb_free(&gx); gb_free(&gxn);
                free_mat(&bias); free_mat(&nw);
                free(x); free(xn);
            }
}

/* q/k/v-style: one input, three matrices, one launch (decode) or three cuBLAS calls */
static void test_matmul_multi(void) {
    if (!have((const void *)be->matmul_multi, "matmul_multi")) return;
    const int ns[] = {1, 3, 9, 40};
    for (int dt = 0; dt < 3; dt++)
        for (size_t ni = 0; ni < 2 * sizeof ns / sizeof *ns; ni++) {   /* the second half: rows % 16 */
            int sk = ni >= sizeof ns / sizeof *ns, n = ns[ni % (sizeof ns / sizeof *ns)], k = 512, ms[3] = {sk ? 304 : 300, 64, sk ? 80 : 72};
            be_mat w[3], b[3];
            const be_mat *wp[3], *bp[3];
            float *y[3];
            gbuf gy[3];
            float *x = rnd((size_t)n * k, 1.0f);
            gbuf gx = gb_new((size_t)n * k);
            gb_put(&gx, x);
            for (int i = 0; i < 3; i++) {
                w[i] = mk_mat((be_dtype)dt, ms[i], k, 1.0f);
                wp[i] = &w[i];
                bp[i] = NULL;
                if (i == 1) { b[i] = mk_mat(BE_F32, 1, ms[i], 1.0f); bp[i] = &b[i]; }
                gy[i] = gb_new((size_t)n * ms[i]);
                y[i] = gy[i].p;
            }
            be->matmul_multi(bc, gx.p, n, 3, wp, bp, y);
            double worst = 0;
            int guards = 1;
            for (int i = 0; i < 3; i++) {
                float *got = malloc(sizeof(float) * n * ms[i]), *ref = malloc(sizeof(float) * n * ms[i]);
                guards &= gb_get(&gy[i], got);
                ref_mm(x, n, &w[i], bp[i], ref);
                double e = relerr(got, ref, (size_t)n * ms[i]);
                if (!(e <= worst)) worst = e;
                free(got); free(ref);
                gb_free(&gy[i]);
                free_mat(&w[i]);
                if (bp[i]) free_mat(&b[i]);
            }
            double tol = mm_tol(n, dt);
            CHECK(guards && worst <= tol, "matmul_multi %s n=%d m0=%d (3 matrices, one with bias): err %.2e (tol %.0e), guards %s",
                  be_dtype_name((be_dtype)dt), n, ms[0], worst, tol, guards ? "intact" : "WRITTEN");
            gb_free(&gx);
            free(x);
        }
}

/* rmsnorm then q/k/v-style matmuls, or gate/up with the SwiGLU, in one op (decode: the norm
 * in the GEMV's prologue, one launch; prefill: norm, cuBLAS, swiglu); and y += x . w^T */
static const int NM_NS[] = {1, 3, 9, 24};

static void test_norm_matmul(void) {
    if (!have((const void *)be->norm_matmul, "norm_matmul")) return;
    const int *ns = NM_NS;
    for (int dt = 0; dt < 3; dt++)
        for (size_t ni = 0; ni < sizeof NM_NS / sizeof *NM_NS; ni++)
            for (int v = 0; v < 2 * (BE_ACT_GELU_TANH + 1); v++) {   /* v >= BE_ACT_GELU_TANH + 1: k % 256 and rows % 16 */
                int glu = v % (BE_ACT_GELU_TANH + 1), sk = v > BE_ACT_GELU_TANH, n = ns[ni], k = sk ? 1536 : 1544, count = glu ? 2 : 3;
                int ms[3] = {1200, glu ? 1200 : 64, sk ? 80 : 72};   /* more row groups than the grid */
                be_mat w[3], bias = mk_mat(BE_F32, 1, ms[1], 1.0f), nw = mk_mat(BE_BF16, 1, k, 0.5f);
                const be_mat *wp[3], *bp[3];
                gbuf gy[3];
                float *y[3];
                float *x = rnd((size_t)n * k, 3.0f), *xn = malloc(sizeof(float) * n * k);
                gbuf gx = gb_new((size_t)n * k), gxn = gb_new((size_t)n * k);
                gb_put(&gx, x);
                for (int i = 0; i < count; i++) {
                    w[i] = mk_mat((be_dtype)dt, ms[i], k, 1.0f);
                    wp[i] = &w[i];
                    bp[i] = i == 1 ? &bias : NULL;
                    gy[i] = gb_new((size_t)n * ms[i]);
                    y[i] = gy[i].p;
                }
                be->norm_matmul(bc, gx.p, n, &nw, 1.0f, 1e-5f, gxn.p, count, wp, bp, y, glu);
                float *tmp = malloc(sizeof(float) * n * k);
                int guards = gb_get(&gxn, tmp);   /* xn is scratch: guards only... */
                be_ref_rmsnorm(x, n, k, &nw, 1.0f, 1e-5f, xn);
                /* ...except where CUDA rounds the normed activations to 16 bits for the matmul: an
                 * f32-rounding difference in xn can flip one rounding there (a 16-bit ulp of one input),
                 * so the reference multiplies the device's xn, which is first checked against its own */
                if (on_cuda && n > 1 && dt != BE_F32) {
                    double ex = relerr(tmp, xn, (size_t)n * k);
                    CHECK(ex <= 1e-6, "norm_matmul %s n=%d k=%d: the normed activations, err %.2e (tol 1e-06)", be_dtype_name((be_dtype)dt),
                          n, k, ex);
                    memcpy(xn, tmp, sizeof(float) * n * k);
                }
                float *ref[3];
                for (int i = 0; i < count; i++) {
                    ref[i] = malloc(sizeof(float) * n * ms[i]);
                    ref_mm(xn, n, &w[i], bp[i], ref[i]);
                }
                double worst = cmp_outputs(gy, ref, ms, count, n, glu, &guards);
                for (int i = 0; i < count; i++) free_mat(&w[i]);
                double tol = mm_tol(n, dt);
                CHECK(guards && worst <= tol, "norm_matmul %s n=%d k=%d %s: err %.2e (tol %.0e), guards %s", be_dtype_name((be_dtype)dt), n, k,
                      glu == BE_ACT_GELU_TANH ? "gate/up + GeGLU (tanh)" : glu ? "gate/up + SwiGLU" : "3 matrices, one with bias", worst, tol,
                      guards ? "intact" : "WRITTEN");
                gb_free(&gx); gb_free(&gxn);
                free_mat(&bias); free_mat(&nw);
                free(x); free(xn); free(tmp);
            }
}

static void test_matmul_add(void) {
    if (!have((const void *)be->matmul_add, "matmul_add")) return;
    const int *ns = NM_NS;
    for (int dt = 0; dt < 3; dt++)
        for (size_t ni = 0; ni < 2 * sizeof NM_NS / sizeof *NM_NS; ni++) {   /* the second half: k % 256, rows % 16 */
            int sk = ni >= sizeof NM_NS / sizeof *NM_NS, n = ns[ni % (sizeof NM_NS / sizeof *NM_NS)], k = sk ? 512 : 384, m = sk ? 208 : 200;
            be_mat w = mk_mat((be_dtype)dt, m, k, 1.0f), bias = mk_mat(BE_F32, 1, m, 1.0f);
            float *x = rnd((size_t)n * k, 1.0f), *y0 = rnd((size_t)n * m, 1.0f), *ref = malloc(sizeof(float) * n * m);
            float *got = malloc(sizeof(float) * n * m);
            gbuf gx = gb_new((size_t)n * k), gy = gb_new((size_t)n * m), gt = gb_new((size_t)n * m);
            gb_put(&gx, x);
            gb_put(&gy, y0);
            be->matmul_add(bc, gx.p, n, &w, &bias, gy.p, gt.p);
            int guards = gb_get(&gy, got);
            guards &= gb_get(&gt, ref);   /* scratch: guards only */
            ref_mm(x, n, &w, &bias, ref);
            for (size_t i = 0; i < (size_t)n * m; i++) ref[i] += y0[i];
            double e = relerr(got, ref, (size_t)n * m), tol = mm_tol(n, dt);
            CHECK(guards && e <= tol, "matmul_add %s n=%d m=%d k=%d: err %.2e (tol %.0e), guards %s", be_dtype_name((be_dtype)dt), n, m, k,
                  e, tol, guards ? "intact" : "WRITTEN");
            gb_free(&gx); gb_free(&gy); gb_free(&gt);
            free_mat(&w); free_mat(&bias);
            free(x); free(y0); free(ref); free(got);
        }
}

static void test_rmsnorm(void) {
    const int dims[] = {16, 64, 300, 1001, 2048, 5000, 16384};
    for (size_t di = 0; di < sizeof dims / sizeof *dims; di++)
        for (int wk = 0; wk < 3; wk++)
            for (int inplace = 0; inplace < 2; inplace++) {
                int dim = dims[di], n = 7;
                be_mat w = {0};
                if (wk) w = mk_mat(wk == 1 ? BE_F32 : BE_BF16, 1, dim, 1.0f);
                float wadd = wk == 2 ? 1.0f : 0.0f;
                float *x = rnd((size_t)n * dim, 3.0f), *ref = malloc(sizeof(float) * n * dim), *got = malloc(sizeof(float) * n * dim);
                gbuf gx = gb_new((size_t)n * dim), gy = inplace ? gx : gb_new((size_t)n * dim);
                gb_put(&gx, x);
                be->rmsnorm(bc, gx.p, n, dim, wk ? &w : NULL, wadd, 1e-5f, gy.p);
                int guards = gb_get(&gy, got);
                be_ref_rmsnorm(x, n, dim, wk ? &w : NULL, wadd, 1e-5f, ref);
                double e = relerr(got, ref, (size_t)n * dim);
                CHECK(guards && e <= 1e-5, "rmsnorm dim=%d weight=%s%s: err %.2e, guards %s", dim, wk == 0 ? "none" : wk == 1 ? "f32" : "bf16+1",
                      inplace ? " in place" : "", e, guards ? "intact" : "WRITTEN");
                gb_free(&gx);
                if (!inplace) gb_free(&gy);
                free(x); free(ref); free(got);
                if (wk) free_mat(&w);
            }
}

static void test_rope(void) {
    const int hds[] = {8, 16, 64, 128};
    for (size_t hi = 0; hi < sizeof hds / sizeof *hds; hi++)
        for (int partial = 0; partial < 2; partial++)
            for (int neox = 0; neox < 2; neox++) {
                int hd = hds[hi], rot = partial ? hd / 2 : hd, n = 9, heads = 3;
                float *x = rnd((size_t)n * heads * hd, 2.0f), *ref = malloc(sizeof(float) * n * heads * hd), *got = malloc(sizeof(float) * n * heads * hd);
                float *inv = malloc(sizeof(float) * (rot / 2));
                for (int i = 0; i < rot / 2; i++) inv[i] = 1.0f / powf(10000.0f, (float)(2 * i) / (float)rot);
                int pos[9];
                for (int i = 0; i < n; i++) pos[i] = irand(2048);
                memcpy(ref, x, sizeof(float) * n * heads * hd);
                gbuf gx = gb_new((size_t)n * heads * hd);
                gb_put(&gx, x);
                be->rope(bc, gx.p, n, heads, hd, rot, pos, inv, neox);
                int guards = gb_get(&gx, got);
                be_ref_rope(ref, n, heads, hd, rot, pos, inv, neox);
                double e = relerr(got, ref, (size_t)n * heads * hd);
                CHECK(guards && e <= 2e-4, "rope hd=%d rot=%d %s: err %.2e, guards %s", hd, rot, neox ? "neox" : "interleaved", e,
                      guards ? "intact" : "WRITTEN");
                gb_free(&gx);
                free(x); free(ref); free(got); free(inv);
            }
}

static void test_argmax(void);

static void test_elementwise(void) {
    size_t n = 1000003;
    float *g = rnd(n, 6.0f), *u = rnd(n, 2.0f), *ref = malloc(sizeof(float) * n), *got = malloc(sizeof(float) * n);
    gbuf gg = gb_new(n), gu = gb_new(n), go = gb_new(n);
    gb_put(&gg, g);
    gb_put(&gu, u);
    int guards;
    double e;
    for (int act = BE_ACT_SILU; act <= BE_ACT_GELU_TANH; act++) {
        be->glu(bc, gg.p, gu.p, go.p, n, act);
        guards = gb_get(&go, got);
        be_ref_glu(g, u, ref, n, act);
        e = relerr(got, ref, n);
        CHECK(guards && e <= 1e-6, "glu act %d n=%zu: err %.2e, guards %s", act, n, e, guards ? "intact" : "WRITTEN");
    }
    for (size_t i = 0; i < n; i++) ref[i] = g[i] * 12.0f;   /* logits around the cap: tanh's whole range */
    gb_put(&go, ref);
    be->softcap(bc, go.p, n, 30.0f);
    guards = gb_get(&go, got);
    be_ref_softcap(ref, n, 30.0f);
    e = relerr(got, ref, n);
    CHECK(guards && e <= 1e-6, "softcap n=%zu: err %.2e, guards %s", n, e, guards ? "intact" : "WRITTEN");
    gb_put(&go, g);
    be->scale(bc, go.p, n, 50.596443f);
    guards = gb_get(&go, got);
    for (size_t i = 0; i < n; i++) ref[i] = g[i] * 50.596443f;
    e = relerr(got, ref, n);
    CHECK(guards && e == 0, "scale n=%zu: err %.2e, guards %s", n, e, guards ? "intact" : "WRITTEN");
    be->add(bc, gg.p, gu.p, n);
    guards = gb_get(&gg, got);
    for (size_t i = 0; i < n; i++) ref[i] = g[i] + u[i];
    e = relerr(got, ref, n);
    CHECK(guards && e == 0, "add n=%zu: err %.2e, guards %s", n, e, guards ? "intact" : "WRITTEN");
    gb_free(&gg); gb_free(&gu); gb_free(&go);
    free(g); free(u); free(ref); free(got);

    /* gather */
    int dim = 77, rows_n = 5, src_n = 40, rows[5] = {3, 39, 0, 3, 17};
    float *x = rnd((size_t)src_n * dim, 1.0f), *gy = malloc(sizeof(float) * rows_n * dim);
    gbuf gx = gb_new((size_t)src_n * dim), gyb = gb_new((size_t)rows_n * dim);
    gb_put(&gx, x);
    be->gather(bc, gx.p, dim, rows, rows_n, gyb.p);
    guards = gb_get(&gyb, gy);
    int same = 1;
    for (int i = 0; i < rows_n; i++) same &= !memcmp(gy + i * dim, x + rows[i] * dim, sizeof(float) * dim);
    CHECK(guards && same, "gather: rows copied exactly, guards %s", guards ? "intact" : "WRITTEN");
    gb_free(&gx); gb_free(&gyb);
    free(x); free(gy);

    /* embed, every dtype */
    for (int dt = 0; dt < 3; dt++) {
        be_mat tab = mk_mat((be_dtype)dt, 300, 40, 1.0f);
        int32_t ids[6] = {0, 299, 5, 5, 123, 7};
        float *out = malloc(sizeof(float) * 6 * 40);
        gbuf go2 = gb_new(6 * 40);
        be->embed(bc, &tab, ids, 6, go2.p);
        guards = gb_get(&go2, out);
        same = 1;
        for (int i = 0; i < 6; i++)
            for (int c = 0; c < 40; c++) same &= out[i * 40 + c] == be_mat_get(&tab, ids[i], c);
        CHECK(guards && same, "embed %s: rows exact, guards %s", be_dtype_name((be_dtype)dt), guards ? "intact" : "WRITTEN");
        gb_free(&go2);
        free(out);
        free_mat(&tab);
    }

    /* argmax, with ties and -inf */
    if (have((const void *)be->argmax, "argmax")) test_argmax();
}

/* argmax, with ties and -inf */
static void test_argmax(void) {
    int R = 4, V = 128256;
    float *lg = rnd((size_t)R * V, 10.0f);
    lg[0 * V + 77] = 50.0f; lg[0 * V + 99] = 50.0f;                 /* tie: first wins */
    for (int i = 0; i < V; i++) lg[1 * V + i] = -INFINITY;          /* all -inf: index 0 */
    lg[2 * V + V - 1] = 100.0f;
    gbuf gl = gb_new((size_t)R * V);
    gb_put(&gl, lg);
    int32_t am[4];
    be->argmax(bc, gl.p, R, V, am);
    int ok = am[0] == 77 && am[1] == 0 && am[2] == V - 1;
    int b3 = 0;
    for (int i = 1; i < V; i++) if (lg[3 * V + i] > lg[3 * V + b3]) b3 = i;
    ok &= am[3] == b3;
    CHECK(ok, "argmax: ties pick the first, all -inf gives 0, random row matches (%d %d %d %d)", am[0], am[1], am[2], am[3]);
    gb_free(&gl);
    free(lg);
    if (!be->step_begin) return;
    /* inside decode-step brackets (a device backend issues it with the step's graph, its rows written at step_end):
     * new rows every step, 4 rows (captured, then replayed) and 300 rows (more than one copy of keys brings back) */
    const int RS[2] = {4, 300}, VS = 5000;
    for (int t = 0; t < 2; t++) {
        int n = RS[t], bad = 0;
        float *h = malloc(sizeof(float) * (size_t)n * VS);
        int32_t *got = malloc(sizeof(int32_t) * (size_t)n);
        gbuf g = gb_new((size_t)n * VS);
        for (int step = 0; step < 4; step++) {
            for (size_t i = 0; i < (size_t)n * VS; i++) h[i] = 10.0f * frand();
            gb_put(&g, h);
            for (int i = 0; i < n; i++) got[i] = -1;
            be->step_begin(bc);
            be->argmax(bc, g.p, n, VS, got);
            be->step_end(bc);
            for (int i = 0; i < n; i++) {
                int b = 0;
                for (int j = 1; j < VS; j++) if (h[(size_t)i * VS + j] > h[(size_t)i * VS + b]) b = j;
                bad += got[i] != b;
            }
        }
        CHECK(!bad, "argmax in step brackets, %d rows x 4 steps: %d rows differ from the host's argmax", n, bad);
        gb_free(&g);
        free(h);
        free(got);
    }
    if (!be->argmax_take || be->argmax_take(bc, NULL)) return;
    /* chained steps: each step's argmax kept on the device, the next step's embedding reading it as its token,
     * the results taken one step behind (steps issued without waiting; as a greedy decode runs them) */
    const int VC = 300, S = 6;
    be_mat tab = mk_mat(BE_F32, VC, 40, 1.0f);
    float *hs = malloc(sizeof(float) * (size_t)S * VC), *emb = malloc(sizeof(float) * 40);
    gbuf gs = gb_new((size_t)S * VC), ge = gb_new(40);
    int32_t want[6], took[6], one = 0;
    for (int st = 0; st < S; st++) {
        want[st] = 0;
        for (int j = 0; j < VC; j++) {
            hs[(size_t)st * VC + j] = frand();
            if (hs[(size_t)st * VC + j] > hs[(size_t)st * VC + want[st]]) want[st] = j;
        }
    }
    gb_put(&gs, hs);
    int nt = 0, emb_ok = 1;
    for (int st = 0; st < S; st++) {
        be->step_begin(bc);
        be->embed(bc, &tab, st ? NULL : &one, 1, ge.p);   /* step 0: a host token; then the step before's */
        be->argmax(bc, gs.p + (size_t)st * VC, 1, VC, NULL);
        be->step_end(bc);
        if (st && !be->argmax_take(bc, &took[nt])) nt++;   /* the step before's, while this one runs */
        if (st == S - 1 && !be->argmax_take(bc, &took[nt])) nt++;
        gb_get(&ge, emb);
        for (int cc = 0; cc < 40; cc++) emb_ok &= emb[cc] == be_mat_get(&tab, st ? want[st - 1] : one, cc);
    }
    int same = nt == S, extra = be->argmax_take(bc, &one) != 0;
    for (int i = 0; i < nt; i++) same &= took[i] == want[i];
    char msg[256] = "";
    int err = be->status(bc, msg, sizeof msg);
    CHECK(same && emb_ok && extra && !err, "argmax kept on the device over %d chained steps: %d taken, %s; embeddings of the kept tokens %s; "
          "nothing more to take %s (%s)", S, nt, same ? "each the step's argmax" : "DIFFERENT", emb_ok ? "exact" : "WRONG",
          extra ? "yes" : "NO", err ? msg : "no error");
    gb_free(&gs); gb_free(&ge);
    free(hs); free(emb);
    free_mat(&tab);
}

/* ---------------------------------------------------------- score */

/* |a - b| / |scale|, NaN -> infinity */
static double rel1(double a, double b, double scale) {
    double d = fabs(a - b);
    if (!(d == d)) return INFINITY;
    return d / (fabs(scale) > 0 ? fabs(scale) : 1);
}

/* a base file's records for base logits zb[n][V] (reference codes and header: scale, min) and each
 * row's lse */
static void base_records(const float *zb, int n, int V, const int32_t *tgt, unsigned char *rec, size_t rb, float *lseb) {
    for (int i = 0; i < n; i++) {
        be_score_row r;
        be_ref_score_row(zb + (size_t)i * V, V, tgt[i], NULL, 0, (uint16_t *)(void *)(rec + i * rb + 16), &r);
        memcpy(rec + i * rb, &r.code_scale, 4);
        memcpy(rec + i * rb + 4, &r.code_min, 4);
        lseb[i] = r.lse;
    }
}

/* be_ops.score against be_ref_score on identical logits: no base, a live base (logits + lse),
 * a file base (16-bit records), the row's own codes; vocabularies small, odd, Llama 2's and
 * Llama 3's; ties, a -inf entry, a row of one large logit. Bar: 1e-6 relative for lse, kld,
 * the code range; the target log-prob to 1e-6 of |lse| (it is z - lse: lse's rounding is its
 * error); argmax exact; codes within 1 (a code is an f32 rounding of (lp - min) / scale). */
static void test_score(void) {
    static const int VS[] = {512, 1001, 32000, 128256};
    for (int vi = 0; vi < 4; vi++) {
        int V = VS[vi], n = 9;
        size_t rb = 16 + 2 * (size_t)V + (V & 1 ? 2 : 0), nv = (size_t)n * V;
        float *z = rnd(nv, 8.0f), *zb = rnd(nv, 8.0f);
        for (size_t i = 0; i < nv; i++) zb[i] = 0.7f * z[i] + 0.3f * zb[i];   /* a base near the model */
        z[0 * V + 5] = z[0 * V + 9] = 40.0f;                      /* tie: the first wins */
        z[1 * V + 3] = -INFINITY;                                 /* outside the KL sum: every base row has -inf there */
        for (int i = 0; i < n; i++) zb[(size_t)i * V + 3] = -INFINITY;
        for (int i = 0; i < V; i++) z[2 * V + i] = i == V / 2 ? 60.0f : -2.0f;   /* a peaked row */
        int32_t tgt[9], idx[9];
        for (int i = 0; i < n; i++) { tgt[i] = irand(V); idx[i] = (i * 4) % n; }   /* base rows permuted */
        tgt[2] = V / 2;
        /* the base: its lse, and its records (reference codes + header) */
        be_score_row *ref = malloc(sizeof *ref * n), *got = malloc(sizeof *got * n);
        unsigned char *rec = calloc((size_t)n, rb);
        float *lseb = malloc(sizeof(float) * n);
        base_records(zb, n, V, tgt, rec, rb, lseb);
        gbuf gz = gb_new(nv), gzb = gb_new(nv), grec = gb_new((size_t)n * rb / 4), gcodes = gb_new((size_t)n * rb / 4);
        gb_put(&gz, z);
        gb_put(&gzb, zb);
        gb_put(&grec, (const float *)(const void *)rec);
        uint16_t *refc = calloc((size_t)n, rb), *gotc = malloc((size_t)n * rb);
        for (int kind = 0; kind < 3; kind++) {   /* no base + codes; live base; file base */
            be_score_base bh = {0}, bd = {0};
            if (kind == 1) { bh.z = zb; bd.z = gzb.p; bh.lse = bd.lse = lseb; }
            if (kind == 2) { bh.rec = rec; bd.rec = (const unsigned char *)grec.p; bh.rec_bytes = bd.rec_bytes = rb; }
            bh.idx = bd.idx = idx;
            be_ref_score(z, n, V, tgt, kind ? &bh : NULL, kind ? NULL : refc, rb / 2, ref);
            memset(got, 0xff, sizeof *got * n);
            be->score(bc, gz.p, n, V, tgt, kind ? &bd : NULL, kind ? NULL : (uint16_t *)(void *)gcodes.p, rb / 2, got);
            char msg[256] = "";
            int bad = be->status && be->status(bc, msg, sizeof msg);
            double e_lse = 0, e_lp = 0, e_kl = 0, e_code = 0;
            int am_ok = 1, cd = 0, cmax = 0;
            for (int i = 0; i < n; i++) {
                e_lse = fmax(e_lse, rel1(got[i].lse, ref[i].lse, ref[i].lse));
                e_lp = fmax(e_lp, rel1(got[i].lp, ref[i].lp, ref[i].lse));
                /* KL is a sum of log-prob differences: a shift of every log-prob (the lse's last bit) moves it by
                 * that shift, so its error is measured against |lse| like the target log-prob's */
                e_kl = fmax(e_kl, rel1(got[i].kld, ref[i].kld, ref[i].lse));
                e_code = fmax(e_code, fmax(rel1(got[i].code_scale, ref[i].code_scale, ref[i].code_scale),
                                           rel1(got[i].code_min, ref[i].code_min, ref[i].code_min)));
                am_ok &= got[i].argmax == ref[i].argmax;
            }
            if (!kind) {
                gb_get(&gcodes, (float *)(void *)gotc);
                for (int i = 0; i < n; i++)
                    for (int j = 0; j < V; j++) {
                        int d = abs((int)gotc[(size_t)i * rb / 2 + j] - (int)refc[(size_t)i * rb / 2 + j]);
                        cd += d != 0;
                        cmax = d > cmax ? d : cmax;
                    }
            }
            static const char *KN[3] = {"no base, codes", "live base", "file base"};
            CHECK(!bad && am_ok && e_lse <= 1e-6 && e_lp <= 1e-6 && e_kl <= 1e-6 && e_code <= 1e-6 && cmax <= 1,
                  "score V=%d %s: lse %.1e, lp %.1e, kld %.1e (both of |lse|), code range %.1e, argmax %s, codes: %d differ (max %d) %s",
                  V, KN[kind], e_lse, e_lp, e_kl, e_code, am_ok ? "equal" : "DIFFER", cd, cmax, msg);
            if (kind == 1) {
                CHECK(ref[0].argmax == 5 && ref[2].argmax == V / 2 && ref[1].kld > 0, "score V=%d: ties pick the first, the peaked row's max",
                      V);
            }
        }
        /* a model against itself: kld exactly 0 on both */
        be_score_base self = {.z = gz.p};
        float *lse_self = malloc(sizeof(float) * n);
        int32_t id0[9];
        for (int i = 0; i < n; i++) { id0[i] = i; lse_self[i] = got[i].lse; }
        self.lse = lse_self;
        self.idx = id0;
        be->score(bc, gz.p, n, V, tgt, &self, NULL, 0, got);
        double mx = 0;
        for (int i = 0; i < n; i++) mx = fmax(mx, fabs(got[i].kld));
        CHECK(mx < 1e-12, "score V=%d: a row against itself gives KL %.1e (f32 log-probs rounded alike)", V, mx);
        free(lse_self);
        gb_free(&gz); gb_free(&gzb); gb_free(&grec); gb_free(&gcodes);
        free(z); free(zb); free(ref); free(got); free(rec); free(lseb); free(refc); free(gotc);
    }
}

/* z[n][V] = x . w^T as the backend's matmul defines it on 16-bit weights for many rows: x rounded to
 * bf16, every product exact, summed in double here */
static float *head_logits(const float *x, int n, const be_mat *w) {
    int V = (int)w->rows, K = (int)w->cols;
    float *z = malloc(sizeof(float) * (size_t)n * V);
    for (int i = 0; i < n; i++)
        for (int v = 0; v < V; v++) {
            double a = 0;
            for (int k = 0; k < K; k++) a += (double)be_bf16_to_f32(be_f32_to_bf16(x[(size_t)i * K + k])) * be_mat_get(w, v, k);
            z[(size_t)i * V + v] = (float)a;
        }
    return z;
}

/* be_ops.score_head (backends that have it) against be_ref_score on the reference's logits of
 * the same head: no base, a file base (16-bit records), a base head (its own x and w), and a
 * model against itself. The device sums its products in f32 in its own order, so the bars are
 * those of the products (1e-5 of |lse| for lse, lp, kld) and argmax may differ only where the
 * reference's top two logits are within 1e-5; a row against itself gives exactly 0. */
static void test_score_head(void) {
    static const int SH[][3] = {{9, 1001, 64}, {130, 32000, 256}, {300, 517, 128}, {600, 4099, 192}};
    for (int si = 0; si < 4; si++) {
        int n = SH[si][0], V = SH[si][1], K = SH[si][2];
        be_mat w = mk_mat(BE_BF16, V, K, 0.5f), wb = mk_mat(BE_BF16, V, K, 0.5f);
        if (!be->score_head(bc, NULL, 0, &w, NULL, NULL, NULL)) {
            printf("# score_head: V=%d K=%d not taken\n", V, K);
            free_mat(&w); free_mat(&wb);
            continue;
        }
        float *x = rnd((size_t)n * K, 1.0f), *xb = rnd((size_t)n * K, 1.0f);
        for (size_t i = 0; i < (size_t)n * K; i++) xb[i] = 0.8f * x[i] + 0.2f * xb[i];
        float *z = head_logits(x, n, &w), *zb = head_logits(xb, n, &wb);
        size_t rb = 16 + 2 * (size_t)V + (V & 1 ? 2 : 0);
        int32_t *tgt = malloc(sizeof(int32_t) * n), *idx = malloc(sizeof(int32_t) * n), *id0 = malloc(sizeof(int32_t) * n);
        be_score_row *ref = malloc(sizeof *ref * n), *got = malloc(sizeof *got * n);
        unsigned char *rec = calloc((size_t)n, rb);
        float *lseb = malloc(sizeof(float) * n), *lse_self = malloc(sizeof(float) * n);
        int32_t *am_self = malloc(sizeof(int32_t) * n);
        for (int i = 0; i < n; i++) {
            tgt[i] = irand(V);
            idx[i] = (int32_t)(((size_t)i * 7) % n);   /* base rows permuted (n is not a multiple of 7) */
            id0[i] = i;
        }
        base_records(zb, n, V, tgt, rec, rb, lseb);
        gbuf gx = gb_new((size_t)n * K), gxb = gb_new((size_t)n * K), grec = gb_new((size_t)n * rb / 4);
        gb_put(&gx, x);
        gb_put(&gxb, xb);
        gb_put(&grec, (const float *)(const void *)rec);
        static const char *KN[4] = {"no base", "file base", "base head", "itself"};
        for (int kind = 0; kind < 4; kind++) {
            be_score_base bh = {0}, bd = {0};
            bh.idx = bd.idx = idx;
            if (kind == 1) { bh.rec = rec; bd.rec = (const unsigned char *)grec.p; bh.rec_bytes = bd.rec_bytes = rb; }
            if (kind == 2) { bh.z = zb; bh.lse = bd.lse = lseb; bd.x = gxb.p; bd.w = &wb; }
            if (kind == 3) { bh.z = z; bh.lse = bd.lse = lse_self; bd.x = gx.p; bd.w = &w; bh.idx = bd.idx = id0; }
            be_ref_score(z, n, V, tgt, kind ? &bh : NULL, NULL, 0, ref);
            memset(got, 0xff, sizeof *got * n);
            int taken = be->score_head(bc, gx.p, n, &w, tgt, kind ? &bd : NULL, got);
            char msg[256] = "";
            int bad = !taken || (be->status && be->status(bc, msg, sizeof msg));
            double e_lse = 0, e_lp = 0, e_kl = 0, kl_self = 0;
            int am_bad = 0;
            for (int i = 0; i < n; i++) {
                e_lse = fmax(e_lse, rel1(got[i].lse, ref[i].lse, ref[i].lse));
                e_lp = fmax(e_lp, rel1(got[i].lp, ref[i].lp, ref[i].lse));
                e_kl = fmax(e_kl, rel1(got[i].kld, ref[i].kld, ref[i].lse));
                kl_self = fmax(kl_self, fabs(got[i].kld));
                if (got[i].argmax != ref[i].argmax) {
                    const float *zi = z + (size_t)i * V;
                    int ga = got[i].argmax;
                    am_bad += ga < 0 || ga >= V || fabsf(zi[ga] - zi[ref[i].argmax]) > 1e-5f * fabsf(zi[ref[i].argmax]);
                }
            }
            if (kind == 0)
                for (int i = 0; i < n; i++) { lse_self[i] = got[i].lse; am_self[i] = got[i].argmax; }
            int am_moved = 0;   /* against itself: the same logits, so the same top token as without a base */
            for (int i = 0; kind == 3 && i < n; i++) am_moved += got[i].argmax != am_self[i];
            if (kind == 3)
                CHECK(!bad && kl_self == 0.0 && e_lse <= 1e-5 && !am_moved,
                      "score_head n=%d V=%d K=%d itself: KL %.1e (exactly 0), lse %.1e, %d top tokens not those of the model alone %s",
                      n, V, K, kl_self, e_lse, am_moved, msg);
            else
                CHECK(!bad && !am_bad && e_lse <= 1e-5 && e_lp <= 1e-5 && e_kl <= 1e-5,
                      "score_head n=%d V=%d K=%d %s: lse %.1e, lp %.1e, kld %.1e (of |lse|), argmax %d differ beyond a near tie %s", n, V,
                      K, KN[kind], e_lse, e_lp, e_kl, am_bad, msg);
        }
        gb_free(&gx); gb_free(&gxb); gb_free(&grec);
        free_mat(&w); free_mat(&wb);
        free(x); free(xb); free(z); free(zb); free(tgt); free(idx); free(id0); free(ref); free(got); free(rec);
        free(lseb); free(lse_self); free(am_self);
    }
}

/* ---------------------------------------------------------- paged KV */

static size_t words_of(size_t n, be_dtype dt) { return (n * be_dtype_size(dt) + 3) / 4; }

/* a host pool of n elements of dt, random in [-s, s) */
static void *pool_rand(size_t n, be_dtype dt, float s) {
    void *p = malloc(words_of(n, dt) * 4);
    for (size_t i = 0; i < n; i++) be_kv_put(p, dt, i, s * frand());
    return p;
}

/* host words all POISON */
static uint32_t *poisoned(size_t words) {
    uint32_t *h = malloc(words * 4);
    for (size_t i = 0; i < words; i++) h[i] = POISON;
    return h;
}

static const char *DTN[3] = {"f32", "f16", "bf16"};

/* kv_write into scattered pages: the pool equals be_ref_kv_write's bit for bit, poison and guards included */
static void test_kv_write(void) {
    for (int dt = 0; dt < 3; dt++)
        for (int page = 1; page <= 16; page *= 4) {
            int B = 3, L = 9, nkv = 3, hd = 64, pos0[3] = {0, 3, 17}, len[3] = {5, 2, 9}, run0[3] = {0, 0, 0};
            be_attn a = {.B = B, .L = L, .n_head = nkv, .n_kv_head = nkv, .head_dim = hd, .pos0 = pos0, .len = len, .run0 = run0};
            paged_layout ly;
            paged_new(&ly, &a, page, &rng, be, bc);
            size_t nsrc = (size_t)B * L * nkv * hd, words = words_of(paged_pool_elems(&a, &ly), dt);
            float *src = rnd(nsrc, 1.0f);
            uint32_t *ref = poisoned(words), *got = malloc(words * 4);
            be_ref_kv_write(&a, src, ref, dt);
            gbuf gs = gb_new(nsrc), gc = gb_new(words);
            gb_put(&gs, src);
            be->kv_write(bc, &a, gs.p, gc.p, dt);
            int guards = gb_get(&gc, (float *)got);
            CHECK(guards && !memcmp(got, ref, words * 4), "kv_write %s page %d: the pool equals the reference bit for bit (other slots poisoned), guards %s",
                  DTN[dt], page, guards ? "intact" : "WRITTEN");
            gb_free(&gs); gb_free(&gc);
            paged_free(&ly);
            free(src); free(ref); free(got);
        }
}

/* raw bits of element i of a pool */
static uint32_t bits(const void *p, be_dtype dt, size_t i) {
    return dt == BE_F32 ? ((const uint32_t *)p)[i] : ((const uint16_t *)p)[i];
}

/* the batch of the rope + write tests: 3 rows of 5 queries from positions 0, 3 and 30 (5, 2 and 4 of them real), H q
 * heads over nkv kv heads, rot dims rotated (inv: the frequencies, malloc'd); a points into rb */
typedef struct rope_batch { int pos0[3], len[3], run0[3], pos[15]; float *inv; be_attn a; } rope_batch;
static void rope_batch_new(rope_batch *rb, int H, int nkv, int hd, int rot, int neox) {
    *rb = (rope_batch){.pos0 = {0, 3, 30}, .len = {5, 2, 4}};
    rb->inv = malloc(sizeof(float) * (rot / 2));
    for (int i = 0; i < rot / 2; i++) rb->inv[i] = 1.0f / powf(10000.0f, (float)(2 * i) / (float)rot);
    for (int t = 0; t < 15; t++) rb->pos[t] = rb->pos0[t / 5] + t % 5;
    rb->a = (be_attn){.B = 3, .L = 5, .n_head = H, .n_kv_head = nkv, .head_dim = hd, .pos0 = rb->pos0, .len = rb->len, .run0 = rb->run0,
                      .pos = rb->pos, .inv_freq = rb->inv, .rot_dims = rot, .neox = neox};
}
/* the reference rope of the batch's rows of x (heads heads a token) */
static void rope_batch_ref(const rope_batch *rb, float *x, int heads) {
    be_ref_rope(x, rb->a.B * rb->a.L, heads, rb->a.head_dim, rb->a.rot_dims, rb->pos, rb->inv, rb->a.neox);
}

/* rope of q and k, then both written to the pages, in one op: q and k against the reference
 * rope, the pools against be_ref_kv_write of the reference results (slots it does not write
 * keep their poison) */
static void test_rope_kv_write(void) {
    if (!have((const void *)be->rope_kv_write, "rope_kv_write")) return;
    for (int dt = 0; dt < 3; dt++)
        for (int variant = 0; variant < 2; variant++) {
            int H = 6, nkv = 3, hd = 64, rot = variant ? hd / 2 : hd, neox = !variant, T = 15;
            rope_batch rb;
            rope_batch_new(&rb, H, nkv, hd, rot, neox);
            be_attn a = rb.a;
            paged_layout ly;
            paged_new(&ly, &a, variant ? 4 : 16, &rng, be, bc);
            size_t nq = (size_t)T * H * hd, nk = (size_t)T * nkv * hd, ne = paged_pool_elems(&a, &ly), words = words_of(ne, dt);
            float *q = rnd(nq, 1.0f), *k = rnd(nk, 1.0f), *v = rnd(nk, 1.0f);
            float *qr = malloc(nq * 4), *kr = malloc(nk * 4), *qg = malloc(nq * 4), *kg = malloc(nk * 4);
            memcpy(qr, q, nq * 4);
            memcpy(kr, k, nk * 4);
            rope_batch_ref(&rb, qr, H);
            rope_batch_ref(&rb, kr, nkv);
            uint32_t *kref = poisoned(words), *vref = poisoned(words), *kc = malloc(words * 4), *vc = malloc(words * 4);
            be_ref_kv_write(&a, kr, kref, dt);
            be_ref_kv_write(&a, v, vref, dt);
            float *ones = malloc(nk * 4), *mask = calloc(ne, 4);   /* mask[e] = 1: the reference writes element e */
            for (size_t i = 0; i < nk; i++) ones[i] = 1.0f;
            be_ref_kv_write(&a, ones, mask, BE_F32);
            gbuf gq = gb_new(nq), gk = gb_new(nk), gv = gb_new(nk), gkc = gb_new(words), gvc = gb_new(words);
            gb_put(&gq, q); gb_put(&gk, k); gb_put(&gv, v);
            be->rope_kv_write(bc, &a, gq.p, gk.p, gv.p, gkc.p, gvc.p, dt);
            int guards = gb_get(&gq, qg) & gb_get(&gk, kg) & gb_get(&gkc, (float *)kc) & gb_get(&gvc, (float *)vc);
            double eq = relerr(qg, qr, nq), ek = relerr(kg, kr, nk), ec = 0;
            int untouched = 1;
            for (size_t e = 0; e < ne; e++)
                for (int which = 0; which < 2; which++) {
                    const void *have = which ? vc : kc, *want = which ? vref : kref;
                    if (!mask[e]) { untouched &= bits(have, dt, e) == bits(want, dt, e); continue; }
                    double d = fabs((double)be_kv_get(have, dt, e) - be_kv_get(want, dt, e));
                    if (!(d <= ec)) ec = d;
                }
            double tc = dt == BE_F32 ? 2e-4 : dt == BE_F16 ? 2e-3 : 1.6e-2;   /* one rounding step of the pool dtype */
            CHECK(guards && untouched && eq <= 2e-4 && ek <= 2e-4 && ec <= tc,
                  "rope_kv_write %s rot=%d %s page %d: q err %.2e, k err %.2e, pool err %.2e (tol %.0e), other slots %s, guards %s",
                  DTN[dt], rot, neox ? "neox" : "interleaved", a.page, eq, ek, ec, tc, untouched ? "untouched" : "WRITTEN",
                  guards ? "intact" : "WRITTEN");
            gb_free(&gq); gb_free(&gk); gb_free(&gv); gb_free(&gkc); gb_free(&gvc);
            paged_free(&ly);
            free(q); free(k); free(v); free(qr); free(kr); free(qg); free(kg); free(kc); free(vc); free(rb.inv);
            free(kref); free(vref); free(ones); free(mask);
        }
}

#define ATT_BMAX 48
typedef struct att_case { int B, L, H, nkv, hd, page, window, keep, dt; int pos0[ATT_BMAX], len[ATT_BMAX], run0[ATT_BMAX]; float softcap; } att_case;

/* one attention case over a random paged layout against be_ref_attention; returns 1 on pass */
static int attention_case(const att_case *t) {
    be_attn a = {.B = t->B, .L = t->L, .n_head = t->H, .n_kv_head = t->nkv, .head_dim = t->hd, .pos0 = t->pos0, .len = t->len,
                 .window = t->window, .keep = t->keep, .run0 = t->run0, .scale = 1.0f / sqrtf((float)t->hd), .softcap = t->softcap};
    if (t->softcap > 0) a.scale *= 8.0f;   /* scores large enough that the cap bites */
    be_dtype dt = (be_dtype)t->dt;
    paged_layout ly;
    paged_new(&ly, &a, t->page, &rng, be, bc);
    size_t nq = (size_t)t->B * t->L * t->H * t->hd, ne = paged_pool_elems(&a, &ly), words = words_of(ne, dt);
    float *q = rnd(nq, 2.0f);
    void *kh = pool_rand(ne, dt, 2.0f), *vh = pool_rand(ne, dt, 1.0f);
    gbuf gq = gb_new(nq), gk = gb_new(words), gv = gb_new(words), go = gb_new(nq);
    gb_put(&gq, q);
    be->from_host(bc, gk.p, kh, ne * be_dtype_size(dt));
    be->from_host(bc, gv.p, vh, ne * be_dtype_size(dt));
    be->attention(bc, &a, gq.p, gk.p, gv.p, dt, go.p);
    float *got = malloc(nq * 4), *ref = malloc(nq * 4);
    int guards = gb_get(&go, got);
    be_ref_attention(&a, q, kh, vh, dt, ref);
    double e = relerr(got, ref, nq);
    int flash = (t->hd == 64 || t->hd == 128 || t->hd == 256) && t->L >= 16 && !(t->softcap > 0);
    int dec = !flash && dt != BE_F32 && (t->hd == 64 || t->hd == 128) && t->H / t->nkv <= 8 && !(t->softcap > 0);
    flash = flash && on_cuda;
    dec = dec && on_cuda;
    double tol = flash ? 6e-3 : 2e-5;   /* flash: q, k, p, v on the tensor cores in f16; else exact f32 sums */
    int ok = guards && e <= tol;
    CHECK(ok, "attention %s B=%d L=%d H=%d/%d hd=%d page=%d window=%d keep=%d run0=%d softcap=%g kv=%s span=%d: err %.2e (tol %.0e), guards %s",
          flash ? "flash" : dec ? "decode" : "split-K", t->B, t->L, t->H, t->nkv, t->hd, t->page, t->window, t->keep, t->run0[0],
          t->softcap, DTN[dt], a.max_span, e, tol, guards ? "intact" : "WRITTEN");
    gb_free(&gq); gb_free(&gk); gb_free(&gv); gb_free(&go);
    paged_free(&ly);
    free(q); free(kh); free(vh); free(got); free(ref);
    return ok;
}

static const att_case ATT_CASES[] = {
    /* B  L   H  kv  hd  page win keep dt  pos0             len          run0 */
    {2, 1, 8, 2, 128, 16, 0, 0, 0, {37, 300}, {1, 1}, {0}, 0},                 /* decode, split-K */
    {3, 1, 32, 8, 128, 128, 0, 0, 1, {200, 5, 1000}, {1, 1, 1}, {0}, 0},       /* decode kernel: llama-3-8b heads */
    {3, 1, 32, 8, 128, 16, 0, 0, 2, {200, 0, 700}, {1, 1, 1}, {0}, 0},         /* ... over bf16 pages */
    {2, 3, 16, 2, 128, 16, 0, 0, 2, {100, 250}, {3, 2}, {0}, 0},               /* g = 8, a padded query */
    {1, 1, 4, 4, 64, 8, 48, 0, 0, {200}, {1}, {0}, 0},                         /* sliding window (split-K) */
    {1, 1, 4, 4, 64, 16, 16, 0, 1, {200}, {1}, {0}, 0},                        /* hd 64, g = 1, window */
    {2, 1, 8, 2, 128, 32, 64, 4, 1, {300, 500}, {1, 1}, {250, 440}, 0},        /* ring: keep 4 sinks, run0 > keep */
    {2, 2, 8, 2, 64, 4, 40, 4, 0, {300, 90}, {2, 2}, {270, 60}, 0},            /* ... split-K, page 4 */
    {2, 2, 12, 4, 64, 32, 0, 0, 2, {0, 300}, {2, 1}, {0}, 0},                  /* g = 3 */
    {1, 1, 8, 2, 128, 16, 0, 0, 1, {15}, {1}, {0}, 0},                         /* fewer keys than a slice */
    {1, 1, 8, 2, 128, 256, 0, 0, 1, {4500}, {1}, {0}, 0},                      /* slices of several pieces */
    {2, 1, 32, 8, 128, 256, 0, 0, 2, {9000, 40}, {1, 1}, {0}, 0},               /* 64 slices of 3 pieces, pipelined */
    {2, 1, 8, 8, 64, 64, 1000, 4, 2, {4100, 3000}, {1, 1}, {3200, 2100}, 0},   /* ... with a window and sinks */
    {1, 1, 4, 2, 64, 128, 0, 0, 0, {5000}, {1}, {0}, 0},                       /* split-K beyond SPLIT_MAX keys */
    {2, 3, 8, 4, 8, 2, 0, 0, 1, {5, 0}, {3, 2}, {0}, 0},                       /* tiny head_dim, page 2 */
    {2, 20, 6, 3, 32, 8, 0, 0, 0, {0, 7}, {20, 11}, {0}, 0},                   /* split-K with many queries */
    {2, 70, 8, 2, 64, 16, 0, 0, 1, {0, 5}, {70, 33}, {0}, 0},                  /* prefill, flash */
    {2, 70, 8, 2, 128, 64, 0, 0, 2, {0, 100}, {70, 70}, {0}, 0},               /* ... bf16 pages */
    {1, 200, 4, 1, 128, 32, 48, 0, 0, {0}, {200}, {0}, 0},                     /* ... sliding window, f32 */
    {1, 40, 8, 2, 64, 16, 64, 4, 1, {300}, {40}, {250}, 0},                    /* ... sinks and a gap before the run */
    {1, 70, 8, 2, 128, 128, 100, 4, 1, {20}, {70}, {4}, 0},                    /* ... run0 == keep: one range */
    {1, 16, 4, 2, 64, 1, 0, 0, 1, {400}, {16}, {0}, 0},                        /* chunked prefill, page size 1 */
    /* Gemma 2's attention softcap (split-K on CUDA), Gemma's head_dim 256 */
    {2, 1, 8, 4, 256, 16, 16, 0, 2, {40, 9}, {1, 1}, {0}, 50.0f},           /* decode, sliding window */
    {2, 40, 8, 4, 128, 16, 16, 0, 0, {0, 30}, {40, 25}, {0}, 50.0f},        /* prefill, sliding window */
    {1, 70, 4, 2, 64, 32, 0, 0, 1, {0}, {70}, {0}, 30.0f},                  /* prefill, global */
    {1, 40, 8, 4, 256, 16, 24, 0, 1, {0}, {40}, {0}, 0},                       /* head_dim 256 (Gemma 3): split-K, f16 pages */
    {2, 70, 8, 4, 256, 128, 0, 0, 2, {0, 100}, {70, 70}, {0}, 0},              /* ... bf16 pages, two rows */
    {1, 80, 8, 4, 256, 32, 32, 0, 0, {20}, {80}, {0}, 0},                      /* ... f32 pages, window, chunked */
    {2, 1, 8, 4, 256, 16, 0, 0, 1, {90, 7}, {1, 1}, {0}, 0},                   /* ... decode: split-K */
};

/* many sequences decoding together, 48 rows of 1..900 keys: on CUDA the (query, kv head) blocks
 * alone fill the GPU, so one block serves each row and kv head (cu_attn_decode_fits), through
 * attn-many.cu's kernel (cu_attn_many_fits): llama-3-8b heads over f16 and bf16 pages; head_dim 64
 * with 8 q heads per kv head, a sliding window of 256 with 4 sinks (rows past the window hold a
 * ring's run) */
static void test_attention_many(void) {
    for (int v = 0; v < 3; v++) {
        att_case t = {ATT_BMAX, 1, 32, 8, 128, 16, 0, 0, v ? 2 : 1, {0}, {0}, {0}, 0};
        if (v == 2) { t.nkv = 4; t.hd = 64; t.page = 8; t.window = 256; t.keep = 4; }
        for (int b = 0; b < ATT_BMAX; b++) {
            t.pos0[b] = (b * 397 + v * 61) % 900;
            t.len[b] = 1;
            if (t.window && t.pos0[b] + 1 > t.window) t.run0[b] = t.pos0[b] + 1 - t.window + b % 7;
        }
        attention_case(&t);
    }
}

static void test_attention(void) {
    for (size_t ci = 0; ci < sizeof ATT_CASES / sizeof *ATT_CASES; ci++) attention_case(&ATT_CASES[ci]);
    test_attention_many();
}

/* rope_kv_attend (rope_kv_write, then attention, in one op; CUDA: a decode's rope and KV write inside its attention
 * kernel) on every attention case, q and k unrotated, the pools holding random older rows: the pools against the
 * reference rope's rows written by be_ref_kv_write (one rounding step of the pool type; every other element as it
 * was, bit for bit), out against be_ref_attention of the reference-rotated q over the pools the op wrote */
static void test_attention_rope(void) {
    if (!have((const void *)be->rope_kv_attend, "rope_kv_attend")) return;
    for (size_t ci = 0; ci < sizeof ATT_CASES / sizeof *ATT_CASES; ci++) {
        const att_case *t = &ATT_CASES[ci];
        int T = t->B * t->L, hd = t->hd, rot = ci % 3 == 2 ? hd / 2 : hd, neox = ci % 2 == 0, *pos = malloc(sizeof(int) * T);
        float *inv = malloc(sizeof(float) * (rot / 2));
        for (int i = 0; i < rot / 2; i++) inv[i] = 1.0f / powf(10000.0f, (float)(2 * i) / (float)rot);
        for (int r = 0; r < T; r++) pos[r] = t->pos0[r / t->L] + r % t->L;
        be_attn a = {.B = t->B, .L = t->L, .n_head = t->H, .n_kv_head = t->nkv, .head_dim = hd, .pos0 = t->pos0, .len = t->len,
                     .window = t->window, .keep = t->keep, .run0 = t->run0, .scale = 1.0f / sqrtf((float)hd), .softcap = t->softcap,
                     .pos = pos, .inv_freq = inv, .rot_dims = rot, .neox = neox};
        if (t->softcap > 0) a.scale *= 8.0f;
        be_dtype dt = (be_dtype)t->dt;
        paged_layout ly;
        paged_new(&ly, &a, t->page, &rng, be, bc);
        size_t nq = (size_t)T * t->H * hd, nk = (size_t)T * t->nkv * hd, ne = paged_pool_elems(&a, &ly), words = words_of(ne, dt);
        float *q = rnd(nq, 2.0f), *k = rnd(nk, 2.0f), *v = rnd(nk, 1.0f), *qr = malloc(nq * 4), *kr = malloc(nk * 4);
        memcpy(qr, q, nq * 4);
        memcpy(kr, k, nk * 4);
        be_ref_rope(qr, T, t->H, hd, rot, pos, inv, neox);
        be_ref_rope(kr, T, t->nkv, hd, rot, pos, inv, neox);
        void *kref = pool_rand(ne, dt, 2.0f), *vref = pool_rand(ne, dt, 1.0f), *kd = malloc(words * 4), *vd = malloc(words * 4);
        gbuf gq = gb_new(nq), gk = gb_new(nk), gv = gb_new(nk), gkc = gb_new(words), gvc = gb_new(words), go = gb_new(nq);
        gb_put(&gq, q); gb_put(&gk, k); gb_put(&gv, v);
        be->from_host(bc, gkc.p, kref, ne * be_dtype_size(dt));
        be->from_host(bc, gvc.p, vref, ne * be_dtype_size(dt));
        be->rope_kv_attend(bc, &a, gq.p, gk.p, gv.p, gkc.p, gvc.p, dt, go.p);
        float *mask = calloc(ne, 4), *ones = malloc(nk * 4), *got = malloc(nq * 4), *ref = malloc(nq * 4);
        for (size_t i = 0; i < nk; i++) ones[i] = 1.0f;
        be_ref_kv_write(&a, ones, mask, BE_F32);   /* mask[e] = 1: the op writes element e */
        be_ref_kv_write(&a, kr, kref, dt);
        be_ref_kv_write(&a, v, vref, dt);
        int guards = gb_get(&gkc, kd) & gb_get(&gvc, vd) & gb_get(&go, got), untouched = 1;
        double ec = 0;
        for (size_t e = 0; e < ne; e++)
            for (int which = 0; which < 2; which++) {
                const void *have_ = which ? vd : kd, *want = which ? vref : kref;
                if (!mask[e]) { untouched &= bits(have_, dt, e) == bits(want, dt, e); continue; }
                double d = fabs((double)be_kv_get(have_, dt, e) - be_kv_get(want, dt, e));
                if (!(d <= ec)) ec = d;
            }
        be_ref_attention(&a, qr, kd, vd, dt, ref);
        double e = relerr(got, ref, nq), tc = dt == BE_F32 ? 4e-4 : dt == BE_F16 ? 4e-3 : 3.2e-2;   /* a pool step at |k| < 2 */
        int flash = on_cuda && (hd == 64 || hd == 128 || hd == 256) && t->L >= 16 && !(t->softcap > 0);
        double tol = flash ? 6e-3 : 1e-4;   /* q rotated on the device: its last bits move scores of |q.k| up to ~20 */
        CHECK(guards && untouched && ec <= tc && e <= tol,
              "rope_kv_attend B=%d L=%d H=%d/%d hd=%d rot=%d %s page=%d window=%d keep=%d kv=%s: out err %.2e (tol %.0e), pool err "
              "%.2e (tol %.0e), other slots %s, guards %s",
              t->B, t->L, t->H, t->nkv, hd, rot, neox ? "neox" : "interleaved", t->page, t->window, t->keep, DTN[dt], e, tol, ec, tc,
              untouched ? "as they were" : "WRITTEN", guards ? "intact" : "WRITTEN");
        gb_free(&gq); gb_free(&gk); gb_free(&gv); gb_free(&gkc); gb_free(&gvc); gb_free(&go);
        paged_free(&ly);
        free(pos); free(inv); free(q); free(k); free(v); free(qr); free(kr); free(kref); free(vref); free(kd); free(vd);
        free(mask); free(ones); free(got); free(ref);
    }
}


/* ---------------------------------------------------------- quantized KV */

/* a quantized pool of n slots (be_kvq): host copy and a device copy framed by guards */
typedef struct qpool {
    be_kvq h, d;            /* host pools; device pools (the gbufs' payloads) */
    gbuf g[3];              /* codes, scales, biases */
    size_t bytes[3];
} qpool;

static void qpool_new(qpool *p, size_t n, int hd, int bits, int group, be_dtype sdt) {
    p->bytes[0] = n * (size_t)hd * bits / 8;
    p->bytes[1] = p->bytes[2] = n * (size_t)(hd / group) * be_dtype_size(sdt);
    void *hp[3];
    for (int i = 0; i < 3; i++) {
        size_t w = (p->bytes[i] + 3) / 4;
        hp[i] = poisoned(w);
        p->g[i] = gb_new(w);
    }
    p->h = (be_kvq){hp[0], hp[1], hp[2], bits, group, sdt};
    p->d = (be_kvq){p->g[0].p, p->g[1].p, p->g[2].p, bits, group, sdt};
}
static void qpool_put(qpool *p) {
    void *hp[3] = {p->h.codes, p->h.scales, p->h.biases};
    for (int i = 0; i < 3; i++) be->from_host(bc, p->g[i].p, hp[i], p->bytes[i]);
}
/* the device pools equal the host ones byte for byte (the words around them included); guards intact */
static int qpool_same(qpool *p, int *guards) {
    void *hp[3] = {p->h.codes, p->h.scales, p->h.biases};
    int same = 1;
    for (int i = 0; i < 3; i++) {
        size_t w = (p->bytes[i] + 3) / 4;
        uint32_t *got = malloc(w * 4);
        *guards &= gb_get(&p->g[i], (float *)got);
        same &= !memcmp(got, hp[i], w * 4);
        free(got);
    }
    return same;
}
static void qpool_free(qpool *p) {
    free(p->h.codes); free(p->h.scales); free(p->h.biases);
    for (int i = 0; i < 3; i++) gb_free(&p->g[i]);
}

/* kvq_write into scattered pages: codes, scales and biases equal be_ref_kvq_write's bit for bit (slots it
 * does not write keep their poison), every bit width, group and scale dtype */
static void test_kvq_write(void) {
    if (!have((const void *)be->kvq_write, "kvq_write")) return;
    static const int BITS[] = {2, 3, 4, 5, 6, 8}, GROUPS[] = {32, 64, 128}, HDS[] = {128, 64, 256, 32};
    int n = 0, fails = 0;
    for (int bi = 0; bi < 6; bi++)
        for (int gi = 0; gi < 3; gi++)
            for (int dt = 0; dt < 3; dt++) {
                int hd = HDS[(bi + gi + dt) % 4], group = GROUPS[gi];
                if (hd % group) hd = 128;
                int B = 3, L = 5, nkv = 2, pos0[3] = {0, 3, 17}, len[3] = {5, 2, 4}, run0[3] = {0, 0, 0};
                be_attn a = {.B = B, .L = L, .n_head = nkv, .n_kv_head = nkv, .head_dim = hd, .pos0 = pos0, .len = len, .run0 = run0};
                paged_layout ly;
                paged_new(&ly, &a, (bi + dt) % 2 ? 4 : 16, &rng, be, bc);
                size_t nsrc = (size_t)B * L * nkv * hd, slots = paged_pool_elems(&a, &ly) / hd;
                /* values of several magnitudes, with all-zero and constant rows (the eps and q0 = 0 branches) */
                float *src = rnd(nsrc, (float)(1 << (bi % 3)) * 0.5f);
                for (int d = 0; d < hd; d++) { src[d] = 0.0f; src[hd + d] = 0.25f; src[2 * hd + d] = d % 2 ? -3.0f : 1.5f; }
                qpool qp;
                qpool_new(&qp, slots, hd, BITS[bi], group, (be_dtype)dt);
                qpool_put(&qp);
                be_ref_kvq_write(&a, src, &qp.h);
                gbuf gs = gb_new(nsrc);
                gb_put(&gs, src);
                be->kvq_write(bc, &a, gs.p, &qp.d);
                int guards = 1, same = qpool_same(&qp, &guards);
                n++;
                if (!(same && guards)) {
                    fails++;
                    printf("# kvq_write %d-bit group %d %s hd %d page %d: %s, guards %s\n", BITS[bi], group, DTN[dt], hd, a.page,
                           same ? "same" : "DIFFERENT", guards ? "intact" : "WRITTEN");
                }
                gb_free(&gs);
                qpool_free(&qp);
                paged_free(&ly);
                free(src);
            }
    CHECK(fails == 0, "kvq_write: codes, scales and biases equal the reference bit for bit in %d/%d cases (bits 2-8 x group 32/64/128 "
          "x f32/f16/bf16 scales, head_dim 32-256, pages 4 and 16), other slots untouched, guards intact", n - fails, n);
}

/* rope of q and k, then k and v quantized into their pools, in one op: q and k against the reference rope; the
 * pools equal be_ref_kvq_write of the op's own rotated k (so the rope's last bits do not move a code) and of v,
 * bit for bit (slots it does not write keep their poison); more rotation pairs than a block's threads once */
static void test_rope_kvq_write(void) {
    if (!have((const void *)be->rope_kvq_write, "rope_kvq_write")) return;
    static const struct { int bits, group, dt, hd, H, nkv, half_rot, page; } C[] = {
        {4, 64, BE_BF16, 128, 8, 2, 0, 16}, {8, 64, BE_F32, 128, 6, 3, 1, 4}, {2, 32, BE_F16, 64, 4, 2, 0, 4},
        {3, 32, BE_BF16, 64, 2, 2, 1, 16}, {5, 128, BE_F32, 256, 4, 1, 0, 16}, {6, 32, BE_F16, 32, 4, 4, 0, 4},
        {4, 32, BE_F32, 128, 24, 1, 0, 16}, {8, 128, BE_BF16, 128, 32, 8, 1, 16},
    };
    for (size_t ci = 0; ci < sizeof C / sizeof *C; ci++) {
        int hd = C[ci].hd, H = C[ci].H, nkv = C[ci].nkv, T = 15, rot = C[ci].half_rot ? hd / 2 : hd, neox = (int)ci % 2;
        rope_batch rb;
        rope_batch_new(&rb, H, nkv, hd, rot, neox);
        be_attn a = rb.a;
        paged_layout ly;
        paged_new(&ly, &a, C[ci].page, &rng, be, bc);
        size_t nq = (size_t)T * H * hd, nk = (size_t)T * nkv * hd, slots = paged_pool_elems(&a, &ly) / hd;
        float *q = rnd(nq, 1.0f), *k = rnd(nk, 1.0f), *v = rnd(nk, 2.0f), *qr = malloc(nq * 4), *kr = malloc(nk * 4);
        float *qg = malloc(nq * 4), *kg = malloc(nk * 4);
        memcpy(qr, q, nq * 4);
        memcpy(kr, k, nk * 4);
        rope_batch_ref(&rb, qr, H);
        rope_batch_ref(&rb, kr, nkv);
        qpool kp, vp;
        qpool_new(&kp, slots, hd, C[ci].bits, C[ci].group, (be_dtype)C[ci].dt);
        qpool_new(&vp, slots, hd, C[ci].bits, C[ci].group, (be_dtype)C[ci].dt);
        qpool_put(&kp);
        qpool_put(&vp);
        gbuf gq = gb_new(nq), gk = gb_new(nk), gv = gb_new(nk);
        gb_put(&gq, q); gb_put(&gk, k); gb_put(&gv, v);
        be->rope_kvq_write(bc, &a, gq.p, gk.p, gv.p, &kp.d, &vp.d);
        int guards = gb_get(&gq, qg) & gb_get(&gk, kg) & gb_get(&gv, v);
        be_ref_kvq_write(&a, kg, &kp.h);
        be_ref_kvq_write(&a, v, &vp.h);
        int same = qpool_same(&kp, &guards) & qpool_same(&vp, &guards);
        double eq = relerr(qg, qr, nq), ek = relerr(kg, kr, nk);
        CHECK(guards && same && eq <= 2e-4 && ek <= 2e-4,
              "rope_kvq_write %d-bit g%d %s hd %d H %d/%d rot %d %s page %d: q err %.2e, k err %.2e; pools %s the reference's of the "
              "op's k and v, guards %s", C[ci].bits, C[ci].group, DTN[C[ci].dt], hd, H, nkv, rot, neox ? "neox" : "interleaved", a.page,
              eq, ek, same ? "equal" : "DIFFER FROM", guards ? "intact" : "WRITTEN");
        gb_free(&gq); gb_free(&gk); gb_free(&gv);
        qpool_free(&kp); qpool_free(&vp);
        paged_free(&ly);
        free(q); free(k); free(v); free(qr); free(kr); free(qg); free(kg); free(rb.inv);
    }
}

typedef struct kvq_case {
    int B, L, H, nkv, hd, page, window, keep, bits, group, sdt, kernel;
    int pos0[3], len[3], run0[3];
    float softcap;
} kvq_case;

/* one kvq_attention case over a random paged layout, pools quantized on the host, against be_ref_kvq_attention */
static int kvq_attention_case(const kvq_case *t) {
    be_attn a = {.B = t->B, .L = t->L, .n_head = t->H, .n_kv_head = t->nkv, .head_dim = t->hd, .pos0 = t->pos0, .len = t->len,
                 .window = t->window, .keep = t->keep, .run0 = t->run0, .scale = 1.0f / sqrtf((float)t->hd), .softcap = t->softcap};
    if (t->softcap > 0) a.scale *= 8.0f;
    paged_layout ly;
    paged_new(&ly, &a, t->page, &rng, be, bc);
    size_t nq = (size_t)t->B * t->L * t->H * t->hd, slots = paged_pool_elems(&a, &ly) / t->hd;
    qpool kp, vp;
    qpool_new(&kp, slots, t->hd, t->bits, t->group, (be_dtype)t->sdt);
    qpool_new(&vp, slots, t->hd, t->bits, t->group, (be_dtype)t->sdt);
    float *row = malloc(sizeof(float) * t->hd);
    for (int kv = 0; kv < 2; kv++) {
        be_kvq *p = kv ? &vp.h : &kp.h;
        size_t rb = (size_t)t->hd * t->bits / 8, sb = (size_t)(t->hd / t->group) * be_dtype_size(p->sdt);
        for (size_t sl = 0; sl < slots; sl++) {
            for (int d = 0; d < t->hd; d++) row[d] = (kv ? 1.0f : 2.0f) * frand();
            aq_quantize_row(row, t->hd, t->bits, t->group, AQ_ROUND_GPU, p->sdt, (uint8_t *)p->codes + sl * rb,
                            (char *)p->scales + sl * sb, (char *)p->biases + sl * sb);
        }
    }
    qpool_put(&kp);
    qpool_put(&vp);
    float *q = rnd(nq, 2.0f), *got = malloc(nq * 4), *ref = malloc(nq * 4);
    gbuf gq = gb_new(nq), go = gb_new(nq);
    gb_put(&gq, q);
    be->kvq_attention(bc, &a, gq.p, &kp.d, &vp.d, t->kernel, go.p);
    int guards = gb_get(&go, got);
    char msg[256] = "";
    int err = be->status ? be->status(bc, msg, sizeof msg) : 0;
    be_ref_kvq_attention(&a, q, &kp.h, &vp.h, t->kernel, ref);
    double e = relerr(got, ref, nq);
    /* CUDA: prefill (L >= 16, no softcap) runs flash on f16 tensor cores; the rest (and the CPU's
     * attention-kvq.c) f32 sums with the scale/bias terms factored per group */
    int flash = on_cuda && t->L >= 16 && t->hd >= 64 && !(t->softcap > 0);
    double tol = flash ? 6e-3 : 5e-5;
    int ok = guards && !err && e <= tol;
    CHECK(ok, "kvq_attention %s %s %d-bit g%d %s B=%d L=%d H=%d/%d hd=%d page=%d window=%d keep=%d softcap=%g span=%d: err %.2e "
          "(tol %.0e), guards %s%s%s", t->kernel == BE_KVQ_TILED ? "tiled" : "unfused", !on_cuda ? "cpu" : flash ? "flash" : "split",
          t->bits, t->group, DTN[t->sdt], t->B, t->L, t->H, t->nkv, t->hd, t->page, t->window, t->keep, t->softcap, a.max_span, e, tol,
          guards ? "intact" : "WRITTEN", err ? "; error: " : "", msg);
    gb_free(&gq); gb_free(&go);
    qpool_free(&kp); qpool_free(&vp);
    paged_free(&ly);
    free(row); free(q); free(got); free(ref);
    return ok;
}

enum { UNF = BE_KVQ_UNFUSED, TIL = BE_KVQ_TILED };
static const kvq_case KVQ_CASES[] = {
    /* B  L   H  kv  hd  page win keep bits grp sdt kernel  pos0              len          run0 */
    {3, 1, 32, 8, 128, 16, 0, 0, 4, 64, 2, UNF, {200, 5, 1000}, {1, 1, 1}, {0}, 0},          /* decode, llama-3-8b heads, KV4 bf16 */
    {3, 1, 32, 8, 128, 128, 0, 0, 8, 64, 2, UNF, {1300, 600, 2000}, {1, 1, 1}, {0}, 0},      /* KV8, several slices */
    {3, 1, 32, 8, 128, 16, 0, 0, 8, 64, 2, TIL, {1300, 600, 2000}, {1, 1, 1}, {0}, 0},       /* tiled: tiles of 512 */
    {2, 1, 8, 2, 128, 32, 640, 4, 4, 32, 1, UNF, {1500, 900}, {1, 1}, {865, 265}, 0},        /* window 640 with 4 sinks, f16 */
    {2, 1, 8, 2, 128, 32, 640, 4, 4, 32, 1, TIL, {1500, 900}, {1, 1}, {865, 265}, 0},        /* ... tiled: the run cut at 1024 */
    {1, 1, 4, 4, 64, 8, 0, 0, 2, 64, 0, UNF, {300}, {1}, {0}, 0},                            /* 2-bit, g = 1, f32 scales */
    {2, 3, 12, 4, 128, 16, 0, 0, 3, 32, 2, UNF, {100, 250}, {3, 2}, {0}, 0},                 /* 3-bit, g = 3, a padded query */
    {2, 2, 8, 4, 64, 4, 0, 0, 5, 64, 1, UNF, {40, 700}, {2, 2}, {0}, 0},                     /* 5-bit, page 4 */
    {2, 1, 8, 4, 256, 16, 16, 0, 6, 32, 0, UNF, {40, 9}, {1, 1}, {0}, 50.0f},                /* 6-bit, head_dim 256, softcap, window */
    {2, 2, 16, 2, 128, 64, 0, 0, 8, 128, 1, TIL, {517, 60}, {2, 1}, {0}, 0},                 /* g = 8, group 128 */
    {1, 1, 8, 2, 128, 256, 0, 0, 4, 64, 2, UNF, {5000}, {1}, {0}, 0},                        /* long span */
    {1, 1, 8, 2, 128, 256, 0, 0, 4, 64, 2, TIL, {5000}, {1}, {0}, 0},                        /* ... tiled: 10 tiles */
    {2, 1, 16, 4, 128, 16, 0, 0, 4, 128, 0, UNF, {700, 333}, {1, 1}, {0}, 0},               /* decode KV4 group 128, f32 scales, g = 4 */
    {2, 1, 8, 4, 64, 16, 0, 0, 4, 32, 1, UNF, {900, 70}, {1, 1}, {0}, 0},                   /* decode head_dim 64, KV4 g32 f16, g = 2 */
    {1, 1, 16, 2, 64, 32, 0, 0, 4, 64, 0, UNF, {1200}, {1}, {0}, 0},                        /* ... KV4 g64 f32 (4 bytes of scales a row), g = 8 */
    {1, 1, 24, 8, 128, 16, 0, 0, 8, 32, 2, UNF, {1100}, {1}, {0}, 0},                       /* decode KV8 g32, g = 3 */
    {2, 5, 8, 2, 128, 16, 700, 4, 4, 64, 2, TIL, {1020, 1600}, {5, 3}, {328, 908}, 0},       /* few queries, window across tiles */
    {2, 70, 8, 2, 128, 64, 0, 0, 4, 64, 2, UNF, {0, 600}, {70, 70}, {0}, 0},                 /* prefill (flash on CUDA) */
    {1, 40, 8, 2, 64, 16, 64, 4, 8, 32, 1, TIL, {300}, {40}, {250}, 0},                      /* ... sinks and a gap before the run */
    {2, 20, 4, 2, 64, 1, 0, 0, 3, 64, 0, TIL, {0, 530}, {20, 11}, {0}, 0},                   /* ... 3-bit, page 1, padded row */
    {1, 24, 8, 4, 256, 32, 0, 0, 4, 128, 2, UNF, {100}, {24}, {0}, 0},                       /* ... head_dim 256 */
    {1, 20, 8, 4, 128, 16, 0, 0, 4, 64, 1, UNF, {30}, {20}, {0}, 30.0f},                     /* ... softcap: split on CUDA */
    {2, 3, 4, 2, 32, 4, 0, 0, 4, 32, 0, UNF, {600, 7}, {3, 2}, {0}, 0},                      /* head_dim 32 (test-cache's), split */
    {1, 20, 4, 2, 32, 8, 24, 4, 8, 32, 0, TIL, {700}, {20}, {680}, 0},                       /* ... prefill: split too, window + sinks */
};

static void test_kvq_attention(void) {
    if (!have((const void *)be->kvq_attention, "kvq_attention")) return;
    /* the CPU's tiers: what this CPU gives (AMX scores where it has them), then again capped below AMX (the
     * AVX-512 scores), unless CINFER_ISA already chose */
    const char *isa = getenv("CINFER_ISA");
    int tiers = !on_cuda && !(isa && *isa) ? 2 : 1;
    for (int ti = 0; ti < tiers; ti++) {
        if (ti) {
            setenv("CINFER_ISA", "avx512vnni", 1);
            printf("# the kvq_attention cases again with CINFER_ISA=avx512vnni\n");
        }
        for (size_t ci = 0; ci < sizeof KVQ_CASES / sizeof *KVQ_CASES; ci++) kvq_attention_case(&KVQ_CASES[ci]);
    }
    if (tiers > 1) unsetenv("CINFER_ISA");
}

#ifdef CINFER_CUDA
/* Item 9: an op's failure is reported once by status and cleared; inside a graph step the
 * capture is closed and nothing runs; afterwards ops, split-K attention (its counters) and
 * graphs (test_graph, next) work again. */
static void test_errors(void) {
    int pos0[1] = {0}, len[1] = {1}, run0[1] = {0}, seq[1] = {0}, pos[1] = {0};
    float inv[32] = {0};
    be_attn bad = {.B = 1, .L = 1, .n_head = 3, .n_kv_head = 2, .head_dim = 64, .pos0 = pos0, .len = len, .run0 = run0,
                   .seq = seq, .page = 16, .n_pt = 1, .pos = pos, .inv_freq = inv, .rot_dims = 64, .neox = 1, .max_span = 1};
    char m1[256], m2[256], m3[256];
    be->rope_kv_write(bc, &bad, NULL, NULL, NULL, NULL, NULL, BE_F16);   /* 3 heads over 2 kv heads: refused */
    int e1 = be->status(bc, m1, sizeof m1), e2 = be->status(bc, m2, sizeof m2);
    CHECK(e1 && strstr(m1, "geometry") && !e2, "an op's error is reported by status (\"%s\") and then cleared", m1);
    be->step_begin(bc);
    be->rope_kv_write(bc, &bad, NULL, NULL, NULL, NULL, NULL, BE_F16);
    be->step_end(bc);
    int e3 = be->status(bc, m3, sizeof m3), e4 = be->status(bc, m3, sizeof m3);
    CHECK(e3 && !e4, "an error inside a graph step: reported, the capture closed, cleared");
    CHECK(attention_case(&ATT_CASES[0]) && attention_case(&ATT_CASES[1]), "split-K and decode attention correct after the errors");
}

/* decode steps over quantized pools as graphs: each step writes a new key and value per row and attends;
 * captured once, replayed with new positions; pools and outputs equal the reference at every step. And
 * shapes the kernels do not take fail with a message. */
static void test_kvq_graph(void) {
    int B = 2, H = 8, nkv = 2, hd = 128, steps = 6, base[2] = {300, 41}, lenS[2] = {steps, steps}, run0[2] = {0, 0};
    be_attn a = {.B = B, .L = steps, .n_head = H, .n_kv_head = nkv, .head_dim = hd, .pos0 = base, .len = lenS, .run0 = run0,
                 .scale = 1.0f / sqrtf((float)hd)};
    paged_layout ly;
    paged_new(&ly, &a, 16, &rng, be, bc);   /* pages for every step's position */
    size_t slots = paged_pool_elems(&a, &ly) / hd, nq = (size_t)B * H * hd, nk = (size_t)B * nkv * hd;
    qpool kp, vp;
    qpool_new(&kp, slots, hd, 4, 64, BE_BF16);
    qpool_new(&vp, slots, hd, 4, 64, BE_BF16);
    /* the prefix: every slot quantized from random rows (one write of all positions before the steps) */
    {
        int pz[2] = {0, 0}, lz[2] = {base[0], base[1]};
        be_attn w = a;
        w.L = base[0];
        w.pos0 = pz;
        w.len = lz;
        float *src = rnd((size_t)B * w.L * nkv * hd, 1.0f);
        gbuf gs = gb_new((size_t)B * w.L * nkv * hd);
        gb_put(&gs, src);
        be_ref_kvq_write(&w, src, &kp.h);
        be->kvq_write(bc, &w, gs.p, &kp.d);
        for (size_t i = 0; i < (size_t)B * w.L * nkv * hd; i++) src[i] = frand();
        gb_put(&gs, src);
        be_ref_kvq_write(&w, src, &vp.h);
        be->kvq_write(bc, &w, gs.p, &vp.d);
        gb_free(&gs);
        free(src);
    }
    gbuf gq = gb_new(nq), gk = gb_new(nk), gv = gb_new(nk), go = gb_new(nq);
    float *q = malloc(nq * 4), *k = malloc(nk * 4), *v = malloc(nk * 4), *got = malloc(nq * 4), *ref = malloc(nq * 4);
    long cap0, rep0, cap1, rep1;
    cuda_graph_stats(bc, &cap0, &rep0);
    double worst = 0;
    int pools = 1, guards = 1;
    for (int st = 0; st < steps; st++) {
        int p0[2] = {base[0] + st, base[1] + st}, one[2] = {1, 1};
        be_attn d = a;
        d.L = 1;
        d.pos0 = p0;
        d.len = one;
        d.max_span = base[0] + steps;   /* the cache's bound: one bucket for every step */
        for (size_t i = 0; i < nq; i++) q[i] = 2.0f * frand();
        for (size_t i = 0; i < nk; i++) { k[i] = 2.0f * frand(); v[i] = frand(); }
        gb_put(&gq, q); gb_put(&gk, k); gb_put(&gv, v);
        be->step_begin(bc);
        be->kvq_write(bc, &d, gk.p, &kp.d);
        be->kvq_write(bc, &d, gv.p, &vp.d);
        be->kvq_attention(bc, &d, gq.p, &kp.d, &vp.d, BE_KVQ_UNFUSED, go.p);
        be->step_end(bc);
        guards &= gb_get(&go, got);
        be_ref_kvq_write(&d, k, &kp.h);
        be_ref_kvq_write(&d, v, &vp.h);
        be_ref_kvq_attention(&d, q, &kp.h, &vp.h, BE_KVQ_UNFUSED, ref);
        double e = relerr(got, ref, nq);
        if (!(e <= worst)) worst = e;
    }
    pools &= qpool_same(&kp, &guards) & qpool_same(&vp, &guards);
    cuda_graph_stats(bc, &cap1, &rep1);
    CHECK(worst <= 5e-5 && pools && guards && cap1 - cap0 >= 1 && rep1 - rep0 >= steps - 2,
          "kvq decode steps as graphs: captured %ld, replayed %ld; output err %.2e (tol 5e-05), pools %s, guards %s", cap1 - cap0,
          rep1 - rep0, worst, pools ? "equal the reference" : "DIFFERENT", guards ? "intact" : "WRITTEN");
    /* refused shapes: a clear error from status, then the context works again */
    char msg[256] = "";
    be_attn bad = a;
    bad.head_dim = 96;
    be->kvq_attention(bc, &bad, gq.p, &kp.d, &vp.d, BE_KVQ_UNFUSED, go.p);
    int e1 = be->status(bc, msg, sizeof msg);
    CHECK(e1 && strstr(msg, "head_dim 96"), "kvq_attention with head_dim 96: refused (\"%s\")", msg);
    be_kvq b7 = kp.d;
    b7.bits = 7;
    be->kvq_write(bc, &a, gk.p, &b7);
    int e2 = be->status(bc, msg, sizeof msg);
    CHECK(e2 && strstr(msg, "7-bit"), "kvq_write of 7-bit codes: refused (\"%s\")", msg);
    gb_free(&gq); gb_free(&gk); gb_free(&gv); gb_free(&go);
    qpool_free(&kp); qpool_free(&vp);
    paged_free(&ly);
    free(q); free(k); free(v); free(got); free(ref);
}

/* a little "step": rope(x, pos) then add(x, y); captured, replayed with new positions, then changed */
static void test_graph(void) {
    int n = 3, heads = 4, hd = 64, rot = 64;
    size_t nx = (size_t)n * heads * hd;
    float inv[32];
    for (int i = 0; i < 32; i++) inv[i] = 1.0f / powf(10000.0f, (float)(2 * i) / 64.0f);
    float *x0 = rnd(nx, 1.0f), *y0 = rnd(nx, 1.0f), *ref = malloc(nx * 4), *got = malloc(nx * 4);
    gbuf gx = gb_new(nx), gy = gb_new(nx);
    gb_put(&gy, y0);
    long cap0, rep0, cap1, rep1;
    cuda_graph_stats(bc, &cap0, &rep0);
    int ok = 1;
    /* three kinds of step: rope of 3 rows + add; rope of 2 rows + add (a different op); rope of 3 rows alone (a
     * prefix of the first). Each kind is captured once and then replayed from the context's graph cache,
     * whatever the order (a server's batch sizes come and go) */
    static const int KIND[] = {0, 0, 1, 0, 1, 1, 2, 0, 2, 1};
    int n_steps = (int)(sizeof KIND / sizeof *KIND);
    for (int step = 0; step < n_steps; step++) {
        int pos[3] = {step * 7, step * 7 + 1, 1000 + step};
        int m = KIND[step] == 1 ? 2 : n, add = KIND[step] != 2;
        gb_put(&gx, x0);
        be->step_begin(bc);
        be->rope(bc, gx.p, m, heads, hd, rot, pos, inv, 1);
        if (add) be->add(bc, gx.p, gy.p, nx);
        be->step_end(bc);
        gb_get(&gx, got);
        memcpy(ref, x0, nx * 4);
        be_ref_rope(ref, m, heads, hd, rot, pos, inv, 1);
        for (size_t i = 0; add && i < nx; i++) ref[i] += y0[i];
        double e = relerr(got, ref, nx);
        ok &= e <= 2e-4;
        if (e > 2e-4) printf("# graph step %d: err %.2e\n", step, e);
    }
    cuda_graph_stats(bc, &cap1, &rep1);
    CHECK(ok && cap1 - cap0 == 3 && rep1 - rep0 == n_steps - 3,
          "graph steps of three kinds in mixed order: captured %ld (3), replayed %ld (%d), every step equals the eager result",
          cap1 - cap0, rep1 - rep0, n_steps - 3);
    char msg[256];
    CHECK(be->status(bc, msg, sizeof msg) == 0, "status: no error recorded after the whole run");
    gb_free(&gx); gb_free(&gy);
    free(x0); free(y0); free(ref); free(got);
}

#endif

int main(void) {
    on_cuda = test_on_cuda();
    be = on_cuda ? be_cuda() : be_cpu();
    CHECK(be != NULL, "backend %s built", on_cuda ? "cuda" : "cpu");
    if (!be) return CHECK_DONE();
    CHECK(be->ctx_new(&bc, on_cuda ? 1 : 2) == 0, "%s context", be->name);
    if (!bc) return CHECK_DONE();
    if (be->prefill_act) be->prefill_act(bc, BE_ACT_F32);   /* the f32 definition (the bf16 mode: test-cpu-kernels) */
    /* CINFER_TEST_ONLY=WORD: only the tests whose name holds WORD (a sanitizer run of a few kernels) */
    const char *only = getenv("CINFER_TEST_ONLY");
#define RUN(t) do { if (!only || strstr(#t, only)) t(); } while (0)
    RUN(test_matmul);
    RUN(test_matmul_multi);
    RUN(test_norm_matmul);
    RUN(test_matmul_add);
    RUN(test_matmul_affine);
    RUN(test_affine_fused);
    RUN(test_rmsnorm);
    RUN(test_rope);
    RUN(test_elementwise);
    RUN(test_score);
    if (be->score_head) RUN(test_score_head);
    RUN(test_kv_write);
    RUN(test_rope_kv_write);
    RUN(test_attention);
    RUN(test_attention_rope);
    RUN(test_kvq_write);
    RUN(test_rope_kvq_write);
    RUN(test_kvq_attention);
#ifdef CINFER_CUDA
    if (on_cuda) {
        RUN(test_errors);
        RUN(test_graph);
        RUN(test_kvq_graph);
    }
#endif
#undef RUN
    if (on_cuda) {   /* (on the CPU, calloc of 2^50 bytes aborts under AddressSanitizer instead of returning NULL) */
        void *huge = be->alloc(bc, (size_t)1 << 50);
        char msg[256];
        CHECK(huge == NULL && be->status(bc, msg, sizeof msg) == 0,
              "an impossible allocation returns NULL and leaves the context usable");
    }
    be->ctx_free(bc);
    return CHECK_DONE();
}
