/*
 * test-kvquant.c — the quantized KV cache through the public API on
 * prose-13m (real bf16 weights, head_dim 64, 2 KV heads, 6 layers):
 *   - the conversion schedule: with quantized_kv_start S, every forward up to
 *     and including the one that brings the sequence to S tokens equals the
 *     unquantized context bit for bit (that step attended unquantized), and
 *     the next one differs; start -1 differs from the first forward on;
 *   - many sequences: decode batches of different sequences equal each
 *     sequence alone, quantized from the first write;
 *   - a snapshot of quantized pages (tensors "L.i.0..2": codes u32, scales,
 *     biases) restores into another sequence that continues bit for bit;
 *   - quantized layers with a window (max_kv_size) decode past the window;
 *   - kv_config: listed layers quantize (snapshot kinds), the others stay dense;
 *   - KV bytes held: 4-bit pages take the expected fraction of f32 ones;
 *   - softcapped attention (Gemma 2) on the unfused port equals dense
 *     attention over the dequantized keys and values; the tiled port refuses
 *     a softcapped model;
 *   - refused requests name the problem: tiled with 3 bits, group 48, a group
 *     that does not divide head_dim, kv_bits with kv_config, malformed
 *     kv_config entries, kv_kernels without a quantized cache, an unknown
 *     kernel set, quantized_kv_start below -1.
 * The values themselves are checked against mlx-lm's semantics in
 * test-kvquant-ref.c (NumPy reference fixtures) and the kernels in
 * test-cache.c / test-cpu-kernels.c / test-backend-ops.c.
 */
#include "check.h"
#include <string.h>
#include "cinfer.h"
#include "backend/cpu/cpu.h"
#include "quant/affine.h"

static cinfer_model *M;
static int V;

static cinfer_ctx *ctx(const cinfer_ctx_opts *o, char *err, size_t n) {
    cinfer_ctx *c = NULL;
    err[0] = 0;
    if (cinfer_ctx_new(M, o, &c, err, n)) return NULL;
    return c;
}

static int32_t tok(int s, int i) { return (int32_t)(3 + (s * 131 + i * 17 + (i * i) % 7) % 31000); }

static double maxdiff(const float *a, const float *b, size_t n) {
    double w = 0;
    for (size_t i = 0; i < n; i++) w = fmax(w, fabs((double)a[i] - b[i]));
    return w;
}

/* prefill 12 tokens in steps of 4, then single tokens: forward k's logits of both contexts */
static void test_schedule(void) {
    char err[512];
    cinfer_ctx_opts dense = {0}, q = {.kv_bits = 4, .quantized_kv_start = 12}, q0 = {.kv_bits = 4, .quantized_kv_start = -1};
    cinfer_ctx *cd = ctx(&dense, err, sizeof err), *cq = ctx(&q, err, sizeof err), *c0 = ctx(&q0, err, sizeof err);
    if (!cd || !cq || !c0) { CHECK(0, "contexts: %s", err); return; }
    float *ld = malloc(sizeof(float) * V), *lq = malloc(sizeof(float) * V), *l0 = malloc(sizeof(float) * V);
    int32_t ids[20];
    for (int i = 0; i < 20; i++) ids[i] = tok(1, i);
    int ok = 1, pos = 0, same_until = -1, first_diff = -1, start0_same = 0;
    for (int k = 0; ok && pos < 20; k++) {
        int n = pos < 12 ? 4 : 1;
        ok = !cinfer_eval(cd, ids + pos, n, 0, ld) && !cinfer_eval(cq, ids + pos, n, 0, lq) && !cinfer_eval(c0, ids + pos, n, 0, l0);
        pos += n;
        int same = !memcmp(ld, lq, sizeof(float) * V);
        if (same && first_diff < 0) same_until = pos;
        if (!same && first_diff < 0) first_diff = pos;
        if (!memcmp(ld, l0, sizeof(float) * V)) start0_same++;
    }
    CHECK(ok && same_until == 12 && first_diff == 13,
          "quantized_kv_start 12: forwards through the one reaching 12 tokens equal the dense context, the next differs "
          "(equal through %d, first difference at %d)", same_until, first_diff);
    CHECK(ok && start0_same == 0, "quantized_kv_start -1: quantized from the first write (%d forwards equal the dense ones)",
          start0_same);
    cinfer_kv_info in;
    cinfer_ctx_kv_info(cq, &in);
    size_t qb = in.bytes_held;
    cinfer_ctx_kv_info(cd, &in);
    /* f32 page: 2 * hd * 4 bytes per slot and head; q4 g64 with f32 scales: 2 * (hd / 2 + 2 * 4) */
    double want = (32.0 + 8.0) / 256.0, got = (double)qb / in.bytes_held;
    CHECK(ok && fabs(got - want) < 1e-9, "KV bytes held: 4-bit group 64 pages are %.4f of f32 ones (expected %.4f)", got, want);
    free(ld); free(lq); free(l0);
    cinfer_ctx_free(cd); cinfer_ctx_free(cq); cinfer_ctx_free(c0);
}

