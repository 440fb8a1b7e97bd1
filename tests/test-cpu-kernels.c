/*
 * test-cpu-kernels.c — the fast CPU matmul kernels against the scalar
 * reference (be_ref_matmul, double accumulation) on random inputs.
 *
 * Covered: every kernel set this CPU runs (avx512 / avx2 / scalar, from
 * gemv.h) x every weight dtype (f32, f16, bf16) x odd sizes (k not a multiple
 * of the vector width, rows not a multiple of the 4-row block) x n = 1..8
 * tokens; the row converters of the GEMM path (exact); the full cpu_matmul
 * through the backend table with 1, 2 and 3 threads, with and without bias,
 * for small n (GEMV) and large n (blocked GEMM); matmul_multi (1..3
 * matrices in one call, with and without bias, same and mixed dtypes); and
 * the thread pool (every (ith, nth) runs exactly once per call, many calls in
 * a row).
 *
 * Error bound: |y - ref| <= 1e-5 * sum_i |x_i w_i| + 1e-6 — f32 accumulation
 * over k terms in any order stays far inside this for k up to a few thousand.
 * Weights are rounded to their dtype first, so the reference sees the same
 * values the kernels read.
 */
#include <stdatomic.h>
#include <stdint.h>
#include "backend/cpu/cpu.h"
#include "backend/cpu/gemv.h"
#include "check.h"
#include "quant/affine.h"
#include "paged.h"

static uint64_t rng = 0x9E3779B97F4A7C15ull;
static float frand(void) {  /* uniform [-1, 1) */
    rng ^= rng << 13; rng ^= rng >> 7; rng ^= rng << 17;
    return (float)((rng >> 40) * (1.0 / 8388608.0)) - 1.0f;
}

typedef struct { be_mat m; void *buf; } tmat;

static tmat make_mat(be_dtype dt, int64_t rows, int64_t cols, float scale) {
    tmat t;
    size_t n = (size_t)(rows * cols);
    t.buf = malloc(n * be_dtype_size(dt) + 64);
    for (size_t i = 0; i < n; i++) {
        float v = frand() * scale;
        if (dt == BE_F32) ((float *)t.buf)[i] = v;
        else if (dt == BE_F16) ((uint16_t *)t.buf)[i] = be_f32_to_f16(v);
        else ((uint16_t *)t.buf)[i] = be_f32_to_bf16(v);
    }
    t.m = (be_mat){ .data = t.buf, .dt = dt, .rows = rows, .cols = cols };
    return t;
}

/* max over outputs of |y - ref| / (1e-5 * sum|x w| + 1e-6): <= 1 passes */
static double err_ratio(const float *x, int n, const be_mat *w, const be_mat *bias,
                        const float *y, const float *ref) {
    double worst = 0;
    for (int t = 0; t < n; t++)
        for (int64_t r = 0; r < w->rows; r++) {
            double mag = bias ? fabs(be_mat_get(bias, 0, r)) : 0;
            for (int64_t i = 0; i < w->cols; i++)
                mag += fabs((double)x[t * w->cols + i] * be_mat_get(w, r, i));
            double e = fabs((double)y[t * w->rows + r] - ref[t * w->rows + r]) / (1e-5 * mag + 1e-6);
            if (!(e <= worst)) worst = e;   /* NaN propagates as a failure */
        }
    return worst;
}

static const be_dtype DTS[3] = { BE_F32, BE_F16, BE_BF16 };

