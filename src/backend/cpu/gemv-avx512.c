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
 * Blocking, decode (n == 1): a row range [r0, r1) is cut into DS equal
 * parts that are walked side by side, one row of each per step (rows r,
 * r+h, r+2h, r+3h): DS long sequential streams in flight per thread. On the
 * 2-core Zen 4 VM this reads ~10-25% faster than one stream per thread and
 * reaches the speed of a pure read of the same bytes (adjacent rows
 * interleaved do not help: those streams are cut every 4 KiB page, where
 * the hardware prefetchers stop). Software prefetch measured no better.
 * h is made odd: streams a power of two of bytes apart (rows of 4 KiB, h
 * even) alias and read slower (bf16 +5-15% at 1 thread). Rows left over take
 * the one-row path.
 * Several tokens (n > 1): one weight row x up to 4 tokens per pass; for
 * n > 4 the row is re-read from L1 for each next group of 4 tokens.
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

/* one token's row r from element i on (what the 64-element loop leaves): masked 16-lane steps
 * into acc[0], then the sum (acc0 + acc1) + (acc2 + acc3). blk and streams both end this way, so a
 * token's result never depends on how many tokens the call has (batch invariance). */
#define TAIL(NAME)                                                                            \
    INL float tail_##NAME(const float *x, int64_t k, const void *w, int64_t r, int64_t i, __m512 *acc) { \
        for (; i < k; i += 16) {                                                              \
            int64_t left = k - i;                                                             \
            __mmask16 m = left >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << left) - 1);     \
            acc[0] = _mm512_fmadd_ps(ldm_##NAME(w, r * k + i, m), _mm512_maskz_loadu_ps(m, x + i), acc[0]); \
        }                                                                                     \
        return _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(acc[0], acc[1]), _mm512_add_ps(acc[2], acc[3]))); \
    }

/* y[t*ldy + r] for t < NT over the whole k of one row; NT is a constant
 * after inlining (1..4). Four 16-lane steps per iteration (4*NT accumulators)
 * keep enough FMAs in flight for n = 1. */
#define BLOCK(NAME)                                                                           \
    INL void blk_##NAME(const float *x, int64_t k, const void *w, int64_t r, const int NT,    \
                        float *y, int64_t ldy) {                                              \
        __m512 acc[4][4];                                                                     \
        _Pragma("GCC unroll 4") for (int t = 0; t < NT; t++)                                  \
            _Pragma("GCC unroll 4") for (int u = 0; u < 4; u++) acc[t][u] = _mm512_setzero_ps(); \
        const int64_t b = r * k;                                                              \
        int64_t i = 0;                                                                        \
        for (; i + 64 <= k; i += 64) {                                                        \
            __m512 wv[4];                                                                     \
            _Pragma("GCC unroll 4") for (int u = 0; u < 4; u++) wv[u] = ld_##NAME(w, b + i + 16 * u); \
            _Pragma("GCC unroll 4") for (int t = 0; t < NT; t++)                              \
                _Pragma("GCC unroll 4") for (int u = 0; u < 4; u++)                           \
                    acc[t][u] = _mm512_fmadd_ps(wv[u], _mm512_loadu_ps(x + t * k + i + 16 * u), acc[t][u]); \
        }                                                                                     \
        _Pragma("GCC unroll 4") for (int t = 0; t < NT; t++)                                  \
            y[t * ldy + r] = tail_##NAME(x + t * k, k, w, r, i, acc[t]);                      \
    }

/* decode: y[r + s*h] for the DS rows r + s*h (s < DS), 64 elements of each per step (LD2 gives
 * 32 as two 16-lane halves, in the order x is in), four accumulators per row as blk's, and blk's
 * tail: each row's sum is the same as blk gives it (a token alone equals it in a batch). */
