/*
 * gemv-affine.c — CPU kernels for MLX affine-quantized weights (BE_Q2..BE_Q8,
 * src/quant/affine.h), one per bit width, in the sets of gemv.h:
 *   gemv: y[t][r] = sum over groups g of  s[r][g] * sum_i x[t][i] q[r][i]
 *                                       + b[r][g] * sum_i x[t][i]
 *         (MLX's quantized_matmul association; f32 accumulation, activations
 *         stay f32), the group sums of x computed once per call;
 *   rows: s*q + b in f32, what the prefill path feeds sgemm (matmul.c).
 * The AVX2 decode kernel is gemv-affine-body.h at 8 lanes, on avx2.h's decoder
 * of 8 codes (8 bits by zero extension, 2 and 4 bits by broadcasting the word
 * and shifting lane j by j*bits, 3/5/6 bits with one byte shuffle).
 * Reference: aq_dot_row / be_ref_matmul (tests/test-quant.c).
 */
#include <string.h>
#include "backend/cpu/gemv.h"
#include "quant/affine.h"


static inline float sc(const be_mat *w, int64_t i) { return be_kv_get(w->scales, w->sdt, (size_t)i); }
static inline float bi(const be_mat *w, int64_t i) { return be_kv_get(w->biases, w->sdt, (size_t)i); }

static void gemv_affine_scalar(const float *x, int n, const be_mat *w, int64_t r0, int64_t r1, float *y,
                               int64_t ldy, int bits) {
    int64_t k = w->cols, ng = k / w->group;
    size_t rb = aq_row_bytes(k, bits);
    float q[128];
    for (int t0 = 0; t0 < n; t0 += 8) {
        int nt = n - t0 < 8 ? n - t0 : 8;
        for (int64_t r = r0; r < r1; r++) {
            const uint8_t *row = (const uint8_t *)w->data + (size_t)r * rb;
            float acc[8] = {0};
            for (int64_t g = 0; g < ng; g++) {
                int64_t c0 = g * w->group;
                for (int i = 0; i < w->group; i++) q[i] = (float)aq_code(row, c0 + i, bits);
                float s = sc(w, r * ng + g), b = bi(w, r * ng + g);
                for (int t = 0; t < nt; t++) {
                    const float *xt = x + (int64_t)(t0 + t) * k + c0;
                    float sq = 0, sx = 0;
                    for (int i = 0; i < w->group; i++) { sq += xt[i] * q[i]; sx += xt[i]; }
                    acc[t] += s * sq + b * sx;
                }
            }
            for (int t = 0; t < nt; t++) y[(int64_t)(t0 + t) * ldy + r] = acc[t];
        }
    }
}

static void rows_affine(const be_mat *w, int64_t r0, int64_t r1, float *dst, int bits) {
    int64_t k = w->cols, ng = k / w->group;
    size_t rb = aq_row_bytes(k, bits);
    for (int64_t r = r0; r < r1; r++, dst += k)
        aq_dequant_row((const uint8_t *)w->data + (size_t)r * rb, (const char *)w->scales + (size_t)(r * ng) * be_dtype_size(w->sdt),
                       (const char *)w->biases + (size_t)(r * ng) * be_dtype_size(w->sdt), w->sdt, bits, w->group, 0, k, dst);
}

#define SCALAR(b)                                                                                              \
    void gemv_q##b##_scalar(const float *x, int n, const be_mat *w, int64_t r0, int64_t r1, float *y, int64_t ldy) { \
        gemv_affine_scalar(x, n, w, r0, r1, y, ldy, b);                                                        \
    }                                                                                                          \
    void rows_q##b##_scalar(const be_mat *w, int64_t r0, int64_t r1, float *dst) { rows_affine(w, r0, r1, dst, b); }
SCALAR(2)
SCALAR(3)
SCALAR(4)
SCALAR(5)
SCALAR(6)
SCALAR(8)

#ifdef GEMV_X86
#include <immintrin.h>
#include "backend/cpu/avx2.h"

/* the decode kernel (gemv-affine-body.h) at 8 lanes */
#define AFF_INL INL
#define AFF_W 8
#define aff_v __m256
#define aff_zero() _mm256_setzero_ps()
#define aff_load(p) _mm256_loadu_ps(p)
#define aff_fma(a, b, c) _mm256_fmadd_ps(a, b, c)
#define aff_add(a, b) _mm256_add_ps(a, b)
#define aff_set1(f) _mm256_set1_ps(f)
#define aff_hsum(v) hsum(v)
#define aff_dec_t dec8
#define aff_dec_init(bits) dec_init(bits)
#define aff_dec(d, p, bits, end) dec(d, p, bits, end)
#define aff_sb(p, dt, i) ld_sb(p, dt, i)
#define AFF_NAME(x) x##_aff_avx2
#include "backend/cpu/gemv-affine-body.h"

INL void rows_affine_avx2(const be_mat *w, int64_t r0, int64_t r1, float *dst, int bits) {
    int64_t k = w->cols, ng = k / w->group;
    size_t rb = aq_row_bytes(k, bits);
    const uint8_t *end = (const uint8_t *)w->data + (size_t)w->rows * rb;
    dec8 d = dec_init(bits);
    for (int64_t r = r0; r < r1; r++) {
        const uint8_t *p = (const uint8_t *)w->data + (size_t)r * rb;
        for (int64_t g = 0; g < ng; g++) {
            __m256 s = _mm256_set1_ps(ld_sb(w->scales, w->sdt, r * ng + g)), b = _mm256_set1_ps(ld_sb(w->biases, w->sdt, r * ng + g));
            for (int i = 0; i < w->group; i += 8, p += bits, dst += 8)
                _mm256_storeu_ps(dst, _mm256_add_ps(_mm256_mul_ps(dec(&d, p, bits, end), s), b));   /* s*q + b, two roundings as the reference */
        }
    }
}

#define AVX2(b)                                                                                                \
    __attribute__((target(TGT))) void gemv_q##b##_avx2(const float *x, int n, const be_mat *w, int64_t r0, int64_t r1, \
                                                       float *y, int64_t ldy) {                                \
        gemv_aff_avx2(x, n, w, r0, r1, y, ldy, b);                                                          \
    }                                                                                                          \
    __attribute__((target(TGT))) void rows_q##b##_avx2(const be_mat *w, int64_t r0, int64_t r1, float *dst) {  \
        rows_affine_avx2(w, r0, r1, dst, b);                                                                   \
    }
AVX2(2)
AVX2(3)
AVX2(4)
AVX2(5)
AVX2(6)
AVX2(8)
#endif
