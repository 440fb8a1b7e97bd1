/*
 * test-quant.c — MLX affine quantization (src/quant/affine.c) and the CPU
 * kernels for quantized weights (src/backend/cpu/gemv-affine.c).
 *
 *  1. aq_quantize_row with the CPU rule reproduces every triple MLX 0.32.1's
 *     CPU quantizer wrote (../shared/reference/mlx/quantize: packed codes,
 *     scales, biases) bit for bit, and aq_dequant_row_mlx reproduces its
 *     mx.dequantize output bit for bit;
 *  2. the GPU rule matches the NumPy port of MLX's Metal/CUDA quantizer
 *     (tests/reference/make_quant_fixtures.py, run on the GPU machine) on
 *     the same matrices, bit for bit;
 *  3. packing round-trips every code of every width (2/3/4/5/6/8);
 *  4. every kernel set (scalar, avx2) x bits x group size x scale dtype x
 *     n = 1..8 tokens against be_ref_matmul (double accumulation of the
 *     dequantized weights), with guard words around the output; the row
 *     converters exact against aq_dequant_row; the backend's matmul for
 *     large n (dequantized tiles into sgemm) and matmul_multi.
 * Bound: |y - ref| <= 1e-5 * sum_i |x_i w_i| + 1e-6, as test-cpu-kernels.
 */
#include <stdint.h>
#include "backend/cpu/cpu.h"
#include "backend/cpu/gemv.h"
#include "check.h"
#include "io/npy.h"
#include "io/safetensors.h"
#include "quant/affine.h"

static uint64_t rng = 0x2545F4914F6CDD1Dull;
static float frand(void) {
    rng ^= rng << 13; rng ^= rng >> 7; rng ^= rng << 17;
    return (float)((rng >> 40) * (1.0 / 8388608.0)) - 1.0f;
}

/* a quantized matrix built by aq_quantize_row */
typedef struct { be_mat m; uint8_t *q; void *s, *b; } qmat;

static qmat make_q(int64_t rows, int64_t cols, int bits, int group, be_dtype sdt, const float *src) {
    qmat t;
    size_t rb = aq_row_bytes(cols, bits), ng = (size_t)(cols / group), es = be_dtype_size(sdt);
    t.q = malloc(rb * (size_t)rows + 1);
    t.s = malloc(ng * (size_t)rows * es + 1);
    t.b = malloc(ng * (size_t)rows * es + 1);
    float *w = malloc(sizeof(float) * (size_t)cols);
    for (int64_t r = 0; r < rows; r++) {
        for (int64_t i = 0; i < cols; i++) w[i] = src ? src[r * cols + i] : frand() * (r % 3 ? 1.0f : 0.05f);
        aq_quantize_row(w, cols, bits, group, AQ_ROUND_CPU, sdt, t.q + (size_t)r * rb, (char *)t.s + (size_t)r * ng * es,
                        (char *)t.b + (size_t)r * ng * es);
    }
    free(w);
    be_dtype dt;
    be_dtype_affine(bits, &dt);
    t.m = (be_mat){ .data = t.q, .dt = dt, .rows = rows, .cols = cols, .scales = t.s, .biases = t.b, .sdt = sdt, .group = group };
    return t;
}
static void free_q(qmat *t) { free(t->q); free(t->s); free(t->b); }

static char *ref_path(const char *name) {
    static char p[1024];
    snprintf(p, sizeof p, "%s/reference/mlx/quantize/%s", shared_dir(), name);
    return p;
}