static void test_kernel_sets(void) {
    static const char *isas[] = { "scalar", "avx2", "avx512" };
    static const int64_t ks[] = { 1, 7, 15, 16, 17, 31, 32, 33, 63, 64, 65, 100, 259, 2053 };
    static const int64_t ms[] = { 1, 3, 4, 5, 9, 13, 38 };   /* 38: the decode streams of gemv-avx512.c, rows left over */
    for (int s = 0; s < 3; s++) {
        const gemv_kernels *g = gemv_isa(isas[s]);
        if (!g) { printf("# %s kernels: not on this CPU, skipped\n", isas[s]); continue; }
        for (int d = 0; d < 3; d++) {
            double worst = 0;
            int exact = 1;
            for (size_t ki = 0; ki < sizeof ks / sizeof *ks; ki++)
                for (size_t mi = 0; mi < sizeof ms / sizeof *ms; mi++) {
                    int64_t k = ks[ki], m = ms[mi];
                    tmat w = make_mat(DTS[d], m, k, 1.0f);
                    float *x = malloc(sizeof(float) * 8 * (size_t)k);
                    float *xp = malloc(sizeof(float) * 8 * (size_t)k);
                    float *y = malloc(sizeof(float) * 8 * (size_t)m);
                    float *ref = malloc(sizeof(float) * 8 * (size_t)m);
                    for (int64_t i = 0; i < 8 * k; i++) x[i] = frand();
                    for (int n = 1; n <= 8; n++) {
                        be_ref_matmul(x, n, &w.m, NULL, ref);
                        for (int64_t i = 0; i < n * m; i++) y[i] = NAN;
                        /* two calls on split row ranges, as the pool does */
                        const float *xk = x;
                        if (g->prep_x[DTS[d]]) { g->prep_x[DTS[d]](x, n, k, xp); xk = xp; }
                        g->gemv[DTS[d]](xk, n, &w.m, 0, m / 2, y, m);
                        g->gemv[DTS[d]](xk, n, &w.m, m / 2, m, y, m);
                        double e = err_ratio(x, n, &w.m, NULL, y, ref);
                        if (!(e <= worst)) worst = e;
                    }
                    /* row conversion: exact, and rows r0..r1 only */
                    float *rows = malloc(sizeof(float) * (size_t)(m * k + 1));
                    rows[(m - 1) * k] = 12345.f;   /* just past the converted rows */
                    g->rows_f32[DTS[d]](&w.m, 1, m, rows);
                    for (int64_t r = 1; r < m; r++)
                        for (int64_t i = 0; i < k; i++)
                            if (rows[(r - 1) * k + i] != be_mat_get(&w.m, r, i)) exact = 0;
                    if (rows[(m - 1) * k] != 12345.f) exact = 0;
                    free(rows); free(x); free(xp); free(y); free(ref); free(w.buf);
                }
            CHECK(worst <= 1.0, "%s gemv %s n=1..8 odd sizes: worst error %.3g of bound", isas[s],
                  be_dtype_name(DTS[d]), worst);
            CHECK(exact, "%s rows_f32 %s exact", isas[s], be_dtype_name(DTS[d]));
        }
    }
}

/* cpu_matmul through the backend table: GEMV (small n) and GEMM (large n) */
static void test_matmul(int threads) {
    const be_ops *ops = be_cpu();
    be_ctx *c = NULL;
    CHECK(ops->ctx_new(&c, threads) == 0 && c, "cpu ctx_new %d threads", threads);
    if (!c) return;
    static const int ns[] = { 1, 2, 3, 4, 5, 7, 8, 9, 16, 33, 70 };
    static const struct { int64_t m, k; } sh[] = { { 37, 67 }, { 130, 256 }, { 1, 300 }, { 600, 129 } };
    for (int d = 0; d < 3; d++)
        for (int b = 0; b < 2; b++) {
            double worst = 0;
            for (size_t si = 0; si < sizeof sh / sizeof *sh; si++) {
                int64_t m = sh[si].m, k = sh[si].k;
                tmat w = make_mat(DTS[d], m, k, 0.5f);
                tmat bias = make_mat(BE_F32, 1, m, 1.0f);
                for (size_t ni = 0; ni < sizeof ns / sizeof *ns; ni++) {
                    int n = ns[ni];
                    float *x = malloc(sizeof(float) * (size_t)(n * k));
                    float *y = malloc(sizeof(float) * (size_t)(n * m));
                    float *ref = malloc(sizeof(float) * (size_t)(n * m));
                    for (int64_t i = 0; i < n * k; i++) x[i] = frand();
                    be_ref_matmul(x, n, &w.m, b ? &bias.m : NULL, ref);
                    ops->matmul(c, x, n, &w.m, b ? &bias.m : NULL, y);
                    double e = err_ratio(x, n, &w.m, b ? &bias.m : NULL, y, ref);
                    if (!(e <= worst)) worst = e;
                    free(x); free(y); free(ref);
                }
                free(w.buf); free(bias.buf);
            }
            CHECK(worst <= 1.0, "cpu_matmul %s %s %d threads n=1..70: worst error %.3g of bound",
                  be_dtype_name(DTS[d]), b ? "+bias" : "no bias", threads, worst);
        }
    ops->ctx_free(c);
}

/* matmul_multi: up to 3 matrices of the same cols in one call (one pool run
 * over all their rows for few tokens, one cpu_matmul each otherwise, or when
 * the dtypes differ), each output as the reference gives it */
