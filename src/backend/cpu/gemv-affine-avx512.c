/*
 * gemv-affine-avx512.c — AVX-512 decode kernels for MLX affine-quantized
 * weights (BE_Q2..BE_Q8), the gemv entries of the avx512 set (gemv.h; the
 * prefill row conversion stays gemv-affine.c's AVX2 one). Same arithmetic as
 * gemv-affine.c: per group s * sum_i x_i q_i + b * sum_i x_i, f32 FMAs,
 * activations stay f32; only the vector width differs (16 codes a step).
 *
 * The decoder turns 16 codes (2 * bits bytes: 16 codes of any width fill
 * whole bytes) into 16 f32 lanes with one byte shuffle for every width: the
 * 16 bytes at the codes are broadcast to the four 128-bit lanes, lane j takes
 * bytes (j*bits)/8 and the next (8 bits: that byte alone) as a 16-bit value,
 * shifted right by (j*bits)%8 and masked. A 16-byte load past the end of the
 * matrix is avoided by copying that block.
 *
 * Why: with f32 activations the 4-bit decode is bound by the work per code
 * (a conversion and an FMA each), not by the bytes it reads (BENCHMARKS.md,
 * issue 11's CPU table: 0.59x llama.cpp with the AVX2 kernel); 16 lanes halve
 * the instructions per code.
 *
 * Compiled with function-level target attributes: built on any x86-64, only
 * called when the avx512 set is picked (gemv-scalar.c).
 */
#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#include <string.h>
#include "backend/cpu/gemv.h"
#include "quant/affine.h"

#define TGT5 "avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,f16c"
#define INL5 static inline __attribute__((always_inline, target(TGT5)))
#define XS_MAX 4096   /* group sums of x kept on the stack: tokens x groups */

typedef struct dec16_t { __m512i shuf, shift, mask; } dec16_t;

INL5 dec16_t dec16_init(int bits) {
    uint8_t sh[64];
    uint32_t s[16];
    for (int j = 0; j < 16; j++) {
        int o = j * bits / 8;
        sh[4 * j] = (uint8_t)o;
        sh[4 * j + 1] = bits < 8 ? (uint8_t)(o + 1) : 0x80;
        sh[4 * j + 2] = sh[4 * j + 3] = 0x80;
        s[j] = (uint32_t)(j * bits % 8);
    }
    dec16_t d;
    d.shuf = _mm512_loadu_si512(sh);
    d.shift = _mm512_loadu_si512(s);
    d.mask = _mm512_set1_epi32((1 << bits) - 1);
    return d;
}

/* 16 codes starting at p (2 * bits bytes) as floats */
INL5 __m512 dec16(const dec16_t *d, const uint8_t *p, const int bits, const uint8_t *end) {
    __m128i raw;
    if (p + 16 > end) {
        uint8_t b[16] = {0};
        memcpy(b, p, (size_t)(2 * bits));
        raw = _mm_loadu_si128((const __m128i *)b);
    } else {
        raw = _mm_loadu_si128((const __m128i *)p);
    }
    __m512i v = _mm512_shuffle_epi8(_mm512_broadcast_i32x4(raw), d->shuf);
    return _mm512_cvtepi32_ps(_mm512_and_si512(_mm512_srlv_epi32(v, d->shift), d->mask));
}

INL5 float ld_sb5(const void *p, be_dtype dt, int64_t i) {
    if (dt == BE_BF16) return be_bf16_to_f32(((const uint16_t *)p)[i]);
    if (dt == BE_F16) return _cvtsh_ss(((const uint16_t *)p)[i]);
    return ((const float *)p)[i];
}

