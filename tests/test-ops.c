/*
 * test-ops.c — the CPU backend's ops (except matmul, see test-cpu-kernels.c)
 * against their scalar references in cpu/ref.c on random inputs: RMSNorm,
 * RoPE (rotate-half and interleaved, partial), SwiGLU, add (small, and large
 * enough to run over the pool), and attention over
 * f32/f16 caches with GQA, sliding windows, several rows with their own
 * start positions and right padding. Also the f16/bf16 conversions.
 */
#include "check.h"
#include "paged.h"
#include "backend/cpu/cpu.h"

static uint64_t rng = 88172645463325252ull;
static float frand(void) {
    rng ^= rng << 13; rng ^= rng >> 7; rng ^= rng << 17;
    return (float)((rng >> 11) * (1.0 / 9007199254740992.0)) * 2.0f - 1.0f;
}
static void fill(float *x, size_t n, float scale) { for (size_t i = 0; i < n; i++) x[i] = frand() * scale; }
static double maxdiff(const float *a, const float *b, size_t n) {
    double m = 0;
    for (size_t i = 0; i < n; i++) { double d = fabs((double)a[i] - b[i]); if (!(d <= m)) m = d; }
    return m;
}

/* kv_write then attention over a random paged layout: every row's history
 * before pos0 is random, the new keys come through kv_write; the fast op
 * (scalar loop or sgemm) against be_ref_attention, and kv_write against
 * be_ref_kv_write byte for byte */
/* softcap (Gemma 2's attention): the cases with a window use one, on scores scaled x8 so
 * that it bites */
static void test_attention(const be_ops *be, be_ctx *c, int B, int L, int nh, int nkv, int hd, int window, int keep,
                           int page, be_dtype dt) {
    int pos0[4] = {0, 5, 2, 9}, len[4] = {L, L - 2 > 0 ? L - 2 : 1, 1, L};
    float cap = window && !keep ? 5.0f : 0.0f;
    be_attn a = {.B = B, .L = L, .n_head = nh, .n_kv_head = nkv, .head_dim = hd, .pos0 = pos0, .len = len,
                 .scale = (cap > 0 ? 8.0f : 1.0f) / sqrtf((float)hd), .softcap = cap};
    paged_layout pl;
    uint64_t seed = 99 + (uint64_t)L * 7 + page;
    paged_run0(&pl, &a, window, keep);
    paged_new(&pl, &a, page, &seed, NULL, NULL);
    int np = pl.n_pages;
    size_t pool_n = (size_t)np * nkv * page * hd, qn = (size_t)B * L * nh * hd, kn = (size_t)B * L * nkv * hd;
    size_t el = be_dtype_size(dt);
    void *k = malloc(pool_n * el), *v = malloc(pool_n * el), *k2 = malloc(pool_n * el), *v2 = malloc(pool_n * el);
    float *q = malloc(qn * 4), *kk = malloc(kn * 4), *vv = malloc(kn * 4), *o1 = malloc(qn * 4), *o2 = malloc(qn * 4);
    for (size_t i = 0; i < pool_n; i++) be_kv_put(k, dt, i, frand()), be_kv_put(v, dt, i, frand());
    memcpy(k2, k, pool_n * el);
    memcpy(v2, v, pool_n * el);
    fill(q, qn, 1.0f);
    fill(kk, kn, 1.0f);
    fill(vv, kn, 1.0f);
    be->kv_write(c, &a, kk, k, dt);
    be->kv_write(c, &a, vv, v, dt);
    be_ref_kv_write(&a, kk, k2, dt);
    be_ref_kv_write(&a, vv, v2, dt);
    CHECK(!memcmp(k, k2, pool_n * el) && !memcmp(v, v2, pool_n * el), "kv_write B=%d L=%d page %d %s equals the reference",
          B, L, page, be_dtype_name(dt));
    for (size_t i = 0; i < qn; i++) o1[i] = 12345.0f;   /* sentinel: padded rows must be zeroed */
    be->attention(c, &a, q, k, v, dt, o1);
    be_ref_attention(&a, q, k, v, dt, o2);
    double d = maxdiff(o1, o2, qn);
    CHECK(d < 1e-5, "attention B=%d L=%d heads %d/%d hd %d window %d keep %d softcap %g page %d %s: max diff %.2e", B, L, nh,
          nkv, hd, window, keep, cap, page, be_dtype_name(dt), d);
    free(k); free(v); free(k2); free(v2); free(q); free(kk); free(vv); free(o1); free(o2);
    paged_free(&pl);
}

