/*
 * gemv-affine-avx512.c — AVX-512 decode kernels for MLX affine-quantized
 * weights (BE_Q2..BE_Q8), the gemv entries of the avx512 set (gemv.h; the
 * prefill row conversion stays gemv-affine.c's AVX2 one): the kernel of
 * gemv-affine-body.h (the AVX2 one's too) at 16 lanes, on this decoder.
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
#include "backend/cpu/avx2.h"   /* ld_sb, dec4x32 (subset targets: they inline here) */

#define TGT5 "avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,f16c"
#define INL5 static inline __attribute__((always_inline, target(TGT5)))

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
    if (bits == 8)   /* the 16 bytes are the 16 codes: one zero-extending load, no shuffle */
        return _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)p)));
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

/* x[0..32) as its even- and odd-indexed halves */
INL5 void xsplit32(const float *x, __m512 *even, __m512 *odd) {
    const __m512i ie = _mm512_set_epi32(30, 28, 26, 24, 22, 20, 18, 16, 14, 12, 10, 8, 6, 4, 2, 0);
    const __m512i io = _mm512_set_epi32(31, 29, 27, 25, 23, 21, 19, 17, 15, 13, 11, 9, 7, 5, 3, 1);
    __m512 a = _mm512_loadu_ps(x), b = _mm512_loadu_ps(x + 16);
    *even = _mm512_permutex2var_ps(a, ie, b);
    *odd = _mm512_permutex2var_ps(a, io, b);
}

/* the decode kernel (gemv-affine-body.h) at 16 lanes */
#define AFF_DEC4
#define aff_dec4(p, e, o) dec4x32(p, e, o)
#define aff_xsplit(x, e, o) xsplit32(x, e, o)
#define AFF_INL INL5
#define AFF_W 16
#define aff_v __m512
#define aff_zero() _mm512_setzero_ps()
#define aff_load(p) _mm512_loadu_ps(p)
#define aff_fma(a, b, c) _mm512_fmadd_ps(a, b, c)
#define aff_add(a, b) _mm512_add_ps(a, b)
#define aff_set1(f) _mm512_set1_ps(f)
#define aff_hsum(v) _mm512_reduce_add_ps(v)
#define aff_dec_t dec16_t
#define aff_dec_init(bits) dec16_init(bits)
#define aff_dec(d, p, bits, end) dec16(d, p, bits, end)
#define aff_sb(p, dt, i) ld_sb(p, dt, i)
#define AFF_NAME(x) x##_aff_avx512
#include "backend/cpu/gemv-affine-body.h"

#define AVX512(b)                                                                                                    \
    __attribute__((target(TGT5))) void gemv_q##b##_avx512(const float *x, int n, const be_mat *w, int64_t r0, int64_t r1, \
                                                          float *y, int64_t ldy) {                                   \
        gemv_aff_avx512(x, n, w, r0, r1, y, ldy, b);                                                                          \
    }
AVX512(2)
AVX512(3)
AVX512(4)
AVX512(5)
AVX512(6)
AVX512(8)
#endif
