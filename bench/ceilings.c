/*
 * ceilings.c — the machine's limits that cinfer's CPU speed is judged against.
 *
 *   memory read bandwidth: a large buffer (default 1 GiB, far above the L3) is
 *     summed with wide vector loads by 1 and by 2 threads (each thread reads its
 *     own half, as 4 streams side by side); best of several passes. Decode is
 *     bound by this: every token reads all the weights once.
 *   OpenBLAS sgemm: C[M][N] = A[M][K] . B[N][K]^T in f32 (default
 *     512x2048x2048, a prefill-sized projection) with 1 and 2 OpenBLAS
 *     threads, and as 2 threads each running a 1-thread sgemm on half of N
 *     (how cinfer splits prefill); best of several calls. Prefill is bound
 *     by this.
 *
 * Output: one "key value" line per figure (bench scripts grep them), e.g.
 *   read_GBs_1t 21.4
 *   sgemm_GFLOPs_2t 187.0
 * usage: ceilings [--mb N] [--m M --n N --k K] [--reps R]
 */
#include <cblas.h>
#include <immintrin.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

typedef struct {
    const uint8_t *p;
    size_t n;          /* bytes, multiple of 256 */
    uint64_t sink;
    pthread_barrier_t *bar;
    double t0, t1;
} rd_job;

/* sums n bytes as 64-bit lanes, read as RD_STREAMS sequential streams side
 * by side (the n bytes cut in RD_STREAMS parts, 128 bytes of each per step),
 * one accumulator each: on the 2-core Zen 4 VM one stream per thread
 * under-reads by ~10-25% (the hardware prefetchers keep few lines in flight
 * for a single stream); cinfer's decode GEMV reads this way too
 * (gemv-avx512.c). The bytes between the parts (RD_SKEW each) and after the
 * last are read at the end. */
#define RD_STREAMS 4
#define RD_SKEW (65536 + 64)   /* gap between the streams: a power of two apart they alias and read slower */
__attribute__((target("avx512f")))
static uint64_t sum_avx512(const uint8_t *p, size_t n) {
    size_t skew = n >= (size_t)16 * RD_SKEW * RD_STREAMS ? RD_SKEW : 0;
    size_t part = (n - skew * (RD_STREAMS - 1)) / RD_STREAMS / 128 * 128;
    __m512i a[RD_STREAMS];
    for (int s = 0; s < RD_STREAMS; s++) a[s] = _mm512_setzero_si512();
    for (size_t i = 0; i < part; i += 128)
        for (int s = 0; s < RD_STREAMS; s++) {
            const uint8_t *q = p + (size_t)s * (part + skew) + i;
            a[s] = _mm512_add_epi64(a[s], _mm512_add_epi64(_mm512_load_si512((const void *)q),
                                                           _mm512_load_si512((const void *)(q + 64))));
        }
    for (int s = 0; s < RD_STREAMS; s++)   /* the gaps and the rest (n is a multiple of 256) */
        for (size_t i = (size_t)s * (part + skew) + part, e = s + 1 < RD_STREAMS ? (size_t)(s + 1) * (part + skew) : n;
             i < e; i += 64)
            a[0] = _mm512_add_epi64(a[0], _mm512_load_si512((const void *)(p + i)));
    for (int s = 1; s < RD_STREAMS; s++) a[0] = _mm512_add_epi64(a[0], a[s]);
    return (uint64_t)_mm512_reduce_add_epi64(a[0]);
}

__attribute__((target("avx2")))
static uint64_t sum_avx2(const uint8_t *p, size_t n) {
    __m256i a0 = _mm256_setzero_si256(), a1 = a0, a2 = a0, a3 = a0;
    for (size_t i = 0; i < n; i += 128) {
        a0 = _mm256_add_epi64(a0, _mm256_load_si256((const void *)(p + i)));
        a1 = _mm256_add_epi64(a1, _mm256_load_si256((const void *)(p + i + 32)));
        a2 = _mm256_add_epi64(a2, _mm256_load_si256((const void *)(p + i + 64)));
        a3 = _mm256_add_epi64(a3, _mm256_load_si256((const void *)(p + i + 96)));
    }
    a0 = _mm256_add_epi64(_mm256_add_epi64(a0, a1), _mm256_add_epi64(a2, a3));
    uint64_t t[4];
    _mm256_storeu_si256((void *)t, a0);
    return t[0] + t[1] + t[2] + t[3];
}

static uint64_t sum_any(const uint8_t *p, size_t n) {
    if (__builtin_cpu_supports("avx512f")) return sum_avx512(p, n);
    if (__builtin_cpu_supports("avx2")) return sum_avx2(p, n);
    uint64_t s = 0;
    for (size_t i = 0; i < n; i += 8) { uint64_t v; memcpy(&v, p + i, 8); s += v; }
    return s;
}

static void *rd_thread(void *arg) {
    rd_job *j = arg;
    pthread_barrier_wait(j->bar);
    j->t0 = now_s();
    j->sink += sum_any(j->p, j->n);
    j->t1 = now_s();
    return NULL;
}

