/*
 * bench-model.c — prompt-processing and decode speed of one model directory
 * through the public API (cinfer_model_load, cinfer_ctx_new, cinfer_eval),
 * with the figures its ceilings are judged by.
 *
 *   ppP: a fresh context evaluates P random token ids in one call (logits of
 *        the last position only, as llama-bench's pp test does); tok/s.
 *   tgN: a fresh context evaluates N single tokens one after another, each
 *        with its logits (llama-bench's tg test); tok/s.
 * Each is run -r times after one warm-up; the best is reported (the machine
 * is shared, so noise only ever slows a run down).
 *
 * Derived figures (llama-shaped models):
 *   prefill GFLOP/s = 2 x (layer matmul params) x tokens / s — the projection
 *     and MLP matmuls, which dominate; attention and the single LM-head row
 *     are left out, so this slightly understates the work done;
 *   decode GB/s = (layer weights + LM head) bytes read per token x tok/s.
 * Output: "key value" lines (bench/bench-cpu.sh turns them into a table).
 *
 *   -d D1,D2,...: decode at depth (llama-bench's "tgN @ dD"): one context
 *        prefills to each D in turn (steps of 512 tokens, unquantized KV),
 *        then times N single-token steps, rewinding to D between repetitions
 *        (cinfer_ctx_trim); each KV bit width of --kv-bits B1,B2 then gets a
 *        context of its own (group --kv-group, quantized_kv_start D) into which
 *        the unquantized state at D is restored (cinfer_seq_restore); its first
 *        step converts the cache (mlx-lm's maybe_quantize_kv_cache) and is not
 *        timed. Prints dD_kvK_tgN_tok_s and dD_kvK_kv_bytes (K = the KV dtype
 *        name or qB; kv_bytes: the held pages at depth D, all of which a step
 *        reads).
 *
 * usage: bench-model -m DIR [-t THREADS] [-p 512] [-n 128] [-r 3] [--kv-f16]
 *                    [-d D1,D2 [--kv-dtype f32|f16|bf16] [--kv-bits B1,B2] [--kv-group G]]
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include "cinfer.h"

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static int fail(const char *what, cinfer_ctx *c) {
    fprintf(stderr, "bench-model: %s: %s\n", what, c ? cinfer_ctx_error(c) : "");
    return 1;
}

/* params of the layer matmuls (+ the LM head) of a llama-shaped model */
static int64_t matmul_params(const cinfer_model_info *mi, int head) {
    int64_t q = (int64_t)mi->n_head * mi->head_dim, kv = (int64_t)mi->n_kv_head * mi->head_dim;
    return (int64_t)mi->n_layer * ((int64_t)mi->hidden * (q + 2 * kv) + q * mi->hidden + 3 * (int64_t)mi->hidden * mi->ffn) +
           (head ? (int64_t)mi->n_vocab * mi->hidden : 0);
}

/* weight bytes one decode step reads: the layer matrices and the LM head as stored (4 / 2 bytes for
 * dense types; codes + scales + biases for MLX affine ones) */
static double decode_bytes(const cinfer_model_info *mi) { return (double)matmul_params(mi, 1) * mi->bits_per_weight / 8; }

/* best of reps of tg single-token steps from depth d (rewinding to d in between); tok/s, or < 0 */
static double time_decode(cinfer_ctx *c, const int32_t *ids, int d, int tg, int reps, float *logits) {
    double best = 1e30;
    for (int r = 0; r < reps; r++) {
        cinfer_ctx_trim(c, d);
        double t0 = now_s();
        for (int i = 0; i < tg; i++)
            if (cinfer_eval(c, ids + i, 1, 0, logits) != CINFER_OK) return -1;
        double t = now_s() - t0;
        if (t < best) best = t;
    }
    cinfer_ctx_trim(c, d);
    return tg / best;
}