/* 6 sequences of lengths 4..24 fed token by token in shared decode batches (each step a
 * batch of the sequences still growing, named in another order), against each
 * sequence fed alone: the CPU's decode matmuls compute a row the same way
 * whatever the batch, so the keys quantize to the same codes and the logits
 * must agree to float rounding (batched prefill rounds differently, and a
 * quantizer turns 1e-7 differences into whole code steps) */
static void test_many(int bits, const char *kernels) {
    char err[512];
    cinfer_ctx_opts o = {.kv_bits = bits, .quantized_kv_start = -1, .kv_kernels = kernels, .max_seqs = 8};
    cinfer_ctx *c = ctx(&o, err, sizeof err), *one = ctx(&o, err, sizeof err);
    if (!c || !one) { CHECK(0, "contexts: %s", err); return; }
    enum { NS = 6 };
    int lens[NS], ok = 1, steps = 0;
    for (int s = 0; s < NS; s++) lens[s] = 4 + (s * 7) % 21;
    float *lg = malloc(sizeof(float) * NS * V), *ref = malloc(sizeof(float) * V);
    float *last = malloc(sizeof(float) * NS * V);
    for (int t = 0; ok; t++) {
        int seqs[NS], B = 0;
        int32_t ids[NS];
        for (int s = NS - 1; s >= 0; s--)
            if (t < lens[s]) { seqs[B] = s; ids[B++] = tok(s, t); }
        if (!B) break;
        ok = !cinfer_forward_seqs(c, ids, B, 1, seqs, NULL, NULL, NULL, 0, lg);
        for (int b = 0; ok && b < B; b++) memcpy(last + (size_t)seqs[b] * V, lg + (size_t)b * V, sizeof(float) * V);
        steps++;
    }
    double worst = 0;
    for (int s = 0; s < NS && ok; s++) {
        cinfer_ctx_reset(one);
        for (int t = 0; ok && t < lens[s]; t++) ok = !cinfer_eval(one, &(int32_t){tok(s, t)}, 1, 0, ref);
        worst = fmax(worst, maxdiff(last + (size_t)s * V, ref, V));
    }
    CHECK(ok && worst <= 1e-5, "%d-bit %s: %d sequences of lengths 4..24 decoded in %d shared batches equal each alone "
          "(max |diff| %.2g)", bits, kernels ? kernels : "unfused", NS, steps, worst);
    free(lg); free(ref); free(last);
    cinfer_ctx_free(c); cinfer_ctx_free(one);
}

