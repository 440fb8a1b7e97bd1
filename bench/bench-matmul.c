/*
 * bench-matmul.c — the CPU matmul alone (cpu backend table), for tuning the
 * kernels without a model: decode-like GEMV over a stack of weight matrices
 * larger than the caches (GB/s of weights read), and prefill-like GEMM on one
 * matrix (GFLOP/s).
 *
 * Weights live in anonymous memory (or, with --file PATH, in a read-only mmap
 * of any large file, as model weights are: 4 KiB page-cache pages, no THP).
 *
 * usage: bench-matmul [-t THREADS] [--dtype bf16|f16|f32|q4|q8] [-m 2048] [-k 2048]
 *                     [--mb 1024] [-n 1] [-r 5] [--file PATH] [--tinyllama | --attn DEPTH]
 *   q4, q8: MLX affine codes of 4 / 8 bits, group 64, bf16 scales and biases (random
 *     codes; GB/s counts codes, scales and biases as stored: what a decode step reads)
 *   -n 1..8: GEMV over ~--mb MiB of [m][k] matrices, reports GB/s
 *   -n > 8:  GEMM x[n][k] . W[m][k]^T, reports GFLOP/s
 *   --tinyllama: instead, one decode step's matmuls of the TinyLlama-1.1B shape
 *     in order (22 x q,k,v,o,gate,up,down, then the LM head; -n tokens), the
 *     model's decode minus everything that is not a matmul: GB/s and tok/s.
 *   --attn DEPTH: instead, one decode step's attention of that shape over DEPTH keys
 *     of a KV cache of --dtype (f32/f16/bf16 pages, or q4/q8: quantized KV), 22 layers.
 */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#include "backend/backend.h"

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static int tinyllama_stack(int threads, int n, int reps, be_dtype dt) {
    static const int64_t sh[7][2] = { { 2048, 2048 }, { 256, 2048 }, { 256, 2048 }, { 2048, 2048 },
                                      { 5632, 2048 }, { 5632, 2048 }, { 2048, 5632 } };
    enum { LAYERS = 22, NMAT = LAYERS * 7 + 1 };
    size_t es = be_dtype_size(dt), off[NMAT + 1];
    be_mat mats[NMAT];
    off[0] = 0;
    for (int i = 0; i < NMAT; i++) {
        int64_t r = i < NMAT - 1 ? sh[i % 7][0] : 32000, c = i < NMAT - 1 ? sh[i % 7][1] : 2048;
        mats[i] = (be_mat){ .dt = dt, .rows = r, .cols = c };
        off[i + 1] = off[i] + (size_t)(r * c) * es;
    }
    uint8_t *b = aligned_alloc(4096, off[NMAT] + 64);
    if (!b) return 1;
    for (size_t i = 0; i < off[NMAT] / 2; i++) ((uint16_t *)b)[i] = (uint16_t)(0x3c00 + (i % 97));
    if (dt == BE_F32) for (size_t i = 0; i < off[NMAT] / 4; i++) ((float *)b)[i] = 0.01f * (float)(i % 97);
    for (int i = 0; i < NMAT; i++) mats[i].data = b + off[i];
    float *x = calloc((size_t)n * 5632, sizeof(float)), *y = calloc((size_t)n * 32000, sizeof(float));
    for (int i = 0; i < n * 5632; i++) x[i] = 0.001f * (float)(i % 113);
    const be_ops *ops = be_cpu();
    be_ctx *c;
    if (!x || !y || ops->ctx_new(&c, threads)) return 1;
    double best = 1e30;
    for (int r = 0; r <= reps; r++) {   /* r = 0: warm-up */
        double t0 = now_s();
        for (int i = 0; i < NMAT; i++) ops->matmul(c, x, n, &mats[i], NULL, y);
        double t = now_s() - t0;
        if (r && t < best) best = t;
    }
    printf("tinyllama decode matmuls %s n=%d t=%d: %.1f GB/s, %.2f steps/s\n", be_dtype_name(dt), n, threads,
           off[NMAT] / best / 1e9, 1 / best);
    ops->ctx_free(c);
    free(x); free(y); free(b);
    return 0;
}

/* --attn DEPTH: one decode step's attention of the TinyLlama-1.1B shape (22 layers, 32 query heads on 4 kv heads,
 * head_dim 64) over DEPTH keys in pages of 128: dense K and V pools (--dtype f32 | f16 | bf16: be_ops.attention) or
 * quantized ones (q4 | q8: kvq_attention, group 64, f32 scales and biases as on cinfer's CPU path); ms a step, keys a
 * second, GB/s of the pools read */
