/*
 * avx2.h — what the AVX2 kernels (gemv-avx2.c, gemv-affine.c, gemv-affine-i8.c)
 * share: their target attribute, the inline qualifier that carries it, the
 * horizontal sum of a vector, the load of one f32/f16/bf16 value (a scale
 * or bias), and the decoder of 8 MLX affine codes of any width into 8 f32
 * lanes (gemv-affine.c, attention-kvq.c), with the AVX-512 4-bit decoder of 32
 * codes as even and odd halves (dec4x32). Include it inside an x86-only
 * section, after <immintrin.h>.
 */
#ifndef CINFER_CPU_AVX2_H
#define CINFER_CPU_AVX2_H
#include <string.h>
#include "backend/backend.h"

#define TGT "avx2,fma,f16c"
#define INL static inline __attribute__((always_inline, target(TGT)))

INL float hsum(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* element i of an f32, f16 or bf16 array */
INL float ld_sb(const void *p, be_dtype dt, int64_t i) {
    if (dt == BE_BF16) return be_bf16_to_f32(((const uint16_t *)p)[i]);
    if (dt == BE_F16) return _cvtsh_ss(((const uint16_t *)p)[i]);
    return ((const float *)p)[i];
}

/* The affine decoder: 8 codes (always `bits` whole bytes: 8 codes of any width fill bits bytes)
 * into 8 f32 lanes. */
typedef struct dec8 { __m256i shuf, shift, mask; } dec8;

/* bits 2 and 4: the codes of 8 values are one 16- or 32-bit word, lane j shifted by j*bits;
 * 8: one byte per lane; 3, 5, 6: lane j takes bytes (j*bits)/8 and the next, shifted by (j*bits)%8 */
INL dec8 dec_init(int bits) {
    uint8_t sh[32];
    uint32_t s[8];
    for (int half = 0; half < 2; half++)
        for (int j = 0; j < 4; j++) {
            int lane = half * 4 + j, o = lane * bits / 8;
            uint8_t *d = sh + half * 16 + j * 4;
            d[0] = (uint8_t)o; d[1] = (uint8_t)(o + 1); d[2] = 0x80; d[3] = 0x80;
        }
    for (int j = 0; j < 8; j++) s[j] = (uint32_t)(bits == 2 || bits == 4 ? j * bits : j * bits % 8);
    dec8 d;
    d.shuf = _mm256_loadu_si256((const __m256i *)sh);
    d.shift = _mm256_loadu_si256((const __m256i *)s);
    d.mask = _mm256_set1_epi32((1 << bits) - 1);
    return d;
}

/* 8 codes starting at p (bits bytes) as floats; the 3/5/6-bit path loads 8 bytes, so near the
 * matrix end (p + 8 > end) it copies the block first */
INL __m256 dec(const dec8 *d, const uint8_t *p, const int bits, const uint8_t *end) {
    __m256i v;
    if (bits == 8) {
        v = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)p));
    } else if (bits == 4 || bits == 2) {
        uint32_t u = 0;
        memcpy(&u, p, (size_t)bits);
        v = _mm256_and_si256(_mm256_srlv_epi32(_mm256_set1_epi32((int)u), d->shift), d->mask);
    } else {
        __m128i raw;
        if (p + 8 > end) {
            uint64_t u = 0;
            memcpy(&u, p, (size_t)bits);
            raw = _mm_cvtsi64_si128((long long)u);
        } else {
            raw = _mm_loadl_epi64((const __m128i *)p);
        }
        v = _mm256_shuffle_epi8(_mm256_broadcastsi128_si256(raw), d->shuf);
        v = _mm256_and_si256(_mm256_srlv_epi32(v, d->shift), d->mask);
    }
    return _mm256_cvtepi32_ps(v);
}

/* AVX-512 (target avx512f: inlines into any AVX-512 caller): 4 bits, the 32 codes of 16 bytes (byte j: code 2j low,
 * 2j+1 high) as the even and the odd codes' floats — the 4-bit weight GEMV (gemv-affine-avx512.c) and the quantized
 * attention's p.V (attention-kvq-tiles.h) */
static inline __attribute__((always_inline, target("avx512f"))) void dec4x32(const uint8_t *p, __m512 *even, __m512 *odd) {
    __m512i v = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)p));
    *even = _mm512_cvtepi32_ps(_mm512_and_si512(v, _mm512_set1_epi32(15)));
    *odd = _mm512_cvtepi32_ps(_mm512_srli_epi32(v, 4));
}
#endif