/* the triple of one case computed by rule r against the files prefix_{wq,scales,biases,dequant}.npy */
static void check_triple(const char *dir, const char *prefix, const float *w, int64_t rows, int64_t cols, int bits, int group,
                         be_dtype sdt, aq_rounding r) {
    char p[1100], err[256];
    uint32_t *wq = NULL;
    float *sc = NULL, *bi = NULL, *dq = NULL;
    int nd;
    int64_t sh[4];
    snprintf(p, sizeof p, "%s/%s_wq.npy", dir, prefix);
    int ok = npy_read_u32(p, &wq, &nd, sh, err, sizeof err) == CINFER_OK && nd == 2 && sh[0] == rows && sh[1] == cols * bits / 32;
    snprintf(p, sizeof p, "%s/%s_scales.npy", dir, prefix);
    ok = ok && npy_read_f32(p, &sc, &nd, sh, err, sizeof err) == CINFER_OK && sh[1] == cols / group;
    snprintf(p, sizeof p, "%s/%s_biases.npy", dir, prefix);
    ok = ok && npy_read_f32(p, &bi, &nd, sh, err, sizeof err) == CINFER_OK && sh[1] == cols / group;
    snprintf(p, sizeof p, "%s/%s_dequant.npy", dir, prefix);
    int have_dq = npy_read_f32(p, &dq, &nd, sh, err, sizeof err) == CINFER_OK;
    CHECK(ok, "%s: reference triple read (%s)", prefix, ok ? "ok" : err);
    if (ok) {
        qmat q = make_q(rows, cols, bits, group, sdt, NULL);
        size_t rb = aq_row_bytes(cols, bits), ng = (size_t)(cols / group), es = be_dtype_size(sdt);
        for (int64_t i = 0; i < rows; i++)
            aq_quantize_row(w + i * cols, cols, bits, group, r, sdt, q.q + (size_t)i * rb, (char *)q.s + (size_t)i * ng * es,
                            (char *)q.b + (size_t)i * ng * es);
        long bad_codes = 0, bad_sb = 0, bad_dq = 0;
        for (int64_t i = 0; i < rows; i++)
            for (int64_t c = 0; c < cols; c++)
                bad_codes += aq_code(q.q + i * rb, c, bits) != aq_code((const uint8_t *)(wq + i * (cols * bits / 32)), c, bits);
        bad_codes += memcmp(q.q, wq, rb * (size_t)rows) != 0 && !bad_codes;   /* the bytes too (padding bits) */
        for (size_t i = 0; i < ng * (size_t)rows; i++) {
            bad_sb += be_kv_get(q.s, sdt, i) != sc[i] || be_kv_get(q.b, sdt, i) != bi[i];
        }
        CHECK(bad_codes == 0 && bad_sb == 0, "%s (%s rule): packed codes and scales/biases bit for bit (%ld codes, %ld groups differ)",
              prefix, r == AQ_ROUND_CPU ? "cpu" : "gpu", bad_codes, bad_sb);
        if (have_dq) {
            float *row = malloc(sizeof(float) * (size_t)cols);
            for (int64_t i = 0; i < rows; i++) {
                aq_dequant_row_mlx(q.q + i * rb, (char *)q.s + i * ng * es, (char *)q.b + i * ng * es, sdt, bits, group, cols, row);
                for (int64_t c = 0; c < cols; c++) bad_dq += row[c] != dq[i * cols + c];
            }
            free(row);
            CHECK(bad_dq == 0, "%s: dequantize equals mx.dequantize bit for bit (%ld values differ)", prefix, bad_dq);
        }
        free_q(&q);
    }
    free(wq); free(sc); free(bi); free(dq);
}

static float *prose_down(void) {
    char d[1024], err[256];
    snprintf(d, sizeof d, "%s/models/prose-13m", shared_dir());
    st_set st = {0};
    float *w = NULL;
    if (st_open_dir(d, &st, err, sizeof err) == CINFER_OK) {
        const st_tensor *t = st_find(&st, "model.layers.0.mlp.down_proj.weight");
        if (t && !strcmp(t->dtype, "BF16") && t->shape[0] == 256 && t->shape[1] == 768) {
            w = malloc(sizeof(float) * 256 * 768);
            for (size_t i = 0; i < 256 * 768; i++) w[i] = be_bf16_to_f32(((const uint16_t *)t->data)[i]);
        }
    }
    st_close(&st);
    CHECK(w != NULL, "prose-13m model.layers.0.mlp.down_proj.weight read");
    return w;
}