static void test_matmul_multi(int threads) {
    const be_ops *ops = be_cpu();
    be_ctx *c = NULL;
    CHECK(ops->ctx_new(&c, threads) == 0 && c, "cpu ctx_new %d threads", threads);
    if (!c || !ops->matmul_multi) return;
    static const int ns[] = { 1, 2, 5, 9, 33 };
    static const int64_t ms[3] = { 130, 21, 67 };
    const int64_t k = 259;
    for (int d = 0; d < 4; d++) {   /* d == 3: mixed dtypes */
        double worst = 0;
        tmat w[3], bias[3];
        for (int i = 0; i < 3; i++) {
            w[i] = make_mat(d == 3 ? DTS[i] : DTS[d], ms[i], k, 0.5f);
            bias[i] = make_mat(BE_F32, 1, ms[i], 1.0f);
        }
        for (size_t ni = 0; ni < sizeof ns / sizeof *ns; ni++)
            for (int count = 1; count <= 3; count++) {
                int n = ns[ni];
                float *x = malloc(sizeof(float) * (size_t)(n * k)), *y[3], *ref = malloc(sizeof(float) * (size_t)(n * 130));
                const be_mat *wp[3], *bp[3];
                for (int i = 0; i < 3; i++) {
                    y[i] = malloc(sizeof(float) * (size_t)(n * ms[i]));
                    for (int64_t e = 0; e < n * ms[i]; e++) y[i][e] = NAN;
                    wp[i] = &w[i].m;
                    bp[i] = i == 1 ? NULL : &bias[i].m;   /* one without bias */
                }
                for (int64_t i = 0; i < n * k; i++) x[i] = frand();
                ops->matmul_multi(c, x, n, count, wp, bp, y);
                for (int i = 0; i < count; i++) {
                    be_ref_matmul(x, n, wp[i], bp[i], ref);
                    double e = err_ratio(x, n, wp[i], bp[i], y[i], ref);
                    if (!(e <= worst)) worst = e;
                }
                free(x); free(ref);
                for (int i = 0; i < 3; i++) free(y[i]);
            }
        for (int i = 0; i < 3; i++) { free(w[i].buf); free(bias[i].buf); }
        CHECK(worst <= 1.0, "matmul_multi %s, %d threads, 1..3 matrices, n=1..33: worst error %.3g of bound",
              d == 3 ? "mixed dtypes" : be_dtype_name(DTS[d]), threads, worst);
    }
    ops->ctx_free(c);
}

/* AVX-512 BF16 prefill kernel: exact up to summation order once x is
 * rounded to bf16 (the reference sees the rounded x); and through cpu_matmul
 * with CINFER_BF16_ACT=1 on every CPU (without AVX-512 BF16, or under
 * CINFER_ISA=avx2, the rounded x through the f32 path) */
static void test_bf16_matmul(void);
static void test_gemm_bf16(void) {
    if (!gemm_bf16_available()) printf("# avx512bf16 not on this CPU (or capped by CINFER_ISA): the kernel skipped, its emulation checked\n");
    static const int ns[] = { 1, 9, 31, 32, 33, 70 };
    static const int64_t ms[] = { 1, 11, 12, 13, 37 }, ks[] = { 1, 2, 3, 31, 64, 257 };
    double worst = 0;
    for (size_t a = 0; a < sizeof ns / sizeof *ns && gemm_bf16_available(); a++)
        for (size_t b = 0; b < sizeof ms / sizeof *ms; b++)
            for (size_t d = 0; d < sizeof ks / sizeof *ks; d++) {
                int n = ns[a];
                int64_t m = ms[b], k = ks[d];
                tmat w = make_mat(BE_BF16, m, k, 1.0f);
                float *x = malloc(sizeof(float) * (size_t)(n * k)), *xr = malloc(sizeof(float) * (size_t)(n * k));
                float *y = malloc(sizeof(float) * (size_t)(n * m)), *ref = malloc(sizeof(float) * (size_t)(n * m));
                uint32_t *xp = malloc(4 * gemm_bf16_xp_words(n, k));
                uint16_t *tmp = malloc(2 * (size_t)(k + 1));
                for (int64_t i = 0; i < n * k; i++) {
                    x[i] = frand();
                    xr[i] = be_bf16_to_f32(be_f32_to_bf16(x[i]));
                }
                for (int64_t i = 0; i < n * m; i++) y[i] = NAN;
                be_ref_matmul(xr, n, &w.m, NULL, ref);
                gemm_bf16_pack_x(x, n, k, xp, tmp);
                gemm_bf16_rows(xp, n, k, w.m.data, m, 0, m / 2, y);
                gemm_bf16_rows(xp, n, k, w.m.data, m, m / 2, m, y);
                double e = err_ratio(xr, n, &w.m, NULL, y, ref);
                if (!(e <= worst)) worst = e;
                free(x); free(xr); free(y); free(ref); free(xp); free(tmp); free(w.buf);
            }
    if (gemm_bf16_available()) CHECK(worst <= 1.0, "gemm-bf16 kernel n=1..70, odd m, k: worst error %.3g of bound", worst);

    /* the AMX form of the same products (gemm-amx.c): x and the rows packed, padded to 32 */
    if (!gemm_amx_available()) printf("# AMX not on this CPU or not granted (or capped by CINFER_ISA): its kernel skipped\n");
    static const int64_t mx[] = { 1, 16, 17, 32, 33, 70 }, kx[] = { 1, 2, 31, 32, 33, 64, 257 };
    worst = 0;
    for (size_t a = 0; a < sizeof ns / sizeof *ns && gemm_amx_available(); a++)
        for (size_t b = 0; b < sizeof mx / sizeof *mx; b++)
            for (size_t d = 0; d < sizeof kx / sizeof *kx; d++) {
                int n = ns[a];
                int64_t m = mx[b], k = kx[d], ldy = m + 3;
                tmat w = make_mat(BE_F32, m, k, 1.0f);
                float *x = malloc(sizeof(float) * (size_t)(n * k)), *xr = malloc(sizeof(float) * (size_t)(n * k));
                float *wr = malloc(sizeof(float) * (size_t)(m * k));
                float *y = malloc(sizeof(float) * (size_t)(n * ldy)), *ref = malloc(sizeof(float) * (size_t)(n * m));
                uint16_t *xp = malloc(2 * (size_t)(GEMM_AMX_PAD(n) * GEMM_AMX_XLD(k)));
                uint32_t *wv = calloc((size_t)(GEMM_AMX_PAD(m) * GEMM_AMX_PAD(k) / 2), 4);
                for (int64_t i = 0; i < n * k; i++) {
                    x[i] = frand();
                    xr[i] = be_bf16_to_f32(be_f32_to_bf16(x[i]));
                }
                for (int64_t i = 0; i < m * k; i++) wr[i] = be_bf16_to_f32(be_f32_to_bf16(((float *)w.m.data)[i]));
                be_mat wm = {.data = wr, .dt = BE_F32, .rows = m, .cols = k};
                for (int64_t i = 0; i < n * ldy; i++) y[i] = NAN;
                be_ref_matmul(xr, n, &wm, NULL, ref);
                gemm_amx_pack_x(x, n, k, xp);
                gemm_amx_pack_rows(w.m.data, (int)m, k, wv);
                gemm_amx_block(xp, n, k, wv, (int)m, y, ldy);
                int guard = 1;   /* the columns past m are never written */
                for (int t = 0; t < n; t++) {
                    for (int64_t r = m; r < ldy; r++) guard &= isnan(y[t * ldy + r]);
                    memmove(y + t * m, y + t * ldy, sizeof(float) * (size_t)m);
                }
                double e = guard ? err_ratio(xr, n, &wm, NULL, y, ref) : INFINITY;
                if (!(e <= worst)) worst = e;
                free(x); free(xr); free(wr); free(y); free(ref); free(xp); free(wv); free(w.buf);
            }
    if (gemm_amx_available())
        CHECK(worst <= 1.0, "gemm-amx kernel n=1..70, m=1..70, k=1..257 (rounded x and rows): worst error %.3g of bound "
              "(infinite: a write past the rows)", worst);

    test_bf16_matmul();
    if (gemm_amx_available()) {   /* the same through the AVX-512 BF16 kernel */
        setenv("CINFER_ISA", "avx512vnni", 1);
        test_bf16_matmul();
        unsetenv("CINFER_ISA");
    }
}