/* -d: decode at each depth with the unquantized cache, then with each --kv-bits width */
static int depth_bench(cinfer_model *m, const cinfer_model_info *mi, int threads, const char *depths, const char *kv_dtype,
                       const char *kv_bits, int kv_group, int tg, int reps) {
    int d[16], nd = 0, bits[8], nb = 0;
    for (const char *p = depths; *p && nd < 16; p += strcspn(p, ",") + (p[strcspn(p, ",")] == ',')) d[nd++] = atoi(p);
    for (const char *p = kv_bits ? kv_bits : ""; *p && nb < 8; p += strcspn(p, ",") + (p[strcspn(p, ",")] == ','))
        bits[nb++] = atoi(p);
    int max_ctx = d[nd - 1] + tg + 1, n_ids = max_ctx;
    int32_t *ids = malloc(sizeof(int32_t) * (size_t)n_ids);
    float *logits = malloc(sizeof(float) * (size_t)mi->n_vocab);
    cinfer_snapshot **snap = calloc((size_t)nd, sizeof *snap);
    if (!ids || !logits || !snap) return 1;
    uint64_t s = 777;
    for (int i = 0; i < n_ids; i++) {
        s = s * 6364136223846793005ull + 1442695040888963407ull;
        ids[i] = (int32_t)((s >> 33) % (uint64_t)mi->n_vocab);
    }
    char err[512];
    const char *kvn = kv_dtype ? kv_dtype : "f32";
    cinfer_ctx *c = NULL;
    cinfer_ctx_opts co = {.n_threads = threads, .kv_dtype = kv_dtype, .max_seqs = 1};
    if (cinfer_ctx_new(m, &co, &c, err, sizeof err) != CINFER_OK) { fprintf(stderr, "bench-model: %s\n", err); return 1; }
    for (int k = 0, pos = 0; k < nd; k++) {
        double t0 = now_s();
        while (pos < d[k]) {   /* prefill to d[k] in steps of 512 */
            int n = d[k] - pos < 512 ? d[k] - pos : 512;
            if (cinfer_eval(c, ids + pos, n, 0, logits) != CINFER_OK) return fail("prefill", c);
            pos += n;
        }
        printf("d%d_prefill_s %.1f\n", d[k], now_s() - t0);
        double r = time_decode(c, ids + d[k], d[k], tg, reps, logits);
        if (r < 0) return fail("decode", c);
        printf("d%d_kv%s_tg%d_tok_s %.2f\n", d[k], kvn, tg, r);
        printf("d%d_kv%s_kv_bytes %zu\n", d[k], kvn, cinfer_ctx_cache_bytes(c));
        fflush(stdout);
        if (nb && cinfer_seq_snapshot(c, 0, &snap[k]) != CINFER_OK) return fail("snapshot", c);
    }
    cinfer_ctx_free(c);
    for (int b = 0; b < nb; b++)
        for (int k = 0; k < nd; k++) {
            cinfer_ctx_opts qo = co;
            qo.kv_bits = bits[b];
            qo.kv_group_size = kv_group;
            qo.quantized_kv_start = d[k];
            if (cinfer_ctx_new(m, &qo, &c, err, sizeof err) != CINFER_OK) { fprintf(stderr, "bench-model: %s\n", err); return 1; }
            if (cinfer_seq_restore(c, 0, snap[k]) != CINFER_OK) return fail("restore", c);
            if (cinfer_eval(c, ids + d[k], 1, 0, logits) != CINFER_OK) return fail("convert", c);   /* converts after */
            double r = time_decode(c, ids + d[k], d[k], tg, reps, logits);
            if (r < 0) return fail("decode", c);
            printf("d%d_kvq%d_tg%d_tok_s %.2f\n", d[k], bits[b], tg, r);
            printf("d%d_kvq%d_kv_bytes %zu\n", d[k], bits[b], cinfer_ctx_cache_bytes(c));
            fflush(stdout);
            cinfer_ctx_free(c);
        }
    for (int k = 0; k < nd; k++) cinfer_snapshot_free(snap[k]);
    free(snap);
    free(ids);
    free(logits);
    return 0;
}