/* a snapshot of quantized pages: names, and a restored copy continues exactly */
static void test_snapshot(void) {
    char err[512];
    cinfer_ctx_opts o = {.kv_bits = 3, .kv_group_size = 32, .quantized_kv_start = -1, .max_seqs = 4, .kv_page = 16};
    cinfer_ctx *c = ctx(&o, err, sizeof err);
    if (!c) { CHECK(0, "context: %s", err); return; }
    int32_t ids[40];
    for (int i = 0; i < 40; i++) ids[i] = tok(2, i);
    float *a = malloc(sizeof(float) * V), *b = malloc(sizeof(float) * V);
    int seq0 = 0, seq2 = 2;
    int ok = !cinfer_forward_seqs(c, ids, 1, 37, &seq0, NULL, NULL, NULL, 0, a);
    cinfer_snapshot *s = NULL;
    ok = ok && !cinfer_seq_snapshot(c, 0, &s);
    int names = ok && s->n_tensors == 6 * 6, codes_u32 = 0;
    for (int i = 0; names && i < s->n_tensors; i++)
        if (!strcmp(s->tensors[i].name, "5.1.0")) codes_u32 = !strcmp(s->tensors[i].dtype, "u32") && s->tensors[i].shape[3] == 64 * 3 / 32 &&
                                                           s->tensors[i].shape[2] == 37;
    ok = ok && !cinfer_seq_restore(c, 2, s);
    double worst = 0;
    for (int i = 37; ok && i < 40; i++) {
        ok = !cinfer_forward_seqs(c, ids + i, 1, 1, &seq0, NULL, NULL, NULL, 0, a) &&
             !cinfer_forward_seqs(c, ids + i, 1, 1, &seq2, NULL, NULL, NULL, 0, b);
        worst = fmax(worst, maxdiff(a, b, V));
    }
    CHECK(ok && names && codes_u32 && worst == 0, "3-bit snapshot: 36 tensors (codes u32 [1][2][37][6], scales, biases), "
          "the restored copy continues bit for bit (max |diff| %.2g)", worst);
    cinfer_snapshot_free(s);
    free(a); free(b);
    cinfer_ctx_free(c);
}

/* max_kv_size with quantized pages: decoding far past the window keeps the KV bytes flat */
static void test_window(void) {
    char err[512];
    cinfer_ctx_opts o = {.kv_bits = 8, .quantized_kv_start = -1, .max_kv_size = 40, .kv_page = 16};
    cinfer_ctx *c = ctx(&o, err, sizeof err);
    if (!c) { CHECK(0, "context: %s", err); return; }
    float *a = malloc(sizeof(float) * V);
    int ok = 1;
    size_t b100 = 0, b300 = 0;
    for (int i = 0; ok && i < 300; i++) {
        ok = !cinfer_eval(c, &(int32_t){tok(3, i)}, 1, 0, a);
        if (i == 99) b100 = cinfer_ctx_cache_bytes(c);
    }
    b300 = cinfer_ctx_cache_bytes(c);
    CHECK(ok && b100 == b300 && b300 > 0, "8-bit pages with max_kv_size 40: 300 decode steps, KV bytes flat (%zu at 100, %zu at 300)",
          b100, b300);
    free(a);
    cinfer_ctx_free(c);
}

/* kv_config: layers 1 and 4 quantized, the others dense */
static void test_config(void) {
    char err[512];
    cinfer_ctx_opts o = {.kv_config = "[{\"layer_idx\": 1, \"bits\": 8}, {\"layer_idx\": 4, \"bits\": 4, \"group_size\": 32, "
                                      "\"note\": \"ignored\"}]",
                         .quantized_kv_start = -1};
    cinfer_ctx *c = ctx(&o, err, sizeof err);
    if (!c) { CHECK(0, "kv_config context: %s", err); return; }
    float *a = malloc(sizeof(float) * V);
    int32_t ids[24];
    for (int i = 0; i < 24; i++) ids[i] = tok(4, i);
    int ok = !cinfer_eval(c, ids, 24, 0, a);   /* a window of 24 causal queries: the tiled port (tiled-causal) */
    ok = ok && !cinfer_eval(c, ids, 1, 0, a);
    cinfer_snapshot *s = NULL;
    ok = ok && !cinfer_seq_snapshot(c, 0, &s);
    int kinds = ok && strstr(s->header, "\"layer\":1,\"kind\":\"quant\"") && strstr(s->header, "\"layer\":4,\"kind\":\"quant\"") &&
                strstr(s->header, "\"layer\":0,\"kind\":\"dense\"") && strstr(s->header, "\"layer\":5,\"kind\":\"dense\"");
    CHECK(ok && kinds, "kv_config: layers 1 and 4 hold quantized pages, the others dense; prefill and decode run");
    cinfer_snapshot_free(s);
    free(a);
    cinfer_ctx_free(c);
}

