/*
 * gemv-avx512.c — AVX-512 matrix-vector kernels that read f32 / f16 / bf16
 * weights in place (contract: gemv.h).
 *
 * Widening to f32 is exact (bf16: zero-extend and shift left 16; f16:
 * vcvtph2ps), products accumulate in f32 FMAs: the result differs from the
 * scalar reference only by summation order. Activations are never rounded to
 * bf16 here (decode is bound by memory bandwidth, not by FMAs, so the exact
 * path costs nothing).
 *
 * Blocking: 4 weight rows x up to 4 tokens per pass (16 accumulators); for
 * n > 4 the same row block is reused from L1 for each next group of 4
 * tokens. The weight rows of one block are 4 separate streams, and hardware
 * prefetchers stop at 4 KiB page boundaries (one bf16 row of k=2048 is one
 * page), so each step also prefetches the next row block at the same offset.
 *
 * Compiled with function-level target attributes: built on any x86-64, only
 * called when __builtin_cpu_supports says avx512f+bw+vl (gemv-scalar.c).
 */
#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#include "backend/cpu/gemv.h"

#define TGT "avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,f16c"
#define INL static inline __attribute__((always_inline, target(TGT)))
#define KERNEL static __attribute__((target(TGT)))

/* 16 weights from element i of w, widened to f32 (full and masked) */
INL __m512 ld_f32(const void *w, int64_t i) { return _mm512_loadu_ps((const float *)w + i); }
INL __m512 ldm_f32(const void *w, int64_t i, __mmask16 m) {
    return _mm512_maskz_loadu_ps(m, (const float *)w + i);
}
INL __m512 ld_f16(const void *w, int64_t i) {
    return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)((const uint16_t *)w + i)));
}
INL __m512 ldm_f16(const void *w, int64_t i, __mmask16 m) {
    return _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, (const uint16_t *)w + i));
}
INL __m512 ld_bf16(const void *w, int64_t i) {
    __m256i h = _mm256_loadu_si256((const __m256i *)((const uint16_t *)w + i));
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}
INL __m512 ldm_bf16(const void *w, int64_t i, __mmask16 m) {
    __m256i h = _mm256_maskz_loadu_epi16(m, (const uint16_t *)w + i);
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

/* bytes ahead of the current row block to prefetch: the next block (4 rows) */
#define PF_ROWS 4

/* y[t*ldy + r + a] for a < R, t < NT over the whole k; R, NT are constants
 * after inlining (1..4). ES: element size in bytes (prefetch stride). */
#define BLOCK(NAME, ES)                                                                       \
    INL void blk_##NAME(const float *x, int64_t k, const void *w, int64_t r, const int R,     \
                        const int NT, int pf, float *y, int64_t ldy) {                        \
        __m512 acc[4][4];                                                                     \
        _Pragma("GCC unroll 4") for (int a = 0; a < R; a++)                                   \
            _Pragma("GCC unroll 4") for (int t = 0; t < NT; t++) acc[a][t] = _mm512_setzero_ps(); \
        const char *wb = (const char *)w + r * k * ES;                                        \
        int64_t i = 0;                                                                        \
        for (; i + 16 <= k; i += 16) {                                                        \
            __m512 wv[4];                                                                     \
            _Pragma("GCC unroll 4") for (int a = 0; a < R; a++) {                             \
                wv[a] = ld_##NAME(w, (r + a) * k + i);                                        \
                if (pf && ((i * ES) & 63) == 0)                                               \
                    _mm_prefetch(wb + ((PF_ROWS + a) * k + i) * ES, _MM_HINT_T0);             \
            }                                                                                 \
            _Pragma("GCC unroll 4") for (int t = 0; t < NT; t++) {                            \
                __m512 xv = _mm512_loadu_ps(x + t * k + i);                                   \
                _Pragma("GCC unroll 4") for (int a = 0; a < R; a++)                           \
                    acc[a][t] = _mm512_fmadd_ps(wv[a], xv, acc[a][t]);                        \
            }                                                                                 \
        }                                                                                     \
        if (i < k) {                                                                          \
            __mmask16 m = (__mmask16)((1u << (k - i)) - 1);                                   \
            __m512 wv[4];                                                                     \
            _Pragma("GCC unroll 4") for (int a = 0; a < R; a++)                               \
                wv[a] = ldm_##NAME(w, (r + a) * k + i, m);                                    \
            _Pragma("GCC unroll 4") for (int t = 0; t < NT; t++) {                            \
                __m512 xv = _mm512_maskz_loadu_ps(m, x + t * k + i);                          \
                _Pragma("GCC unroll 4") for (int a = 0; a < R; a++)                           \
                    acc[a][t] = _mm512_fmadd_ps(wv[a], xv, acc[a][t]);                        \
            }                                                                                 \
        }                                                                                     \
        _Pragma("GCC unroll 4") for (int a = 0; a < R; a++)                                   \
            _Pragma("GCC unroll 4") for (int t = 0; t < NT; t++)                              \
                y[t * ldy + r + a] = _mm512_reduce_add_ps(acc[a][t]);                         \
    }