static void test_mlx_reference(void) {
    char dir[1024], err[256];
    snprintf(dir, sizeof dir, "%s/reference/mlx/quantize", shared_dir());
    float *prose = prose_down(), *synth = NULL;
    int nd;
    int64_t sh[4];
    CHECK(npy_read_f32(ref_path("synth_w.npy"), &synth, &nd, sh, err, sizeof err) == CINFER_OK && sh[0] == 64 && sh[1] == 512,
          "synth_w.npy read");
    if (prose) {
        check_triple(dir, "prose_b3_g32", prose, 256, 768, 3, 32, BE_BF16, AQ_ROUND_CPU);
        check_triple(dir, "prose_b4_g64", prose, 256, 768, 4, 64, BE_BF16, AQ_ROUND_CPU);
    }
    if (synth) {
        check_triple(dir, "synth_b4_g64", synth, 64, 512, 4, 64, BE_F32, AQ_ROUND_CPU);
        check_triple(dir, "synth_b6_g128", synth, 64, 512, 6, 128, BE_F32, AQ_ROUND_CPU);
    }
    /* the GPU rule against the NumPy port of the Metal kernel (fixtures from the GPU machine) */
    static const struct { const char *p; int bits, group, prose; } gpu[] = {
        {"prose_b3_g32", 3, 32, 1}, {"prose_b4_g64", 4, 64, 1}, {"prose_b2_g64", 2, 64, 1}, {"prose_b5_g32", 5, 32, 1},
        {"prose_b6_g64", 6, 64, 1}, {"prose_b8_g128", 8, 128, 1}, {"synth_b4_g64", 4, 64, 0}, {"synth_b6_g128", 6, 128, 0},
        {"synth_b2_g32", 2, 32, 0}, {"synth_b3_g64", 3, 64, 0}, {"synth_b5_g128", 5, 128, 0}, {"synth_b8_g32", 8, 32, 0},
    };
    for (size_t i = 0; i < sizeof gpu / sizeof *gpu; i++) {
        const float *w = gpu[i].prose ? prose : synth;
        if (!w) continue;
        check_triple("tests/fixtures/quant/gpu", gpu[i].p, w, gpu[i].prose ? 256 : 64, gpu[i].prose ? 768 : 512, gpu[i].bits,
                     gpu[i].group, gpu[i].prose ? BE_BF16 : BE_F32, AQ_ROUND_GPU);
    }
    free(prose);
    free(synth);
}

static void test_packing(void) {
    static const int bitsv[] = {2, 3, 4, 5, 6, 8};
    for (int bi = 0; bi < 6; bi++) {
        int b = bitsv[bi], ok = 1;
        uint8_t row[1 + 256 * 8 / 8 + 1];
        uint32_t codes[256];
        memset(row, 0xA5, sizeof row);
        for (int k = 0; k < 256; k++) {
            codes[k] = (uint32_t)(frand() * 1000 + 1000) & ((1u << b) - 1);
            aq_put_code(row + 1, k, b, codes[k]);
        }
        for (int k = 0; k < 256; k++) ok &= aq_code(row + 1, k, b) == codes[k];
        ok &= row[0] == 0xA5 && row[1 + aq_row_bytes(256, b)] == 0xA5;
        /* MLX's layout: 2/4/8 bits = first code in the low bits of each uint32; 3 bits = 8 codes in 3 bytes */
        if (b == 4) ok &= (uint32_t)(row[1] & 15) == codes[0] && (uint32_t)(row[1] >> 4) == codes[1];
        if (b == 3) ok &= (uint32_t)((row[1] >> 6) | ((row[2] & 1) << 2)) == codes[2];
        if (b == 6) ok &= (uint32_t)((row[1] >> 6) | ((row[2] & 15) << 2)) == codes[1];
        CHECK(ok, "%d-bit codes pack LSB-first and read back, neighbours untouched", b);
    }
}