/* the CPU kvq_attention with a softcap against be_ref_attention over f32 pools holding the dequantized
 * values: 2 rows, 5 queries each, GQA 4:2, head_dim 64, group 32, every bit width */
static void test_softcap(void) {
    enum { B = 2, L = 5, NH = 4, NKV = 2, HD = 64, SPAN = 40, PAGE = 64, G = 32 };
    static const int bitss[] = {2, 3, 4, 5, 6, 8};
    const be_ops *be = be_cpu();
    be_ctx *bc = NULL;
    be->ctx_new(&bc, 2);
    int pos0[B] = {35, 20}, len[B] = {5, 3}, seq[B] = {0, 1}, run0[B] = {0, 0}, pos[B * L];
    int32_t pt[B] = {0, 1};   /* one page of PAGE slots per sequence */
    for (int b = 0; b < B; b++)
        for (int i = 0; i < L; i++) pos[b * L + i] = pos0[b] + i;
    be_attn a = {.B = B, .L = L, .n_head = NH, .n_kv_head = NKV, .head_dim = HD, .pos0 = pos0, .len = len,
                 .scale = 0.125f, .page = PAGE, .n_pt = 1, .pt = pt, .pt_host = pt, .seq = seq, .run0 = run0,
                 .max_span = SPAN, .pos = pos, .softcap = 4.0f};
    size_t slots = (size_t)B * NKV * PAGE;
    float *kv = malloc(sizeof(float) * slots * HD * 2), *dk = malloc(sizeof(float) * slots * HD * 2), *dv = dk + slots * HD;
    float *q = malloc(sizeof(float) * B * L * NH * HD), *o = malloc(sizeof(float) * B * L * NH * HD),
          *r = malloc(sizeof(float) * B * L * NH * HD);
    uint32_t x = 12345;
    for (size_t i = 0; i < slots * HD * 2; i++) kv[i] = (float)((x = x * 1664525u + 1013904223u) >> 8) / (1 << 24) * 4 - 2;
    for (int i = 0; i < B * L * NH * HD; i++) q[i] = (float)((x = x * 1664525u + 1013904223u) >> 8) / (1 << 24) * 8 - 4;
    double worst = 0;
    for (size_t t = 0; t < sizeof bitss / sizeof *bitss; t++) {
        int bits = bitss[t];
        size_t row = aq_row_bytes(HD, bits);
        be_kvq pk = {malloc(slots * row), malloc(slots * 8), malloc(slots * 8), bits, G, BE_F32}, pv = pk;
        pv.codes = malloc(slots * row), pv.scales = malloc(slots * 8), pv.biases = malloc(slots * 8);
        for (size_t s = 0; s < slots; s++)   /* every slot quantized, then its dense equivalent */
            for (int w = 0; w < 2; w++) {
                be_kvq *p = w ? &pv : &pk;
                aq_quantize_row(kv + (w * slots + s) * HD, HD, bits, G, AQ_ROUND_GPU, BE_F32, (uint8_t *)p->codes + s * row,
                                (float *)p->scales + s * 2, (float *)p->biases + s * 2);
                aq_dequant_row((uint8_t *)p->codes + s * row, (float *)p->scales + s * 2, (float *)p->biases + s * 2, BE_F32,
                               bits, G, 0, HD, (w ? dv : dk) + s * HD);
            }
        be->kvq_attention(bc, &a, q, &pk, &pv, BE_KVQ_UNFUSED, o);
        be_ref_attention(&a, q, dk, dv, BE_F32, r);
        for (int i = 0; i < B * L * NH * HD; i++) worst = fmax(worst, fabs((double)o[i] - r[i]));
        free(pk.codes); free(pk.scales); free(pk.biases); free(pv.codes); free(pv.scales); free(pv.biases);
    }
    CHECK(worst < 1e-5, "softcap 4: the CPU unfused port equals dense attention over the dequantized K/V, bits 2..8 "
          "(max |diff| %.2g)", worst);
    free(kv); free(dk); free(q); free(o); free(r);
    be->ctx_free(bc);
    /* the tiled port refuses a softcapped model (Gemma 2 fixture: attn_logit_softcapping 4) */
    char path[1024], err[512];
    cinfer_model *g = NULL;
    cinfer_ctx *c = NULL;
    snprintf(path, sizeof path, "tests/fixtures/gemma/gemma2-f32");
    cinfer_status st = cinfer_model_load(path, NULL, &g, err, sizeof err);
    if (!st) st = cinfer_ctx_new(g, &(cinfer_ctx_opts){.kv_bits = 4, .kv_kernels = "tiled"}, &c, err, sizeof err);
    CHECK(st && strstr(err, "do not take softcapped attention"), "gemma2 with the tiled port: refused: %s", err);
    cinfer_ctx_free(c);
    cinfer_model_free(g);
}