#define DS 4
#define STREAMS(NAME, LD2)                                                                    \
    INL void streams_##NAME(const float *x, int64_t k, const void *w, int64_t r, int64_t h,  \
                            float *y) {                                                       \
        __m512 acc[DS][4];                                                                    \
        _Pragma("GCC unroll 4") for (int s = 0; s < DS; s++)                                  \
            acc[s][0] = acc[s][1] = acc[s][2] = acc[s][3] = _mm512_setzero_ps();              \
        int64_t i = 0;                                                                        \
        for (; i + 64 <= k; i += 64) {                                                        \
            __m512 x0 = _mm512_loadu_ps(x + i), x1 = _mm512_loadu_ps(x + i + 16);             \
            __m512 x2 = _mm512_loadu_ps(x + i + 32), x3 = _mm512_loadu_ps(x + i + 48);        \
            _Pragma("GCC unroll 4") for (int s = 0; s < DS; s++) {                            \
                __m512 a, b, c, d;                                                            \
                LD2(w, (r + s * h) * k + i, a, b);                                            \
                LD2(w, (r + s * h) * k + i + 32, c, d);                                       \
                acc[s][0] = _mm512_fmadd_ps(a, x0, acc[s][0]);                                \
                acc[s][1] = _mm512_fmadd_ps(b, x1, acc[s][1]);                                \
                acc[s][2] = _mm512_fmadd_ps(c, x2, acc[s][2]);                                \
                acc[s][3] = _mm512_fmadd_ps(d, x3, acc[s][3]);                                \
            }                                                                                 \
        }                                                                                     \
        _Pragma("GCC unroll 4") for (int s = 0; s < DS; s++)                                  \
            y[r + s * h] = tail_##NAME(x, k, w, r + s * h, i, acc[s]);                        \
    }
/* two 16-lane halves of 32 weights at element o: natural order (f32, f16) */
#define LD2_F32(w_, o_, a, b) ((a) = ld_f32(w_, o_), (b) = ld_f32(w_, (o_) + 16))
#define LD2_F16(w_, o_, a, b) ((a) = ld_f16(w_, o_), (b) = ld_f16(w_, (o_) + 16))

/* the kernel: one row at a time (the rows of a range are one sequential
 * stream, which the hardware prefetchers follow best), token groups of <= 4
 * (the row is re-read from L1 for each next group) */
#define GEMV(NAME)                                                                            \
    KERNEL void gemv_##NAME##_avx512(const float *x, int n, const be_mat *wm,         \
                                     int64_t r0, int64_t r1, float *y, int64_t ldy) { \
        int64_t k = wm->cols; const void *w = wm->data;         \
        if (n == 1) { /* decode: DS streams, then the rows left over one by one */           \
            int64_t h = (r1 - r0) / DS;                                                       \
            h -= h > 1 && !(h & 1); /* odd: streams a power of two apart read slower */        \
            for (int64_t r = r0; r < r0 + h; r++) streams_##NAME(x, k, w, r, h, y);           \
            for (int64_t r = r0 + DS * h; r < r1; r++) blk_##NAME(x, k, w, r, 1, y, ldy);     \
            return;                                                                           \
        }                                                                                     \
        for (int64_t r = r0; r < r1; r++)                                                     \
            for (int t = 0; t < n; t += 4) {                                                  \
                const float *xt = x + (int64_t)t * k;                                         \
                float *yt = y + (int64_t)t * ldy;                                             \
                switch (n - t) {                                                              \
                case 1: blk_##NAME(xt, k, w, r, 1, yt, ldy); break;                           \
                case 2: blk_##NAME(xt, k, w, r, 2, yt, ldy); break;                           \
                case 3: blk_##NAME(xt, k, w, r, 3, yt, ldy); break;                           \
                default: blk_##NAME(xt, k, w, r, 4, yt, ldy); break;                          \
                }                                                                             \
            }                                                                                 \
    }

TAIL(f32)
TAIL(f16)
BLOCK(f32)
BLOCK(f16)
STREAMS(f32, LD2_F32)
STREAMS(f16, LD2_F16)
GEMV(f32)
GEMV(f16)

/* bf16: whole 512-bit loads of 32 weights, split into the even elements
 * (low halves of the 32-bit lanes, shifted up) and the odd ones (high halves,
 * masked): no widening shuffle, one load per cache line. x comes rearranged by
 * prep_bf16 so each 32-block holds its 16 even elements, then its 16 odd
 * ones; a tail of k % 32 stays in natural order and takes the masked path. */
INL __m512 bf_even(__m512i u) { return _mm512_castsi512_ps(_mm512_slli_epi32(u, 16)); }
INL __m512 bf_odd(__m512i u) {
    return _mm512_castsi512_ps(_mm512_and_si512(u, _mm512_set1_epi32((int)0xffff0000u)));
}

/* bf16's tail after the 64-element loop: a 32-block (even, odd halves), then masked 16-lane steps
 * in natural order; the sum as TAIL's */