int main(int argc, char **argv) {
    const char *dir = NULL;
    int threads = 0, pp = 512, tg = 128, reps = 3, kv_f16 = 0, kv_group = 64;
    const char *depths = NULL, *kv_dtype = NULL, *kv_bits = NULL;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "-m") && v) dir = argv[++i];
        else if (!strcmp(a, "-t") && v) threads = atoi(argv[++i]);
        else if (!strcmp(a, "-p") && v) pp = atoi(argv[++i]);
        else if (!strcmp(a, "-n") && v) tg = atoi(argv[++i]);
        else if (!strcmp(a, "-r") && v) reps = atoi(argv[++i]);
        else if (!strcmp(a, "--kv-f16")) kv_f16 = 1;
        else if (!strcmp(a, "-d") && v) depths = argv[++i];
        else if (!strcmp(a, "--kv-dtype") && v) kv_dtype = argv[++i];
        else if (!strcmp(a, "--kv-bits") && v) kv_bits = argv[++i];
        else if (!strcmp(a, "--kv-group") && v) kv_group = atoi(argv[++i]);
        else { dir = NULL; break; }
    }
    if (!dir || reps < 1 || pp < 0 || tg < 0) {
        fprintf(stderr, "usage: bench-model -m DIR [-t THREADS] [-p 512] [-n 128] [-r 3] [--kv-f16]\n"
                        "                   [-d D1,D2 [--kv-dtype f32|f16|bf16] [--kv-bits B1,B2] [--kv-group G]]\n");
        return 2;
    }
    char err[512];
    cinfer_model *m = NULL;
    cinfer_load_opts lo = { NULL, threads, 1 };
    if (cinfer_model_load(dir, &lo, &m, err, sizeof err) != CINFER_OK) {
        fprintf(stderr, "bench-model: %s\n", err);
        return 1;
    }
    cinfer_model_info mi;
    cinfer_model_get_info(m, &mi);
    if (depths) {   /* decode at depth: its own run */
        printf("model %s\nthreads %d\nbits_per_weight %.3f\ndecode_bytes_per_token %.0f\n", dir, threads,
               mi.bits_per_weight, decode_bytes(&mi));
        int rc = tg > 0 ? depth_bench(m, &mi, threads, depths, kv_dtype, kv_bits, kv_group, tg, reps) : 2;
        cinfer_model_free(m);
        return rc;
    }
    cinfer_ctx *c = NULL;
    cinfer_ctx_opts co = {.n_threads = threads, .kv_f16 = kv_f16};
    if (cinfer_ctx_new(m, &co, &c, err, sizeof err) != CINFER_OK) {
        fprintf(stderr, "bench-model: %s\n", err);
        cinfer_model_free(m);
        return 1;
    }
    int n_ids = pp > tg ? pp : tg;
    if (n_ids < 16) n_ids = 16;
    int32_t *ids = malloc(sizeof(int32_t) * (size_t)n_ids);
    float *logits = malloc(sizeof(float) * (size_t)mi.n_vocab);
    if (!ids || !logits) return 1;
    uint64_t s = 12345;
    for (int i = 0; i < n_ids; i++) {
        s = s * 6364136223846793005ull + 1442695040888963407ull;
        ids[i] = (int32_t)((s >> 33) % (uint64_t)mi.n_vocab);
    }

    int64_t layer_params = matmul_params(&mi, 0);
    printf("model %s\n", dir);
    printf("dtype %s\n", mi.weight_dtype);
    printf("weight_types %s\n", mi.weight_types);
    printf("bits_per_weight %.3f\n", mi.bits_per_weight);
    printf("threads %d\n", threads);
    printf("params %lld\n", (long long)mi.n_params);
    printf("layer_matmul_params %lld\n", (long long)layer_params);

    /* warm-up: pages of the mmap in, pool threads up */
    cinfer_ctx_reset(c);
    if (cinfer_eval(c, ids, 16, 0, logits) != CINFER_OK) return fail("warm-up", c);

    if (pp > 0) {
        double best = 1e30;
        for (int r = 0; r < reps; r++) {
            cinfer_ctx_reset(c);
            double t0 = now_s();
            if (cinfer_eval(c, ids, pp, 0, logits) != CINFER_OK) return fail("prefill", c);
            double t = now_s() - t0;
            if (t < best) best = t;
        }
        printf("pp%d_tok_s %.2f\n", pp, pp / best);
        printf("pp%d_GFLOP_s %.1f\n", pp, 2.0 * (double)layer_params * pp / best / 1e9);
    }
    if (tg > 0) {
        double best = 1e30;
        for (int r = 0; r < reps; r++) {
            cinfer_ctx_reset(c);
            double t0 = now_s();
            for (int i = 0; i < tg; i++)
                if (cinfer_eval(c, ids + i, 1, 0, logits) != CINFER_OK) return fail("decode", c);
            double t = now_s() - t0;
            if (t < best) best = t;
        }
        double bytes = decode_bytes(&mi);
        printf("tg%d_tok_s %.2f\n", tg, tg / best);
        printf("tg%d_GB_s %.1f\n", tg, bytes * tg / best / 1e9);
        printf("decode_bytes_per_token %.0f\n", bytes);
    }
    free(ids);
    free(logits);
    cinfer_ctx_free(c);
    cinfer_model_free(m);
    return 0;
}