/* the kernel: row blocks of 4 (then single rows), token groups of up to 4 */
#define GEMV(NAME)                                                                            \
    KERNEL void gemv_##NAME##_avx512(const float *x, int n, int64_t k, const void *w,         \
                                     int64_t r0, int64_t r1, float *y, int64_t ldy) {         \
        int64_t r = r0;                                                                       \
        for (; r + 4 <= r1; r += 4) {                                                         \
            int pf = r + 4 + PF_ROWS <= r1;                                                   \
            for (int t = 0; t < n; t += 4) {                                                  \
                const float *xt = x + (int64_t)t * k;                                         \
                float *yt = y + (int64_t)t * ldy;                                             \
                int p = pf && t == 0;                                                         \
                switch (n - t) {                                                              \
                case 1: blk_##NAME(xt, k, w, r, 4, 1, p, yt, ldy); break;                     \
                case 2: blk_##NAME(xt, k, w, r, 4, 2, p, yt, ldy); break;                     \
                case 3: blk_##NAME(xt, k, w, r, 4, 3, p, yt, ldy); break;                     \
                default: blk_##NAME(xt, k, w, r, 4, 4, p, yt, ldy); break;                    \
                }                                                                             \
            }                                                                                 \
        }                                                                                     \
        for (; r < r1; r++)                                                                   \
            for (int t = 0; t < n; t += 4) {                                                  \
                const float *xt = x + (int64_t)t * k;                                         \
                float *yt = y + (int64_t)t * ldy;                                             \
                switch (n - t) {                                                              \
                case 1: blk_##NAME(xt, k, w, r, 1, 1, 0, yt, ldy); break;                     \
                case 2: blk_##NAME(xt, k, w, r, 1, 2, 0, yt, ldy); break;                     \
                case 3: blk_##NAME(xt, k, w, r, 1, 3, 0, yt, ldy); break;                     \
                default: blk_##NAME(xt, k, w, r, 1, 4, 0, yt, ldy); break;                    \
                }                                                                             \
            }                                                                                 \
    }

BLOCK(f32, 4)
BLOCK(f16, 2)
BLOCK(bf16, 2)
GEMV(f32)
GEMV(f16)
GEMV(bf16)

/* row conversion for the GEMM path: 16 elements per step, masked tail */
#define ROWS(NAME)                                                                            \
    KERNEL void rows_##NAME##_avx512(const void *w, int64_t k, int64_t r0, int64_t r1,        \
                                     float *dst) {                                            \
        int64_t n = (r1 - r0) * k, i = 0, b = r0 * k;                                         \
        for (; i + 16 <= n; i += 16) _mm512_storeu_ps(dst + i, ld_##NAME(w, b + i));          \
        if (i < n) {                                                                          \
            __mmask16 m = (__mmask16)((1u << (n - i)) - 1);                                   \
            _mm512_mask_storeu_ps(dst + i, m, ldm_##NAME(w, b + i, m));                       \
        }                                                                                     \
    }
ROWS(f32)
ROWS(f16)
ROWS(bf16)

const gemv_kernels gemv_avx512_kernels = {
    "avx512",
    { gemv_f32_avx512, gemv_f16_avx512, gemv_bf16_avx512 },
    { rows_f32_avx512, rows_f16_avx512, rows_bf16_avx512 },
};
#endif
