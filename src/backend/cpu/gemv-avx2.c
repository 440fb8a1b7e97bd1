/*
 * gemv-avx2.c — AVX2 + FMA + F16C matrix-vector kernels that read f32 / f16 /
 * bf16 weights in place (contract: gemv.h); for x86-64 CPUs without AVX-512.
 *
 * Same scheme as gemv-avx512.c at 8 lanes: exact widening to f32 (bf16:
 * zero-extend + shift 16; f16: vcvtph2ps), f32 FMAs. With 16 ymm registers
 * the block is 4 weight rows x up to 2 tokens (8 accumulators); k tails are
 * finished in scalar code.
 *
 * Function-level target attributes; called only when __builtin_cpu_supports
 * reports avx2, fma and f16c (gemv-scalar.c).
 */
#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#include "backend/cpu/gemv.h"
#include "backend/cpu/avx2.h"
#define KERNEL static __attribute__((target(TGT)))

INL __m256 ld_f32(const void *w, int64_t i) { return _mm256_loadu_ps((const float *)w + i); }
INL __m256 ld_f16(const void *w, int64_t i) {
    return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)((const uint16_t *)w + i)));
}
INL __m256 ld_bf16(const void *w, int64_t i) {
    __m128i h = _mm_loadu_si128((const __m128i *)((const uint16_t *)w + i));
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}
INL float s_f32(const void *w, int64_t i) { return ((const float *)w)[i]; }
INL float s_f16(const void *w, int64_t i) {
    return _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(((const uint16_t *)w)[i])));
}
INL float s_bf16(const void *w, int64_t i) { return be_bf16_to_f32(((const uint16_t *)w)[i]); }


#define BLOCK(NAME, ES)                                                                       \
    INL void blk_##NAME(const float *x, int64_t k, const void *w, int64_t r, const int R,     \
                        const int NT, int pf, float *y, int64_t ldy) {                        \
        __m256 acc[4][2];                                                                     \
        _Pragma("GCC unroll 4") for (int a = 0; a < R; a++)                                   \
            _Pragma("GCC unroll 2") for (int t = 0; t < NT; t++) acc[a][t] = _mm256_setzero_ps(); \
        const char *wb = (const char *)w + r * k * ES;                                        \
        int64_t i = 0;                                                                        \
        for (; i + 8 <= k; i += 8) {                                                          \
            __m256 wv[4];                                                                     \
            _Pragma("GCC unroll 4") for (int a = 0; a < R; a++) {                             \
                wv[a] = ld_##NAME(w, (r + a) * k + i);                                        \
                if (pf && ((i * ES) & 63) == 0)                                               \
                    _mm_prefetch(wb + ((4 + a) * k + i) * ES, _MM_HINT_T0);                   \
            }                                                                                 \
            _Pragma("GCC unroll 2") for (int t = 0; t < NT; t++) {                            \
                __m256 xv = _mm256_loadu_ps(x + t * k + i);                                   \
                _Pragma("GCC unroll 4") for (int a = 0; a < R; a++)                           \
                    acc[a][t] = _mm256_fmadd_ps(wv[a], xv, acc[a][t]);                        \
            }                                                                                 \
        }                                                                                     \
        _Pragma("GCC unroll 4") for (int a = 0; a < R; a++)                                   \
            _Pragma("GCC unroll 2") for (int t = 0; t < NT; t++) {                            \
                float s = hsum(acc[a][t]);                                                    \
                for (int64_t j = i; j < k; j++) s += x[t * k + j] * s_##NAME(w, (r + a) * k + j); \
                y[t * ldy + r + a] = s;                                                       \
            }                                                                                 \
    }                                                                                         \
    KERNEL void gemv_##NAME##_avx2(const float *x, int n, const be_mat *wm,           \
                                   int64_t r0, int64_t r1, float *y, int64_t ldy) { \
        int64_t k = wm->cols; const void *w = wm->data;           \
        int64_t r = r0;                                                                       \
        for (; r + 4 <= r1; r += 4) {                                                         \
            int pf = r + 8 <= r1;                                                             \
            for (int t = 0; t < n; t += 2) {                                                  \
                int p = pf && t == 0;                                                         \
                if (n - t == 1) blk_##NAME(x + (int64_t)t * k, k, w, r, 4, 1, p, y + t * ldy, ldy); \
                else blk_##NAME(x + (int64_t)t * k, k, w, r, 4, 2, p, y + t * ldy, ldy);      \
            }                                                                                 \
        }                                                                                     \
        for (; r < r1; r++)                                                                   \
            for (int t = 0; t < n; t += 2) {                                                  \
                if (n - t == 1) blk_##NAME(x + (int64_t)t * k, k, w, r, 1, 1, 0, y + t * ldy, ldy); \
                else blk_##NAME(x + (int64_t)t * k, k, w, r, 1, 2, 0, y + t * ldy, ldy);      \
            }                                                                                 \
    }                                                                                         \
    KERNEL void rows_##NAME##_avx2(const be_mat *wm, int64_t r0, int64_t r1, float *dst) { \
        int64_t k = wm->cols; const void *w = wm->data; \
        int64_t n = (r1 - r0) * k, i = 0, b = r0 * k;                                         \
        for (; i + 8 <= n; i += 8) _mm256_storeu_ps(dst + i, ld_##NAME(w, b + i));            \
        for (; i < n; i++) dst[i] = s_##NAME(w, b + i);                                       \
    }

BLOCK(f32, 4)
BLOCK(f16, 2)
BLOCK(bf16, 2)

const gemv_kernels gemv_avx2_kernels = {
    "avx2",
    { gemv_f32_avx2, gemv_f16_avx2, gemv_bf16_avx2, AFFINE_ENTRIES(gemv, avx2) },
    { rows_f32_avx2, rows_f16_avx2, rows_bf16_avx2, AFFINE_ENTRIES(rows, avx2) },
    { NULL, NULL, NULL },
};
#endif