/* the bf16 mode through cpu_matmul: whichever kernel this CPU (and CINFER_ISA) gives */
static void test_bf16_matmul(void) {
    const char *path = gemm_amx_available() ? "AMX" : gemm_bf16_available() ? "AVX-512 BF16" : "emulated";
    const be_ops *ops = be_cpu();
    be_ctx *c = NULL;
    if (ops->ctx_new(&c, 2) || !c) return;
    setenv("CINFER_BF16_ACT", "1", 1);
    int n = 77;
    int64_t m = 301, k = 515;
    tmat w = make_mat(BE_BF16, m, k, 1.0f), bias = make_mat(BE_F32, 1, m, 1.0f);
    float *x = malloc(sizeof(float) * (size_t)(n * k)), *xr = malloc(sizeof(float) * (size_t)(n * k));
    float *y = malloc(sizeof(float) * (size_t)(n * m)), *ref = malloc(sizeof(float) * (size_t)(n * m));
    for (int64_t i = 0; i < n * k; i++) { x[i] = frand(); xr[i] = be_bf16_to_f32(be_f32_to_bf16(x[i])); }
    be_ref_matmul(xr, n, &w.m, &bias.m, ref);
    ops->matmul(c, x, n, &w.m, &bias.m, y);
    double e = err_ratio(xr, n, &w.m, &bias.m, y, ref);
    CHECK(e <= 1.0, "cpu_matmul with CINFER_BF16_ACT=1 (bf16 x, n=77, +bias; %s): error %.3g of bound",
          path, e);
    /* MLX affine weights in the same mode: each row dequantized, rounded to bf16, then the same products
     * (the reference: that row from cpu_mat_row_f32, rounded, through be_ref_matmul) */
    static const int bits[] = {4, 8, 3};
    for (int bi = 0; bi < 3; bi++) {
        be_mat a = {0};
        int64_t ka = 512, ma = 37;
        size_t rb = aq_row_bytes(ka, bits[bi]), ng = (size_t)(ka / 64);
        uint8_t *codes = malloc(rb * (size_t)ma);
        uint16_t *sc = malloc(2 * ng * (size_t)ma), *bs = malloc(2 * ng * (size_t)ma);
        float *row = malloc(sizeof(float) * (size_t)ka), *wr = malloc(sizeof(float) * (size_t)(ma * ka));
        for (int64_t r = 0; r < ma; r++) {
            for (int64_t i = 0; i < ka; i++) row[i] = frand();
            aq_quantize_row(row, ka, bits[bi], 64, AQ_ROUND_GPU, BE_BF16, codes + (size_t)r * rb, sc + (size_t)r * ng, bs + (size_t)r * ng);
        }
        be_dtype_affine(bits[bi], &a.dt);
        a = (be_mat){.data = codes, .dt = a.dt, .rows = ma, .cols = ka, .scales = sc, .biases = bs, .sdt = BE_BF16, .group = 64};
        for (int64_t r = 0; r < ma; r++) {
            cpu_mat_row_f32(&a, r, wr + r * ka);
            for (int64_t i = 0; i < ka; i++) wr[r * ka + i] = be_bf16_to_f32(be_f32_to_bf16(wr[r * ka + i]));
        }
        be_mat wm = {.data = wr, .dt = BE_F32, .rows = ma, .cols = ka};
        int na = 45;
        float *xa = malloc(sizeof(float) * (size_t)(na * ka)), *xar = malloc(sizeof(float) * (size_t)(na * ka));
        float *ya = malloc(sizeof(float) * (size_t)(na * ma)), *refa = malloc(sizeof(float) * (size_t)(na * ma));
        for (int64_t i = 0; i < na * ka; i++) { xa[i] = frand(); xar[i] = be_bf16_to_f32(be_f32_to_bf16(xa[i])); }
        be_ref_matmul(xar, na, &wm, NULL, refa);
        ops->matmul(c, xa, na, &a, NULL, ya);
        double ea = err_ratio(xar, na, &wm, NULL, ya, refa);
        CHECK(ea <= 1.0, "cpu_matmul with CINFER_BF16_ACT=1 on %d-bit affine weights (rows dequantized and rounded to bf16, "
              "n=45; %s): error %.3g of bound", bits[bi], path, ea);
        /* who decides: the context's prefill_act, then CINFER_BF16_ACT, then auto (bf16 for affine weights
         * where the CPU has the dot products); each mode's result against its own reference (f32: the
         * unrounded x and rows), and the other reference missed, so the mode taken is the one named */
        float *ref32 = malloc(sizeof(float) * (size_t)(na * ma));
        be_ref_matmul(xa, na, &a, NULL, ref32);
        static const struct { int ctx_mode; const char *env; int bf16; const char *what; } modes[] = {
            {BE_ACT_AUTO, NULL, -1, "auto (env unset)"}, {BE_ACT_AUTO, "0", 0, "auto, CINFER_BF16_ACT=0"},
            {BE_ACT_F32, NULL, 0, "prefill_act f32"}, {BE_ACT_F32, "1", 0, "prefill_act f32 over CINFER_BF16_ACT=1"},
            {BE_ACT_BF16, "0", 1, "prefill_act bf16 over CINFER_BF16_ACT=0"}};
        for (size_t mi = 0; mi < sizeof modes / sizeof *modes; mi++) {
            int want = modes[mi].bf16 < 0 ? gemm_bf16_available() : modes[mi].bf16;
            if (modes[mi].env) setenv("CINFER_BF16_ACT", modes[mi].env, 1);
            else unsetenv("CINFER_BF16_ACT");
            ops->prefill_act(c, modes[mi].ctx_mode);
            for (int64_t i = 0; i < na * ma; i++) ya[i] = NAN;
            ops->matmul(c, xa, na, &a, NULL, ya);
            double eb = err_ratio(xar, na, &wm, NULL, ya, refa), ef = err_ratio(xa, na, &a, NULL, ya, ref32);
            CHECK(want ? eb <= 1.0 && ef > 1.0 : ef <= 1.0 && eb > 1.0,
                  "%d-bit affine, %s: the %s path (%s; error %.3g of the bf16 bound, %.3g of the f32 bound)", bits[bi],
                  modes[mi].what, want ? "bf16" : "f32", path, eb, ef);
        }
        ops->prefill_act(c, BE_ACT_AUTO);
        setenv("CINFER_BF16_ACT", "1", 1);
        free(ref32);
        free(codes); free(sc); free(bs); free(row); free(wr); free(xa); free(xar); free(ya); free(refa);
    }
    /* bf16 weights: auto keeps f32 (the bf16 mode is theirs only when asked for) */
    unsetenv("CINFER_BF16_ACT");
    for (int64_t i = 0; i < n * m; i++) y[i] = NAN;
    ops->matmul(c, x, n, &w.m, &bias.m, y);
    be_ref_matmul(x, n, &w.m, &bias.m, ref);
    e = err_ratio(x, n, &w.m, &bias.m, y, ref);
    CHECK(e <= 1.0, "cpu_matmul on bf16 weights, auto: f32 activations (%s CPU; error %.3g of bound)", path, e);
    free(x); free(xr); free(y); free(ref); free(w.buf); free(bias.buf);
    ops->ctx_free(c);
}