static void refused(const cinfer_ctx_opts *o, const char *want, const char *what) {
    char err[512];
    cinfer_ctx *c = ctx(o, err, sizeof err);
    CHECK(!c && strstr(err, want), "refused: %s: %s", what, err);
    cinfer_ctx_free(c);
}

static void test_refusals(void) {
    refused(&(cinfer_ctx_opts){.kv_bits = 3, .kv_kernels = "tiled"}, "take 4- and 8-bit", "tiled with 3 bits");
    refused(&(cinfer_ctx_opts){.kv_config = "[{\"layer_idx\": 0, \"bits\": 6}]"}, "take 4- and 8-bit",
            "kv_config (tiled-causal by default) with 6 bits");
    refused(&(cinfer_ctx_opts){.kv_bits = 4, .kv_group_size = 48}, "group size 32, 64 or 128", "group 48");
    refused(&(cinfer_ctx_opts){.kv_bits = 4, .kv_group_size = 128}, "head_dim 64 is not divisible by the group size 128",
            "a group that does not divide head_dim");
    refused(&(cinfer_ctx_opts){.kv_bits = 7}, "bits must be 2, 3, 4, 5, 6 or 8", "7 bits");
    refused(&(cinfer_ctx_opts){.kv_bits = 4, .kv_config = "[]"}, "both given", "kv_bits with kv_config");
    refused(&(cinfer_ctx_opts){.kv_config = "[{\"layer\": 0, \"bits\": 4}]"}, "entry 0 is not", "an entry without layer_idx");
    refused(&(cinfer_ctx_opts){.kv_config = "[{\"layer_idx\": 6, \"bits\": 4}]"}, "must be in [0, 6)", "layer_idx past the model");
    refused(&(cinfer_ctx_opts){.kv_config = "[{\"layer_idx\": 0, \"bits\": 4"}, "not JSON", "truncated JSON");
    refused(&(cinfer_ctx_opts){.kv_config = "/nonexistent/kv.json"}, "kv_config file /nonexistent/kv.json", "a missing file");
    refused(&(cinfer_ctx_opts){.kv_kernels = "tiled"}, "without a quantized KV cache", "kv_kernels alone");
    refused(&(cinfer_ctx_opts){.kv_bits = 4, .kv_kernels = "fused"}, "not one of unfused, tiled-causal, tiled", "an unknown kernel set");
    refused(&(cinfer_ctx_opts){.kv_bits = 4, .quantized_kv_start = -2}, "quantized_kv_start -2", "start -2");
}

int main(void) {
    char path[1024], err[512];
    snprintf(path, sizeof path, "%s/models/prose-13m", shared_dir());
    if (cinfer_model_load(path, NULL, &M, err, sizeof err)) {
        CHECK(0, "load prose-13m: %s", err);
        return CHECK_DONE();
    }
    cinfer_model_info mi;
    cinfer_model_get_info(M, &mi);
    V = mi.n_vocab;
    test_schedule();
    test_many(4, NULL);
    test_many(8, "tiled");
    test_many(2, NULL);
    test_snapshot();
    test_window();
    test_config();
    test_refusals();
    test_softcap();
    cinfer_model_free(M);
    return CHECK_DONE();
}