int main(void) {
    const be_ops *be = be_cpu();
    be_ctx *c = NULL;
    CHECK(be->ctx_new(&c, 2) == 0, "cpu backend starts with 2 threads");
    if (!c) return CHECK_DONE();

    /* conversions round to nearest even and keep specials */
    CHECK(be_f16_to_f32(be_f32_to_f16(1.0f)) == 1.0f && be_f16_to_f32(be_f32_to_f16(65504.0f)) == 65504.0f &&
          isinf(be_f16_to_f32(be_f32_to_f16(1e6f))) && be_f16_to_f32(be_f32_to_f16(5.96e-8f)) > 0,
          "f16 conversions: 1, max, overflow to inf, smallest subnormal");
    CHECK(be_bf16_to_f32(be_f32_to_bf16(1.00390625f)) == 1.0f && be_bf16_to_f32(be_f32_to_bf16(1.01171875f)) == 1.015625f,
          "bf16 conversion rounds half to even");
    int worst = 0;
    for (uint32_t h = 0; h < 0x7c00; h++) worst |= be_f32_to_f16(be_f16_to_f32((uint16_t)h)) != h;
    CHECK(!worst, "every finite f16 survives f16 -> f32 -> f16");

    /* rmsnorm with weights of each dtype, and weightless */
    enum { N = 7, D = 96 };
    float x[N * D], y1[N * D], y2[N * D], wf[D];
    uint16_t wb[D];
    fill(x, N * D, 3.0f);
    fill(wf, D, 1.0f);
    for (int i = 0; i < D; i++) wb[i] = be_f32_to_bf16(wf[i]);
    be_mat w32 = {.data = wf, .dt = BE_F32, .rows = 1, .cols = D}, w16 = {.data = wb, .dt = BE_BF16, .rows = 1, .cols = D};
    be->rmsnorm(c, x, N, D, &w32, 0.0f, 1e-5f, y1);
    be_ref_rmsnorm(x, N, D, &w32, 0.0f, 1e-5f, y2);
    CHECK(maxdiff(y1, y2, N * D) < 1e-5, "rmsnorm f32 weights");
    be->rmsnorm(c, x, N, D, &w16, 1.0f, 1e-6f, y1);
    be_ref_rmsnorm(x, N, D, &w16, 1.0f, 1e-6f, y2);
    CHECK(maxdiff(y1, y2, N * D) < 1e-5, "rmsnorm bf16 weights with (1 + w)");
    be->rmsnorm(c, x, N, D, NULL, 0.0f, 1e-6f, y1);
    be_ref_rmsnorm(x, N, D, NULL, 0.0f, 1e-6f, y2);
    CHECK(maxdiff(y1, y2, N * D) < 1e-5, "rmsnorm weightless");
    {   /* long rows (weights converted in blocks, with a tail), and enough of them to go over the pool */
        enum { LN = 70, LD = 1100 };
        float *lx = malloc(sizeof(float) * LN * LD), *l1 = malloc(sizeof(float) * LN * LD), *l2 = malloc(sizeof(float) * LN * LD);
        uint16_t *lw = malloc(2 * LD);
        fill(lx, LN * LD, 2.0f);
        for (int i = 0; i < LD; i++) lw[i] = be_f32_to_f16(frand());
        be_mat wl = {.data = lw, .dt = BE_F16, .rows = 1, .cols = LD};
        for (int n = 1; n <= LN; n += LN - 1) {
            be->rmsnorm(c, lx, n, LD, &wl, 0.5f, 1e-6f, l1);
            be_ref_rmsnorm(lx, n, LD, &wl, 0.5f, 1e-6f, l2);
            CHECK(maxdiff(l1, l2, (size_t)n * LD) < 1e-5, "rmsnorm f16 weights, %d rows of %d", n, LD);
        }
        /* glu (both activations), scale, softcap and add over the pool (large), odd length */
        size_t big = (size_t)LN * LD - 3;
        for (int act = BE_ACT_SILU; act <= BE_ACT_GELU_TANH; act++) {
            be->glu(c, lx, lx + 1, l1, big, act);
            be_ref_glu(lx, lx + 1, l2, big, act);
            CHECK(maxdiff(l1, l2, big) < 1e-5, "glu act %d of %zu elements", act, big);
        }
        memcpy(l1, lx, sizeof(float) * big);
        be->scale(c, l1, big, 50.596443f);
        for (size_t i = 0; i < big; i++) l2[i] = lx[i] * 50.596443f;
        CHECK(maxdiff(l1, l2, big) == 0, "scale of %zu elements", big);
        for (size_t i = 0; i < big; i++) l1[i] = l2[i] = lx[i] * 40.0f;   /* around the cap: tanh's whole range */
        be->softcap(c, l1, big, 30.0f);
        be_ref_softcap(l2, big, 30.0f);
        CHECK(maxdiff(l1, l2, big) < 1e-5, "softcap of %zu elements", big);
        for (size_t i = 0; i < big; i++) l2[i] = l1[i] + lx[i];
        be->add(c, l1, lx, big);
        CHECK(maxdiff(l1, l2, big) == 0, "add of %zu elements", big);
        free(lx); free(l1); free(l2); free(lw);
    }

    /* rope: neox and interleaved, full and partial rotation, large positions */
    float inv[48];
    for (int i = 0; i < 48; i++) inv[i] = 1.0f / powf(10000.0f, 2.0f * i / 96.0f);
    int pos[N] = {0, 1, 2, 100, 4095, 30000, 7};
    for (int neox = 0; neox < 2; neox++)
        for (int rot = 96; rot >= 32; rot -= 64) {
            memcpy(y1, x, sizeof x);
            memcpy(y2, x, sizeof x);
            be->rope(c, y1, N, 1, D, rot, pos, inv, neox);
            be_ref_rope(y2, N, 1, D, rot, pos, inv, neox);
            double d = maxdiff(y1, y2, N * D);
            CHECK(d < 2e-3, "rope neox=%d rot=%d: max diff %.2e (float32 angles at position 30000)", neox, rot, d);
        }
    be->glu(c, x, x + D, y1, (N - 1) * D, BE_ACT_SILU);
    be_ref_glu(x, x + D, y2, (N - 1) * D, BE_ACT_SILU);
    CHECK(maxdiff(y1, y2, (N - 1) * D) < 1e-5, "glu silu");

    test_attention(be, c, 1, 1, 4, 2, 16, 0, 0, 16, BE_F32);
    test_attention(be, c, 1, 9, 8, 2, 32, 0, 0, 4, BE_F32);
    test_attention(be, c, 3, 6, 4, 4, 16, 0, 0, 1, BE_F32);
    test_attention(be, c, 4, 7, 6, 2, 24, 4, 0, 2, BE_F32);
    test_attention(be, c, 4, 7, 6, 3, 64, 0, 0, 8, BE_F16);
    test_attention(be, c, 2, 5, 4, 1, 128, 3, 0, 4, BE_BF16);
    test_attention(be, c, 4, 9, 4, 2, 16, 6, 2, 2, BE_F32);     /* rotating window with 2 sinks */
    test_attention(be, c, 3, 1, 4, 2, 16, 5, 4, 1, BE_BF16);    /* its decode step, 1-slot pages */
    /* large enough to take the sgemm path of the CPU attention */
    test_attention(be, c, 3, 40, 8, 2, 64, 0, 0, 16, BE_F32);
    test_attention(be, c, 4, 24, 8, 4, 64, 16, 0, 8, BE_F16);
    test_attention(be, c, 2, 40, 8, 2, 64, 20, 4, 4, BE_BF16);
    be->ctx_free(c);
    return CHECK_DONE();
}