#define GUARD 16
static void test_kernels(void) {
    static const char *isas[] = {"scalar", "avx2", "avx512", "avx512vnni"};
    static const int bitsv[] = {2, 3, 4, 5, 6, 8};
    static const be_dtype sdts[] = {BE_BF16, BE_F16, BE_F32};
    static const int64_t ms[] = {1, 5, 13};
    for (int s = 0; s < 4; s++) {
        const gemv_kernels *g = gemv_isa(isas[s]);
        if (!g) { printf("# %s kernels: not on this CPU, skipped\n", isas[s]); continue; }
        for (int bi = 0; bi < 6; bi++) {
            double worst = 0;
            int exact = 1, guards = 1;
            /* (group, k): 3 groups of 32 or 64 (k % 128 != 0: the vnni kernel's fallback), 2 of 128, 4 of 32, 4 of 64 */
            static const int gk[5][2] = {{32, 96}, {64, 192}, {128, 256}, {32, 128}, {64, 256}};
            for (int gi = 0; gi < 5; gi++)
                for (int si = 0; si < 3; si++)
                    for (int mi = 0; mi < 3; mi++) {
                        int64_t k = gk[gi][1], m = ms[mi];
                        const int grp = gk[gi][0];
                        qmat q = make_q(m, k, bitsv[bi], grp, sdts[si], NULL);
                        float *x = malloc(sizeof(float) * 8 * (size_t)k), *yb = malloc(sizeof(float) * (8 * (size_t)m + 2 * GUARD));
                        float *y = yb + GUARD, *ref = malloc(sizeof(float) * 8 * (size_t)m), *xp = malloc(sizeof(float) * 8 * (size_t)k);
                        for (int64_t i = 0; i < 8 * k; i++) x[i] = frand();
                        if (si == 1) x[k / 3] *= 1000.0f;   /* an outlier: the vnni kernel's blocks of 8 scale to their largest */
                        for (int n = 1; n <= 8; n++) {
                            for (int i = 0; i < 8 * (int)m + 2 * GUARD; i++) yb[i] = -7777.0f;
                            be_ref_matmul(x, n, &q.m, NULL, ref);
                            const float *xk = x;   /* the kernel's own form of x where it wants one (gemv.h's prep_x) */
                            if (g->prep_x[q.m.dt]) { g->prep_x[q.m.dt](x, n, k, xp); xk = xp; }
                            g->gemv[q.m.dt](xk, n, &q.m, 0, m / 2, y, m);
                            g->gemv[q.m.dt](xk, n, &q.m, m / 2, m, y, m);
                            for (int i = 0; i < GUARD; i++) guards &= yb[i] == -7777.0f && y[n * m + i] == -7777.0f;
                            for (int t = 0; t < n; t++)
                                for (int64_t r = 0; r < m; r++) {
                                    /* the magnitudes the association sums: |x| (|s q| + |b|) (an outlier's s*q*x and
                                     * b*x can cancel to a small x*w, their rounding does not) */
                                    double mag = 0;
                                    for (int64_t i = 0; i < k; i++) {
                                        size_t gsb = (size_t)(r * (k / grp) + i / grp);
                                        double sq = be_kv_get(q.s, sdts[si], gsb) * (double)aq_code(q.q + (size_t)r * aq_row_bytes(k, bitsv[bi]), i, bitsv[bi]);
                                        mag += fabs((double)x[t * k + i]) * (fabs(sq) + fabs((double)be_kv_get(q.b, sdts[si], gsb)));
                                    }
                                    double e = fabs((double)y[t * m + r] - ref[t * m + r]) / (1e-5 * mag + 1e-6);
                                    if (!(e <= worst)) worst = e;
                                }
                        }
                        float *rows = malloc(sizeof(float) * (size_t)(m * k + 1)), *want = malloc(sizeof(float) * (size_t)k);
                        rows[(m - 1) * k] = 12345.f;
                        g->rows_f32[q.m.dt](&q.m, 1, m, rows);
                        for (int64_t r = 1; r < m; r++)
                            for (int64_t i = 0; i < k; i++) exact &= rows[(r - 1) * k + i] == be_mat_get(&q.m, r, i);
                        exact &= rows[(m - 1) * k] == 12345.f;
                        free(rows); free(want); free(x); free(xp); free(yb); free(ref); free_q(&q);
                    }
            CHECK(worst <= 1.0 && guards, "%s gemv q%d (g32/64/128, bf16/f16/f32 scales, n=1..8): worst error %.3g of bound, guards %s",
                  isas[s], bitsv[bi], worst, guards ? "intact" : "OVERWRITTEN");
            CHECK(exact, "%s rows_f32 q%d equals the dequantized values exactly", isas[s], bitsv[bi]);
        }
    }
}

