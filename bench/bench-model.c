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
 * usage: bench-model -m DIR [-t THREADS] [-p 512] [-n 128] [-r 3] [--kv-f16]
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

int main(int argc, char **argv) {
    const char *dir = NULL;
    int threads = 0, pp = 512, tg = 128, reps = 3, kv_f16 = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "-m") && v) dir = argv[++i];
        else if (!strcmp(a, "-t") && v) threads = atoi(argv[++i]);
        else if (!strcmp(a, "-p") && v) pp = atoi(argv[++i]);
        else if (!strcmp(a, "-n") && v) tg = atoi(argv[++i]);
        else if (!strcmp(a, "-r") && v) reps = atoi(argv[++i]);
        else if (!strcmp(a, "--kv-f16")) kv_f16 = 1;
        else { dir = NULL; break; }
    }
    if (!dir || reps < 1 || pp < 0 || tg < 0) {
        fprintf(stderr, "usage: bench-model -m DIR [-t THREADS] [-p 512] [-n 128] [-r 3] [--kv-f16]\n");
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

    int64_t q = (int64_t)mi.n_head * mi.head_dim, kv = (int64_t)mi.n_kv_head * mi.head_dim;
    int64_t layer_params = (int64_t)mi.n_layer *
                           ((int64_t)mi.hidden * (q + 2 * kv) + q * mi.hidden + 3 * (int64_t)mi.hidden * mi.ffn);
    int64_t head_params = (int64_t)mi.n_vocab * mi.hidden;
    /* bytes per weight as stored: 4 / 2 for dense types; codes + scales + biases for MLX affine ones */
    double esize = mi.bits_per_weight / 8;
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
        double bytes = (double)(layer_params + head_params) * esize;
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