static int attn_stack(int threads, int reps, be_dtype dt, int depth) {
    enum { LAYERS = 22, NH = 32, NKV = 4, HD = 64, G = 64, PAGE = 128 };
    int pages = (depth + PAGE - 1) / PAGE, bits = dt == BE_Q4 ? 4 : dt == BE_Q8 ? 8 : 0;
    size_t slots = (size_t)pages * NKV * PAGE, sb = bits ? slots * (HD / G) * sizeof(float) : 0;
    size_t cb = bits ? slots * HD * bits / 8 : slots * HD * be_dtype_size(dt), per = 2 * (cb + 2 * sb);   /* K, V of a layer */
    uint8_t *b = aligned_alloc(4096, per * LAYERS);
    int32_t *pt = malloc(sizeof(int32_t) * pages);
    float *q = malloc(sizeof(float) * NH * HD), *out = malloc(sizeof(float) * NH * HD);
    if (!b || !pt || !q || !out) return 1;
    uint64_t rs = 12345;
    for (size_t i = 0; bits && i < per * LAYERS; i++) { rs = rs * 6364136223846793005ull + 1442695040888963407ull; b[i] = (uint8_t)(rs >> 56); }
    for (size_t i = 0; !bits && i < per * LAYERS / be_dtype_size(dt); i++) be_kv_put(b, dt, i, 0.01f * (float)(i % 97) - 0.5f);
    be_kvq kv[LAYERS][2];
    for (int l = 0; l < LAYERS; l++)
        for (int t = 0; t < 2; t++) {
            uint8_t *base = b + per * l + (cb + 2 * sb) * t;
            float *sc = (float *)(void *)(base + cb), *bi = (float *)(void *)(base + cb + sb);
            for (size_t i = 0; bits && i < slots * (HD / G); i++) { sc[i] = 0.01f + 1e-5f * (float)(i % 89); bi[i] = -0.05f * (float)(i % 3); }
            kv[l][t] = (be_kvq){base, sc, bi, bits, G, BE_F32};
        }
    for (int i = 0; i < pages; i++) pt[i] = i;
    for (int i = 0; i < NH * HD; i++) q[i] = 0.02f * (float)(i % 101) - 1.0f;
    int pos0 = depth - 1, len = 1, run0 = 0, seq = 0;
    be_attn a = {.B = 1, .L = 1, .n_head = NH, .n_kv_head = NKV, .head_dim = HD, .pos0 = &pos0, .len = &len, .scale = 0.125f,
                 .page = PAGE, .n_pt = pages, .pt = pt, .pt_host = pt, .seq = &seq, .run0 = &run0, .max_span = depth};
    const be_ops *ops = be_cpu();
    be_ctx *c;
    if (ops->ctx_new(&c, threads)) return 1;
    double best = 1e30;
    for (int r = 0; r <= reps; r++) {   /* r = 0: warm-up */
        double t0 = now_s();
        for (int l = 0; l < LAYERS; l++)
            if (bits) ops->kvq_attention(c, &a, q, &kv[l][0], &kv[l][1], BE_KVQ_UNFUSED, out);
            else ops->attention(c, &a, q, kv[l][0].codes, kv[l][1].codes, dt, out);
        double t = now_s() - t0;
        if (r && t < best) best = t;
    }
    double bytes = (double)LAYERS * 2 * NKV * depth * (bits ? HD * bits / 8 + 2 * (HD / G) * sizeof(float) : HD * be_dtype_size(dt));
    printf("tinyllama decode attention %s%s depth %d t=%d: %.2f ms a step, %.1f M keys/s (a kv head), %.1f GB/s\n",
           bits ? "KV" : "", bits ? (bits == 4 ? "4 g64" : "8 g64") : be_dtype_name(dt), depth, threads, best * 1e3,
           LAYERS * NKV * (double)depth / best / 1e6, bytes / best / 1e9);
    ops->ctx_free(c);
    free(b); free(pt); free(q); free(out);
    return 0;
}