/* CINFER_INT8_ACT's kernels: against the same sum with x rounded as their prep did
 * (s * sum(q * d*xi) over each group + b * sum(x) with the exact x) */
static void test_int8_act(void) {
    const gemv_kernels *base = gemv_isa("avx2");
    if (!base) { printf("# avx2: not on this CPU, int8-activation kernels skipped\n"); return; }
    const gemv_kernels *g = gemv_int8_act(base);
    CHECK(g != base && g->prep_x[BE_Q4] && g->prep_x[BE_Q8] && !g->prep_x[BE_Q3] && g->gemv[BE_BF16] == base->gemv[BE_BF16],
          "int8-activation set replaces exactly the q4 and q8 entries (%s)", g->isa);
    static const int bitsv[] = {4, 8}, groups[] = {32, 64, 128};
    for (int bi = 0; bi < 2; bi++) {
        double worst = 0;
        int guards = 1;
        for (int gi = 0; gi < 3; gi++)
            for (int64_t m = 1; m <= 9; m += 4) {
                int64_t k = groups[gi] * 3;
                qmat q = make_q(m, k, bitsv[bi], groups[gi], BE_BF16, NULL);
                float *x = malloc(sizeof(float) * 3 * (size_t)k), *xp = malloc(sizeof(float) * 3 * (size_t)k);
                float *yb = malloc(sizeof(float) * (3 * (size_t)m + 2 * GUARD)), *y = yb + GUARD;
                for (int64_t i = 0; i < 3 * k; i++) x[i] = frand() * (i % 5 ? 1.0f : 3.0f);
                for (int n = 1; n <= 3; n++) {
                    for (int i = 0; i < 3 * (int)m + 2 * GUARD; i++) yb[i] = -7777.0f;
                    g->prep_x[q.m.dt](x, n, k, xp);
                    g->gemv[q.m.dt](xp, n, &q.m, 0, m / 2, y, m);
                    g->gemv[q.m.dt](xp, n, &q.m, m / 2, m, y, m);
                    for (int i = 0; i < GUARD; i++) guards &= yb[i] == -7777.0f && y[n * m + i] == -7777.0f;
                    for (int t = 0; t < n; t++) {
                        const int8_t *xq = (const int8_t *)(xp + (int64_t)t * k);
                        const float *d = (const float *)(xq + k);
                        for (int64_t r = 0; r < m; r++) {
                            double ref = 0, mag = 0;
                            for (int64_t i = 0; i < k; i++) {
                                int64_t b = i / 32, j = i % 32, pos = bitsv[bi] == 4 ? (j % 2 ? 16 + j / 2 : j / 2) : j;
                                double xr = (double)d[b] * xq[b * 32 + pos];
                                int64_t gi2 = r * (k / groups[gi]) + i / groups[gi];
                                double sv = be_kv_get(q.s, BE_BF16, (size_t)gi2), bv = be_kv_get(q.b, BE_BF16, (size_t)gi2);
                                double qc = aq_code(q.q + r * aq_row_bytes(k, bitsv[bi]), i, bitsv[bi]);
                                ref += sv * qc * xr + bv * x[t * k + i];
                                mag += fabs(sv * qc * xr) + fabs(bv * x[t * k + i]);
                            }
                            double e = fabs(y[t * m + r] - ref) / (1e-5 * mag + 1e-6);
                            if (!(e <= worst)) worst = e;
                        }
                    }
                }
                free(x); free(xp); free(yb); free_q(&q);
            }
        CHECK(worst <= 1.0 && guards, "int8-activation gemv q%d (g32/64/128, n=1..3) vs the sum on the rounded x: worst %.3g of bound, "
              "guards %s", bitsv[bi], worst, guards ? "intact" : "OVERWRITTEN");
    }
}