/* attention (AVX-512 where the CPU has it: blocks of 4 queries, one query with its heads as rows; else sgemm) vs
 * be_ref_attention over random paged layouts: GQA, padding, windows with and without sink tokens,
 * f32/f16/bf16 pools; again with CINFER_ISA=avx2 (sgemm throughout) */
static void test_attention_isa(int threads);
static void test_attention(int threads) {
    test_attention_isa(threads);
    if (gemm_amx_available()) {   /* one query's AVX-512 scores, as on a CPU without AMX */
        setenv("CINFER_ISA", "avx512", 1);
        test_attention_isa(threads);
        unsetenv("CINFER_ISA");
    }
    if (att_avx512_available()) {
        setenv("CINFER_ISA", "avx2", 1);
        test_attention_isa(threads);
        unsetenv("CINFER_ISA");
    }
}

static void test_attention_isa(int threads) {
    const char *path = !att_avx512_available() ? "sgemm" : gemm_amx_available() ? "AVX-512 query blocks, scores and prefill p.V on AMX"
                                                                               : "AVX-512 query blocks";
    const be_ops *ops = be_cpu();
    be_ctx *c = NULL;
    if (ops->ctx_new(&c, threads) || !c) return;
    static const struct { int B, L, nh, nkv, hd, win, keep, p0, p1, len1, page; float cap; } cs[] = {
        { 1, 1, 8, 2, 64, 0, 0, 0, 0, 1, 16, 0 },       /* first decode step */
        { 2, 1, 8, 2, 64, 0, 0, 37, 5, 1, 4, 0 },       /* batched decode */
        { 1, 9, 4, 4, 40, 0, 0, 0, 0, 9, 128, 0 },      /* MHA prefill, odd hd */
        { 2, 7, 8, 2, 64, 0, 0, 3, 0, 4, 2, 0 },        /* second row padded */
        { 1, 300, 8, 1, 32, 0, 0, 0, 0, 300, 64, 0 },   /* MQA, several query blocks */
        { 2, 140, 6, 2, 16, 5, 0, 10, 0, 133, 8, 0 },   /* sliding window */
        { 1, 3, 4, 2, 64, 2, 0, 50, 0, 3, 1, 0 },       /* window, continuing row, 1-slot pages */
        { 2, 40, 4, 2, 32, 16, 4, 60, 90, 1, 4, 0 },    /* rotating window with 4 sinks, run0 > keep */
        { 2, 1, 4, 2, 32, 16, 4, 200, 17, 1, 8, 0 },    /* its decode step */
        { 1, 1, 32, 4, 64, 0, 0, 700, 0, 1, 128, 0 },   /* decode over pages of 128 (TinyLlama's group of 8; 16-key tails) */
        { 2, 1, 16, 2, 128, 0, 0, 300, 45, 1, 16, 0 },  /* batched decode, head_dim 128 */
        { 1, 1, 8, 2, 64, 0, 0, 90, 0, 1, 32, 0.5f }, /* softcapped decode */
        { 1, 1, 10, 1, 64, 0, 0, 50, 0, 1, 16, 0 },     /* 10 heads a kv head (AMX's scores take 8 at most) */
    };
    for (int d = 0; d < 3; d++) {
        be_dtype kv = (be_dtype)d;
        double worst = 0;
        int ok = 1;
        for (size_t ci = 0; ci < sizeof cs / sizeof *cs; ci++) {
            int pos0[2] = { cs[ci].p0, cs[ci].p1 }, len[2] = { cs[ci].L, cs[ci].len1 };
            if (cs[ci].B == 1) len[0] = cs[ci].len1;
            be_attn a = { .B = cs[ci].B, .L = cs[ci].L, .n_head = cs[ci].nh, .n_kv_head = cs[ci].nkv,
                          .head_dim = cs[ci].hd, .pos0 = pos0, .len = len, .scale = 1.0f / sqrtf((float)cs[ci].hd),
                          .softcap = cs[ci].cap };
            paged_layout pl;
            uint64_t seed = 1234 + ci;
            paged_run0(&pl, &a, cs[ci].win, cs[ci].keep);
            paged_new(&pl, &a, cs[ci].page, &seed, NULL, NULL);
            int np = pl.n_pages;
            size_t nq = (size_t)a.B * a.L * a.n_head * a.head_dim;
            size_t nk = (size_t)np * a.n_kv_head * a.page * a.head_dim;
            float *q = malloc(nq * sizeof(float)), *o = malloc(nq * sizeof(float));
            float *ref = malloc(nq * sizeof(float));
            void *k = malloc(nk * 4), *v = malloc(nk * 4);
            for (size_t i = 0; i < nq; i++) { q[i] = 2 * frand(); o[i] = NAN; }
            for (size_t i = 0; i < nk; i++) {
                be_kv_put(k, kv, i, frand());
                be_kv_put(v, kv, i, frand());
            }
            be_ref_attention(&a, q, k, v, kv, ref);
            if (cpu_attention_gemm(c, &a, q, k, v, kv, o)) ok = 0;
            for (size_t i = 0; i < nq; i++) {
                double e = fabs((double)o[i] - ref[i]) / 1e-5;
                if (!(e <= worst)) worst = e;
            }
            free(q); free(o); free(ref); free(k); free(v);
            paged_free(&pl);
        }
        CHECK(ok && worst <= 1.0, "attention (%s), paged %s pools, %d threads: worst |err| %.3g x 1e-5",
              path, be_dtype_name(kv), threads, worst);
    }
    ops->ctx_free(c);
}