int main(int argc, char **argv) {
    int threads = 2, n = 1, reps = 5;
    int64_t m = 2048, k = 2048;
    size_t mb = 1024;
    be_dtype dt = BE_BF16;
    const char *file = NULL;
    int tiny = 0, depth = 0;
    for (int i = 1; i < argc; i++)
        if (!strcmp(argv[i], "--tinyllama")) {   /* a flag: drop it, options come in pairs */
            tiny = 1;
            for (int j = i; j + 1 < argc; j++) argv[j] = argv[j + 1];
            argc--;
            break;
        }
    for (int i = 1; i + 1 < argc; i += 2) {
        const char *a = argv[i], *v = argv[i + 1];
        if (!strcmp(a, "-t")) threads = atoi(v);
        else if (!strcmp(a, "-n")) n = atoi(v);
        else if (!strcmp(a, "-r")) reps = atoi(v);
        else if (!strcmp(a, "-m")) m = atoll(v);
        else if (!strcmp(a, "-k")) k = atoll(v);
        else if (!strcmp(a, "--mb")) mb = (size_t)atoll(v);
        else if (!strcmp(a, "--file")) file = v;
        else if (!strcmp(a, "--attn")) depth = atoi(v);
        else if (!strcmp(a, "--dtype"))
            dt = !strcmp(v, "f32") ? BE_F32 : !strcmp(v, "f16") ? BE_F16 : !strcmp(v, "q4") ? BE_Q4 : !strcmp(v, "q8") ? BE_Q8 : BE_BF16;
        else { fprintf(stderr, "bench-matmul: unknown option %s\n", a); return 2; }
    }
    const int bits = dt == BE_Q4 ? 4 : dt == BE_Q8 ? 8 : 0, G = 64;   /* affine: codes, then bf16 scales, then biases */
    if (tiny && bits) { fprintf(stderr, "bench-matmul: --tinyllama takes bf16, f16 or f32\n"); return 2; }
    if (tiny) return tinyllama_stack(threads, n, reps, dt);
    if (depth > 0) return attn_stack(threads, reps, dt, depth);
    if (bits && (k % G || file)) { fprintf(stderr, "bench-matmul: q4/q8 need k %% 64 == 0 and no --file\n"); return 2; }
    size_t code_bytes = (size_t)(m * k) * (size_t)(bits ? bits : 8) / 8, sb_bytes = bits ? (size_t)(m * (k / G)) * 2 : 0;
    size_t mat_bytes = bits ? code_bytes + 2 * sb_bytes : (size_t)(m * k) * be_dtype_size(dt);
    int nmat = n <= 8 ? (int)((mb << 20) / mat_bytes) : 1;
    if (nmat < 1) nmat = 1;
    size_t total = mat_bytes * (size_t)nmat;
    const uint8_t *w;
    if (file) {
        int fd = open(file, O_RDONLY);
        struct stat st;
        if (fd < 0 || fstat(fd, &st) || (size_t)st.st_size < total) {
            fprintf(stderr, "bench-matmul: %s missing or smaller than %zu bytes\n", file, total);
            return 1;
        }
        w = mmap(NULL, total, PROT_READ, MAP_SHARED, fd, 0);
        close(fd);
        if (w == MAP_FAILED) return 1;
        volatile uint8_t sink = 0;
        for (size_t i = 0; i < total; i += 4096) sink ^= w[i];
        (void)sink;
    } else {
        uint8_t *b = aligned_alloc(4096, total);
        if (!b) return 1;
        for (size_t i = 0; i < total / 2; i++) ((uint16_t *)b)[i] = (uint16_t)(0x3c00 + (i % 97));  /* small finite values */
        if (dt == BE_F32) for (size_t i = 0; i < total / 4; i++) ((float *)b)[i] = 0.01f * (float)(i % 97);
        uint64_t rs = 12345;
        for (size_t i = 0; bits && i < total; i++) {   /* codes: random bytes; scales, biases: small bf16 values */
            size_t o = i % mat_bytes;
            rs = rs * 6364136223846793005ull + 1442695040888963407ull;
            if (o < code_bytes) b[i] = (uint8_t)(rs >> 56);
            else if (!(o & 1)) *(uint16_t *)(b + i) = (uint16_t)((o < code_bytes + sb_bytes ? 0x3c00 : 0xbc00) + (rs >> 60));
        }
        w = b;
    }
    float *x = malloc(sizeof(float) * (size_t)(n * k)), *y = malloc(sizeof(float) * (size_t)(n * m));
    for (int64_t i = 0; i < n * k; i++) x[i] = 0.001f * (float)(i % 113);
    const be_ops *ops = be_cpu();
    be_ctx *c;
    if (ops->ctx_new(&c, threads)) return 1;
    be_mat *mats = calloc((size_t)nmat, sizeof *mats);
    for (int i = 0; i < nmat; i++) {
        const uint8_t *base = w + mat_bytes * (size_t)i;
        mats[i] = (be_mat){ .data = base, .dt = dt, .rows = m, .cols = k };
        if (bits) {
            mats[i].scales = base + code_bytes;
            mats[i].biases = base + code_bytes + sb_bytes;
            mats[i].sdt = BE_BF16;
            mats[i].group = G;
        }
    }
    ops->matmul(c, x, n, &mats[0], NULL, y);   /* warm-up */
    double best = 1e30;
    for (int r = 0; r < reps; r++) {
        double t0 = now_s();
        for (int i = 0; i < nmat; i++) ops->matmul(c, x, n, &mats[i], NULL, y);
        double t = now_s() - t0;
        if (t < best) best = t;
    }
    printf("%s m=%lld k=%lld n=%d t=%d mats=%d %s: ", be_dtype_name(dt), (long long)m, (long long)k, n,
           threads, nmat, file ? "mmap" : "anon");
    if (n <= 8) printf("%.1f GB/s  (%.1f us per matrix)\n", total / best / 1e9, best / nmat * 1e6);
    else printf("%.1f GFLOP/s\n", 2.0 * (double)m * k * n * nmat / best / 1e9);
    ops->ctx_free(c);
    return 0;
}