/* R rows from r x NT tokens: per group, R*NT accumulators of sum(x*q), then scale and bias */
INL5 void blk16(const float *x, const float *xs, int64_t ng, const be_mat *w, int64_t r, float *y, int64_t ldy, const int bits,
                const int R, const int NT, const dec16_t *d, const uint8_t *end, int pf) {
    int64_t k = w->cols;
    const int G = w->group;
    size_t rb = aq_row_bytes(k, bits);
    const uint8_t *row = (const uint8_t *)w->data + (size_t)r * rb;
    __m512 acc[4][2];
    float bsum[4][2];
    _Pragma("GCC unroll 4") for (int a = 0; a < R; a++)
        _Pragma("GCC unroll 2") for (int t = 0; t < NT; t++) { acc[a][t] = _mm512_setzero_ps(); bsum[a][t] = 0; }
    for (int64_t g = 0; g < ng; g++) {
        __m512 aq[4][2];
        _Pragma("GCC unroll 4") for (int a = 0; a < R; a++)
            _Pragma("GCC unroll 2") for (int t = 0; t < NT; t++) aq[a][t] = _mm512_setzero_ps();
        const uint8_t *p = row + (size_t)(g * G) * (size_t)bits / 8;
        const float *xg = x + g * G;
        for (int i = 0; i < G; i += 16, p += 2 * bits) {
            __m512 q[4];
            if (pf && (((size_t)(g * G + i) * (size_t)bits / 8) & 63) < (size_t)(2 * bits))   /* the next R rows, ahead of use */
                _Pragma("GCC unroll 4") for (int a = 0; a < R; a++) _mm_prefetch((const char *)p + (size_t)(R + a) * rb, _MM_HINT_T0);
            _Pragma("GCC unroll 4") for (int a = 0; a < R; a++) q[a] = dec16(d, p + (size_t)a * rb, bits, end);
            _Pragma("GCC unroll 2") for (int t = 0; t < NT; t++) {
                __m512 xv = _mm512_loadu_ps(xg + (int64_t)t * k + i);
                _Pragma("GCC unroll 4") for (int a = 0; a < R; a++) aq[a][t] = _mm512_fmadd_ps(q[a], xv, aq[a][t]);
            }
        }
        _Pragma("GCC unroll 4") for (int a = 0; a < R; a++) {
            int64_t gi = (r + a) * ng + g;
            __m512 sv = _mm512_set1_ps(ld_sb5(w->scales, w->sdt, gi));
            float b = ld_sb5(w->biases, w->sdt, gi);
            _Pragma("GCC unroll 2") for (int t = 0; t < NT; t++) {
                acc[a][t] = _mm512_fmadd_ps(aq[a][t], sv, acc[a][t]);
                bsum[a][t] += b * xs[t * ng + g];
            }
        }
    }
    _Pragma("GCC unroll 4") for (int a = 0; a < R; a++)
        _Pragma("GCC unroll 2") for (int t = 0; t < NT; t++) y[(int64_t)t * ldy + r + a] = _mm512_reduce_add_ps(acc[a][t]) + bsum[a][t];
}

/* tokens in ones (4 rows at a time) or pairs (2 rows at a time); xs[t][g] = group sums of x */
INL5 void rows16(const float *x, const float *xs, int64_t ng, const be_mat *w, int64_t r0, int64_t r1, float *y, int64_t ldy,
                 const int bits, const int NT) {
    const uint8_t *end = (const uint8_t *)w->data + (size_t)w->rows * aq_row_bytes(w->cols, bits);
    dec16_t d = dec16_init(bits);
    int64_t r = r0;
    if (NT == 1)
        for (; r + 4 <= r1; r += 4) blk16(x, xs, ng, w, r, y, ldy, bits, 4, 1, &d, end, r + 8 <= r1);
    else
        for (; r + 2 <= r1; r += 2) blk16(x, xs, ng, w, r, y, ldy, bits, 2, NT, &d, end, r + 4 <= r1);
    for (; r < r1; r++) blk16(x, xs, ng, w, r, y, ldy, bits, 1, NT, &d, end, 0);
}

INL5 void gemv16(const float *x, int n, const be_mat *w, int64_t r0, int64_t r1, float *y, int64_t ldy, int bits) {
    int64_t k = w->cols, ng = k / w->group;
    if (ng * 2 > XS_MAX || w->group % 16) {   /* (MLX's groups are 32, 64, 128) */
        gemv_scalar_kernels.gemv[w->dt](x, n, w, r0, r1, y, ldy);
        return;
    }
    float xs[XS_MAX];
    for (int t0 = 0; t0 < n; t0 += 2) {
        int nt = n - t0 < 2 ? n - t0 : 2;
        const float *xt = x + (int64_t)t0 * k;
        for (int t = 0; t < nt; t++)
            for (int64_t g = 0; g < ng; g++) {
                __m512 a = _mm512_setzero_ps();
                for (int i = 0; i < w->group; i += 16) a = _mm512_add_ps(a, _mm512_loadu_ps(xt + t * k + g * w->group + i));
                xs[t * ng + g] = _mm512_reduce_add_ps(a);
            }
        float *yt = y + (int64_t)t0 * ldy;
        if (nt == 1) rows16(xt, xs, ng, w, r0, r1, yt, ldy, bits, 1);
        else rows16(xt, xs, ng, w, r0, r1, yt, ldy, bits, 2);
    }
}

#define AVX512(b)                                                                                                    \
    __attribute__((target(TGT5))) void gemv_q##b##_avx512(const float *x, int n, const be_mat *w, int64_t r0, int64_t r1, \
                                                          float *y, int64_t ldy) {                                   \
        gemv16(x, n, w, r0, r1, y, ldy, b);                                                                          \
    }
AVX512(2)
AVX512(3)
AVX512(4)
AVX512(5)
AVX512(6)
AVX512(8)
#endif