/* quantized-KV attention (cpu_kvq_attention through the backend table) against be_ref_kvq_attention,
 * both kernels: bits 2..8, groups 32/64/128, f32/f16/bf16 scales, GQA with 1..10 query heads per kv
 * head (pad lanes, two head blocks), padding, windows with sinks, spans over BE_KVQ_TILE (tiles,
 * key blocks merged across threads). Every slot of the pool holds a quantized random row; the pages
 * no query may read have NaN scales, so a read outside the mask poisons the output; guard words
 * around the output catch writes outside it. Bound: |out - ref| <= 1e-5 (outputs are convex
 * combinations of values of magnitude <= 1; measured worst about 1e-6). */
#define KVQ_GUARD 16
static void test_kvq_attention(int threads) {
    const be_ops *ops = be_cpu();
    be_ctx *c = NULL;
    if (ops->ctx_new(&c, threads) || !c) return;
    static const struct { int B, L, nh, nkv, hd, win, keep, p0, p1, len1, page; } cs[] = {
        { 1, 1, 32, 4, 64, 0, 0, 1500, 0, 1, 128 },  /* TinyLlama decode, span over 2 tiles */
        { 1, 1, 8, 1, 64, 0, 0, 1300, 0, 1, 64 },     /* MQA decode: the keys split into blocks */
        { 2, 1, 8, 2, 128, 0, 0, 37, 700, 1, 16 },    /* batched decode, hd 128 */
        { 1, 9, 4, 4, 128, 0, 0, 0, 0, 9, 128 },      /* MHA prefill */
        { 2, 7, 12, 2, 64, 0, 0, 3, 0, 4, 2 },        /* 6 heads per kv head, second row padded */
        { 1, 3, 20, 2, 32, 0, 0, 520, 0, 3, 8 },      /* 10 heads per kv head: two head blocks */
        { 2, 40, 6, 2, 64, 5, 0, 10, 0, 33, 8 },      /* sliding window */
        { 2, 40, 4, 2, 32, 16, 4, 60, 90, 1, 4 },     /* rotating window with 4 sinks, run0 > keep */
        { 2, 1, 4, 2, 64, 600, 4, 1400, 17, 1, 8 },   /* window with sinks, its run over a tile edge */
    };
    static const int bits_all[] = { 2, 3, 4, 5, 6, 8 }, groups[] = { 32, 64, 128 };
    double worst[2] = { 0, 0 };
    int ok = 1, runs = 0;
    for (size_t ci = 0; ci < sizeof cs / sizeof *cs; ci++)
        for (int bi = 0; bi < 6; bi++)
            for (int gi = 0; gi < 3; gi++) {
                int bits = bits_all[bi], G = groups[gi], hd = cs[ci].hd;
                if (hd % G) continue;
                be_dtype sdt = (be_dtype)((ci + bi + gi) % 3);   /* f32, f16, bf16 in turn */
                int pos0[2] = { cs[ci].p0, cs[ci].p1 }, len[2] = { cs[ci].L, cs[ci].len1 };
                if (cs[ci].B == 1) len[0] = cs[ci].len1;
                be_attn a = { .B = cs[ci].B, .L = cs[ci].L, .n_head = cs[ci].nh, .n_kv_head = cs[ci].nkv,
                              .head_dim = hd, .pos0 = pos0, .len = len, .scale = 1.0f / sqrtf((float)hd) };
                paged_layout pl;
                uint64_t seed = 777 + ci * 31 + bi * 7 + gi;
                paged_run0(&pl, &a, cs[ci].win, cs[ci].keep);
                paged_new(&pl, &a, cs[ci].page, &seed, NULL, NULL);
                size_t slots = (size_t)pl.n_pages * a.n_kv_head * a.page, rb = aq_row_bytes(hd, bits);
                size_t ng = (size_t)(hd / G), es = be_dtype_size(sdt);
                be_kvq pk = { malloc(slots * rb), malloc(slots * ng * es), malloc(slots * ng * es), bits, G, sdt };
                be_kvq pv = { malloc(slots * rb), malloc(slots * ng * es), malloc(slots * ng * es), bits, G, sdt };
                float *row = malloc(sizeof(float) * hd);
                for (size_t sl = 0; sl < slots; sl++)
                    for (int kv = 0; kv < 2; kv++) {
                        be_kvq *p = kv ? &pv : &pk;
                        for (int d = 0; d < hd; d++) row[d] = frand();
                        aq_quantize_row(row, hd, bits, G, AQ_ROUND_GPU, sdt, (uint8_t *)p->codes + sl * rb,
                                        (char *)p->scales + sl * ng * es, (char *)p->biases + sl * ng * es);
                    }
                char *held = calloc((size_t)pl.n_pages, 1);
                for (int e = 0; e < (a.B + 2) * a.n_pt; e++) if (pl.pt[e] >= 0) held[pl.pt[e]] = 1;
                for (size_t sl = 0; sl < slots; sl++)
                    if (!held[sl / ((size_t)a.n_kv_head * a.page)])
                        for (size_t g = 0; g < ng; g++) {
                            be_kv_put(pk.scales, sdt, sl * ng + g, NAN);
                            be_kv_put(pv.scales, sdt, sl * ng + g, NAN);
                        }
                size_t nq = (size_t)a.B * a.L * a.n_head * hd;
                float *q = malloc(nq * sizeof(float)), *ref = malloc(nq * sizeof(float));
                float *ob = malloc((nq + 2 * KVQ_GUARD) * sizeof(float)), *o = ob + KVQ_GUARD;
                for (size_t i = 0; i < nq; i++) q[i] = 2 * frand();
                for (int kern = 0; kern < 2; kern++) {
                    for (size_t i = 0; i < nq + 2 * KVQ_GUARD; i++) ob[i] = -7.0f;
                    be_ref_kvq_attention(&a, q, &pk, &pv, kern, ref);
                    ops->kvq_attention(c, &a, q, &pk, &pv, kern, o);
                    runs++;
                    for (int g = 0; g < KVQ_GUARD; g++)
                        if (ob[g] != -7.0f || o[nq + g] != -7.0f) ok = 0;
                    for (size_t i = 0; i < nq; i++) {
                        double e = fabs((double)o[i] - ref[i]);
                        if (!(e <= worst[kern])) worst[kern] = e;
                    }
                }
                free(q); free(ref); free(ob); free(row); free(held);
                free(pk.codes); free(pk.scales); free(pk.biases); free(pv.codes); free(pv.scales); free(pv.biases);
                paged_free(&pl);
            }
    CHECK(ok && worst[0] <= 1e-5, "kvq_attention (unfused), %d threads, %d layouts x bits x groups: worst |err| %.3g "
          "(bound 1e-5), guards %s", threads, runs / 2, worst[0], ok ? "intact" : "WRITTEN");
    CHECK(ok && worst[1] <= 1e-5, "kvq_attention (tiled), %d threads: worst |err| %.3g (bound 1e-5)", threads, worst[1]);
    ops->ctx_free(c);
}

