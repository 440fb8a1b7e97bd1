/*
 * avx2.h — what the AVX2 kernels (gemv-avx2.c, gemv-affine.c, gemv-affine-i8.c)
 * share: their target attribute, the inline qualifier that carries it, the
 * horizontal sum of a vector, and the load of one f32/f16/bf16 value (a scale
 * or bias). Include it inside an x86-only section, after <immintrin.h>.
 */
#ifndef CINFER_CPU_AVX2_H
#define CINFER_CPU_AVX2_H
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
#endif