/* GB/s reading buf[bytes] with nt threads, best of reps */
static double read_bw(const uint8_t *buf, size_t bytes, int nt, int reps, uint64_t *sink) {
    double best = 0;
    for (int r = 0; r < reps; r++) {
        pthread_t th[8];
        rd_job jobs[8];
        pthread_barrier_t bar;
        pthread_barrier_init(&bar, NULL, (unsigned)nt);
        size_t part = bytes / (size_t)nt / 256 * 256;
        for (int t = 0; t < nt; t++) {
            jobs[t] = (rd_job){ buf + part * (size_t)t, part, 0, &bar, 0, 0 };
            if (t) pthread_create(&th[t], NULL, rd_thread, &jobs[t]);
        }
        rd_thread(&jobs[0]);
        double t0 = jobs[0].t0, t1 = jobs[0].t1;
        for (int t = 1; t < nt; t++) {
            pthread_join(th[t], NULL);
            if (jobs[t].t0 < t0) t0 = jobs[t].t0;
            if (jobs[t].t1 > t1) t1 = jobs[t].t1;
        }
        for (int t = 0; t < nt; t++) *sink += jobs[t].sink;
        pthread_barrier_destroy(&bar);
        double gbs = (double)part * nt / (t1 - t0) / 1e9;
        if (gbs > best) best = gbs;
    }
    return best;
}

typedef struct {
    int M, N, K;
    const float *A, *B;
    float *C;
    int ldc;
    pthread_barrier_t *bar;
} sg_job;

static void *sg_thread(void *arg) {
    sg_job *j = arg;
    pthread_barrier_wait(j->bar);
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, j->M, j->N, j->K, 1.f, j->A, j->K, j->B, j->K,
                0.f, j->C, j->ldc);
    return NULL;
}

/* nt threads each run a single-threaded sgemm on its own N/nt columns (the
 * way cinfer's CPU matmul splits prefill) */
static double sgemm_split_rate(const float *A, const float *B, float *C, int M, int N, int K, int nt,
                               int reps) {
    openblas_set_num_threads(1);
    double best = 0;
    for (int r = 0; r <= reps; r++) {
        pthread_t th[8];
        sg_job jobs[8];
        pthread_barrier_t bar;
        pthread_barrier_init(&bar, NULL, (unsigned)nt);
        double t0 = now_s();
        for (int t = 0; t < nt; t++) {
            int n0 = N * t / nt, n1 = N * (t + 1) / nt;
            jobs[t] = (sg_job){ M, n1 - n0, K, A, B + (size_t)n0 * K, C + n0, N, &bar };
            if (t) pthread_create(&th[t], NULL, sg_thread, &jobs[t]);
        }
        sg_thread(&jobs[0]);
        for (int t = 1; t < nt; t++) pthread_join(th[t], NULL);
        double g = 2.0 * M * N * K / (now_s() - t0) / 1e9;
        pthread_barrier_destroy(&bar);
        if (r && g > best) best = g;   /* r = 0 is the warm-up */
    }
    return best;
}

static double sgemm_rate(int M, int N, int K, int nt, int reps) {
    float *A = aligned_alloc(64, (size_t)M * K * sizeof(float));
    float *B = aligned_alloc(64, (size_t)K * N * sizeof(float));
    float *C = aligned_alloc(64, (size_t)M * N * sizeof(float));
    if (!A || !B || !C) { free(A); free(B); free(C); return 0; }
    for (size_t i = 0; i < (size_t)M * K; i++) A[i] = (float)((i * 7919) % 1000) * 1e-3f - 0.5f;
    for (size_t i = 0; i < (size_t)K * N; i++) B[i] = (float)((i * 104729) % 1000) * 1e-3f - 0.5f;
    openblas_set_num_threads(nt);
    /* the shape cinfer runs: x[M][K] . W[N][K]^T */
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, M, N, K, 1.f, A, K, B, K, 0.f, C, N);
    double best = 0;
    for (int r = 0; r < reps; r++) {
        double t0 = now_s();
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, M, N, K, 1.f, A, K, B, K, 0.f, C, N);
        double g = 2.0 * M * N * K / (now_s() - t0) / 1e9;
        if (g > best) best = g;
    }
    if (nt > 1) {
        double split = sgemm_split_rate(A, B, C, M, N, K, nt, reps);
        printf("sgemm_GFLOPs_%dx1t %.1f\n", nt, split);
    }
    free(A); free(B); free(C);
    return best;
}

int main(int argc, char **argv) {
    size_t mb = 1024;
    int M = 512, N = 2048, K = 2048, reps = 5;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--mb")) mb = (size_t)atol(argv[i + 1]);
        else if (!strcmp(argv[i], "--m")) M = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--n")) N = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--k")) K = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--reps")) reps = atoi(argv[i + 1]);
        else { fprintf(stderr, "usage: ceilings [--mb N] [--m M --n N --k K] [--reps R]\n"); return 2; }
    }
    size_t bytes = mb << 20;
    uint8_t *buf = aligned_alloc(4096, bytes);
    if (!buf) { fprintf(stderr, "ceilings: cannot allocate %zu MiB\n", mb); return 1; }
    for (size_t i = 0; i < bytes; i += 8) { uint64_t v = i * 0x9E3779B97F4A7C15ull; memcpy(buf + i, &v, 8); }
    uint64_t sink = 0;
    printf("read_MiB %zu\n", mb);
    printf("read_GBs_1t %.1f\n", read_bw(buf, bytes, 1, reps, &sink));
    printf("read_GBs_2t %.1f\n", read_bw(buf, bytes, 2, reps, &sink));
    free(buf);
    printf("sgemm_shape %dx%dx%d\n", M, N, K);
    printf("sgemm_GFLOPs_1t %.1f\n", sgemm_rate(M, N, K, 1, reps));
    double two = sgemm_rate(M, N, K, 2, reps);   /* prints the 2x1t split figure first */
    printf("sgemm_GFLOPs_2t %.1f\n", two);
    fprintf(stderr, "(sink %llu)\n", (unsigned long long)(sink & 1));
    return 0;
}