INL float tail_bf16(const float *x, int64_t k, const void *w, int64_t r, int64_t i, __m512 *acc) {
    const uint16_t *wr = (const uint16_t *)w + r * k;
    if (i + 32 <= k) {
        __m512i u0 = _mm512_loadu_si512(wr + i);
        acc[0] = _mm512_fmadd_ps(bf_even(u0), _mm512_loadu_ps(x + i), acc[0]);
        acc[1] = _mm512_fmadd_ps(bf_odd(u0), _mm512_loadu_ps(x + i + 16), acc[1]);
        i += 32;
    }
    for (; i < k; i += 16) {
        int64_t left = k - i;
        __mmask16 m = left >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << left) - 1);
        acc[2] = _mm512_fmadd_ps(ldm_bf16(w, r * k + i, m), _mm512_maskz_loadu_ps(m, x + i), acc[2]);
    }
    return _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(acc[0], acc[1]), _mm512_add_ps(acc[2], acc[3])));
}

INL void blk_bf16(const float *x, int64_t k, const void *w, int64_t r, const int NT, float *y,
                  int64_t ldy) {
    __m512 acc[4][4];
    _Pragma("GCC unroll 4") for (int t = 0; t < NT; t++)
        _Pragma("GCC unroll 4") for (int u = 0; u < 4; u++) acc[t][u] = _mm512_setzero_ps();
    const uint16_t *wr = (const uint16_t *)w + r * k;
    int64_t i = 0;
    for (; i + 64 <= k; i += 64) {
        __m512i u0 = _mm512_loadu_si512(wr + i), u1 = _mm512_loadu_si512(wr + i + 32);
        __m512 wv[4] = { bf_even(u0), bf_odd(u0), bf_even(u1), bf_odd(u1) };
        _Pragma("GCC unroll 4") for (int t = 0; t < NT; t++)
            _Pragma("GCC unroll 4") for (int u = 0; u < 4; u++)
                acc[t][u] = _mm512_fmadd_ps(wv[u], _mm512_loadu_ps(x + t * k + i + 16 * u), acc[t][u]);
    }
    _Pragma("GCC unroll 4") for (int t = 0; t < NT; t++) y[t * ldy + r] = tail_bf16(x + t * k, k, w, r, i, acc[t]);
}
/* bf16 halves: the even and the odd elements of one 64-byte load (x is
 * rearranged to match by prep_bf16) */
#define LD2_BF16(w_, o_, a, b)                                                                \
    do {                                                                                      \
        __m512i u_ = _mm512_loadu_si512((const uint16_t *)(w_) + (o_));                       \
        (a) = bf_even(u_);                                                                    \
        (b) = bf_odd(u_);                                                                     \
    } while (0)
STREAMS(bf16, LD2_BF16)
GEMV(bf16)

KERNEL void prep_bf16_avx512(const float *x, int n, int64_t k, float *xp) {
    const __m512i ev = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
    const __m512i od = _mm512_setr_epi32(1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31);
    for (int t = 0; t < n; t++) {
        const float *a = x + (int64_t)t * k;
        float *o = xp + (int64_t)t * k;
        int64_t i = 0;
        for (; i + 32 <= k; i += 32) {
            __m512 lo = _mm512_loadu_ps(a + i), hi = _mm512_loadu_ps(a + i + 16);
            _mm512_storeu_ps(o + i, _mm512_permutex2var_ps(lo, ev, hi));
            _mm512_storeu_ps(o + i + 16, _mm512_permutex2var_ps(lo, od, hi));
        }
        for (; i < k; i++) o[i] = a[i];
    }
}

/* row conversion for the GEMM path: 16 elements per step, masked tail */
#define ROWS(NAME)                                                                            \
    KERNEL void rows_##NAME##_avx512(const be_mat *wm, int64_t r0, int64_t r1,        \
                                     float *dst) { \
        int64_t k = wm->cols; const void *w = wm->data;                                            \
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
    { gemv_f32_avx512, gemv_f16_avx512, gemv_bf16_avx512, AFFINE_ENTRIES(gemv, avx512) },
    { rows_f32_avx512, rows_f16_avx512, rows_bf16_avx512, AFFINE_ENTRIES(rows, avx2) },
    { NULL, NULL, prep_bf16_avx512 },
};
#endif