/* the backend table: GEMV (few tokens) and dequantized tiles into sgemm (many), multi, bias */
static void test_backend(void) {
    const be_ops *be = be_cpu();
    be_ctx *c = NULL;
    CHECK(be->ctx_new(&c, 2) == 0, "cpu backend starts");
    if (!c) return;
    be->prefill_act(c, BE_ACT_F32);   /* the f32 path's bound (the bf16 mode: test-cpu-kernels) */
    int64_t k = 256, m = 67;
    qmat a = make_q(m, k, 4, 64, BE_BF16, NULL), b = make_q(m, k, 3, 32, BE_F16, NULL);
    float *bias_v = malloc(sizeof(float) * (size_t)m);
    for (int64_t i = 0; i < m; i++) bias_v[i] = frand();
    be_mat bias = { .data = bias_v, .dt = BE_F32, .rows = 1, .cols = m };
    for (int pass = 0; pass < 2; pass++) {
        int n = pass ? 40 : 3;
        float *x = malloc(sizeof(float) * (size_t)(n * k)), *y = malloc(sizeof(float) * (size_t)(n * m)),
              *y2 = malloc(sizeof(float) * (size_t)(n * m)), *ref = malloc(sizeof(float) * (size_t)(n * m)),
              *ref2 = malloc(sizeof(float) * (size_t)(n * m));
        for (int64_t i = 0; i < n * k; i++) x[i] = frand();
        be->matmul(c, x, n, &a.m, &bias, y);
        be_ref_matmul(x, n, &a.m, &bias, ref);
        const be_mat *ws[2] = {&a.m, &b.m}, *bs[2] = {NULL, &bias};
        float *ys[2] = {y2, y};
        double worst = 0;
        for (int64_t i = 0; i < n * m; i++) {
            double e = fabs((double)y[i] - ref[i]) / (1e-4 * (fabs(ref[i]) + 1.0));
            if (e > worst) worst = e;
        }
        be->matmul_multi(c, x, n, 2, ws, bs, ys);
        be_ref_matmul(x, n, &b.m, &bias, ref2);
        be_ref_matmul(x, n, &a.m, NULL, ref);
        for (int64_t i = 0; i < n * m; i++) {
            double e = fabs((double)y2[i] - ref[i]) / (1e-4 * (fabs(ref[i]) + 1.0));
            double e2 = fabs((double)y[i] - ref2[i]) / (1e-4 * (fabs(ref2[i]) + 1.0));
            if (e > worst) worst = e;
            if (e2 > worst) worst = e2;
        }
        CHECK(worst <= 1.0, "backend matmul / matmul_multi with bias, n=%d (%s path): worst %.3g of bound", n,
              pass ? "dequantized tiles + sgemm" : "GEMV", worst);
        free(x); free(y); free(y2); free(ref); free(ref2);
    }
    free(bias_v);
    free_q(&a);
    free_q(&b);
    be->ctx_free(c);
}

int main(void) {
    test_packing();
    test_mlx_reference();
    test_kernels();
    test_int8_act();
    test_backend();
    return CHECK_DONE();
}