/* the pool: each (ith, nth) exactly once per run, over many back-to-back runs */
typedef struct { atomic_int hits[8]; int nth_seen[8]; } pool_probe;
static void probe_task(void *arg, int ith, int nth) {
    pool_probe *p = arg;
    atomic_fetch_add(&p->hits[ith], 1);
    p->nth_seen[ith] = nth;
}

static void test_pool(int n) {
    cpu_pool *p = cpu_pool_new(n);
    CHECK(p && cpu_pool_size(p) == n, "pool of %d", n);
    if (!p) return;
    pool_probe pr;
    for (int i = 0; i < 8; i++) { atomic_init(&pr.hits[i], 0); pr.nth_seen[i] = 0; }
    const int runs = n <= 2 ? 20000 : 2000;   /* n > 2 oversubscribes a 2-core machine */
    for (int r = 0; r < runs; r++) cpu_pool_run(p, probe_task, &pr);
    int ok = 1;
    for (int i = 0; i < 8; i++) {
        int h = atomic_load(&pr.hits[i]);
        if (i < n ? (h != runs || pr.nth_seen[i] != n) : h != 0) ok = 0;
    }
    CHECK(ok, "pool of %d: every worker ran exactly once in each of %d runs", n, runs);
    cpu_pool_free(p);
}

int main(void) {
    test_kernel_sets();
    for (int t = 1; t <= 3; t++) test_matmul(t);
    for (int t = 1; t <= 2; t++) test_matmul_multi(t);
    for (int t = 1; t <= 2; t++) test_attention(t);
    for (int t = 1; t <= 2; t++) test_kvq_attention(t);
    test_gemm_bf16();
    for (int n = 1; n <= 4; n++) test_pool(n);
    cpu_pool_free(NULL);
    return CHECK_DONE();
}
