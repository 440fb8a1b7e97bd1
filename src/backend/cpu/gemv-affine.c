/*
 * gemv-affine.c — CPU kernels for MLX affine-quantized weights (BE_Q2..BE_Q8,
 * src/quant/affine.h), one per bit width, in the sets of gemv.h:
 *   gemv: y[t][r] = sum over groups g of  s[r][g] * sum_i x[t][i] q[r][i]
 *                                       + b[r][g] * sum_i x[t][i]
 *         (MLX's quantized_matmul association; f32 accumulation, activations
 *         stay f32), the group sums of x computed once per call;
 *   rows: s*q + b in f32, what the prefill path feeds sgemm (matmul.c).
 * The AVX2 decoder turns 8 codes (always `bits` whole bytes: 8 codes of any
 * width fill bits bytes) into 8 f32 lanes: 8 bits by zero extension, 2 and 4
 * bits by broadcasting the word and shifting lane j by j*bits, 3/5/6 bits with
 * one byte shuffle (lane j takes bytes (j*bits)/8 and the next) and a shift by
 * (j*bits)%8; an 8-byte load past the end of the matrix is avoided by copying
 * that block. Decode runs 4 weight rows per pass (4 independent FMA chains,
 * one x load shared), more tokens 2 rows x 2 tokens.
 * Reference: aq_dot_row / be_ref_matmul (tests/test-quant.c).
 */
#include <string.h>
#include "backend/cpu/gemv.h"
#include "quant/affine.h"

#define XS_MAX 4096            /* group sums of x kept on the stack: tokens x groups */

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

/* R rows from r x NT tokens: per group, R*NT accumulators of sum(x*q), then scale and bias */
INL void affine_blk(const float *x, const float *xs, int64_t ng, const be_mat *w, int64_t r, float *y, int64_t ldy,
                    const int bits, const int R, const int NT, const dec8 *d, const uint8_t *end, int pf) {
    int64_t k = w->cols;
    const int G = w->group;
    size_t rb = aq_row_bytes(k, bits);
    const uint8_t *row = (const uint8_t *)w->data + (size_t)r * rb;
    __m256 acc[4][2];
    float bsum[4][2];
    _Pragma("GCC unroll 4") for (int a = 0; a < R; a++)
        _Pragma("GCC unroll 2") for (int t = 0; t < NT; t++) { acc[a][t] = _mm256_setzero_ps(); bsum[a][t] = 0; }
    for (int64_t g = 0; g < ng; g++) {
        __m256 aq[4][2];
        _Pragma("GCC unroll 4") for (int a = 0; a < R; a++)
            _Pragma("GCC unroll 2") for (int t = 0; t < NT; t++) aq[a][t] = _mm256_setzero_ps();
        const uint8_t *p = row + (size_t)(g * G) * (size_t)bits / 8;
        const float *xg = x + g * G;
        for (int i = 0; i < G; i += 8, p += bits) {
            __m256 q[4];
            if (pf && (((size_t)(g * G + i) * (size_t)bits / 8) & 63) == 0)   /* the next R rows, ahead of use */
                _Pragma("GCC unroll 4") for (int a = 0; a < R; a++) _mm_prefetch((const char *)p + (size_t)(R + a) * rb, _MM_HINT_T0);
            _Pragma("GCC unroll 4") for (int a = 0; a < R; a++) q[a] = dec(d, p + (size_t)a * rb, bits, end);
            _Pragma("GCC unroll 2") for (int t = 0; t < NT; t++) {
                __m256 xv = _mm256_loadu_ps(xg + (int64_t)t * k + i);
                _Pragma("GCC unroll 4") for (int a = 0; a < R; a++) aq[a][t] = _mm256_fmadd_ps(q[a], xv, aq[a][t]);
            }
        }
        _Pragma("GCC unroll 4") for (int a = 0; a < R; a++) {
            int64_t gi = (r + a) * ng + g;
            __m256 sv = _mm256_set1_ps(ld_sb(w->scales, w->sdt, gi));
            float b = ld_sb(w->biases, w->sdt, gi);
            _Pragma("GCC unroll 2") for (int t = 0; t < NT; t++) {
                acc[a][t] = _mm256_fmadd_ps(aq[a][t], sv, acc[a][t]);
                bsum[a][t] += b * xs[t * ng + g];
            }
        }
    }
    _Pragma("GCC unroll 4") for (int a = 0; a < R; a++)
        _Pragma("GCC unroll 2") for (int t = 0; t < NT; t++) y[(int64_t)t * ldy + r + a] = hsum(acc[a][t]) + bsum[a][t];
}

/* tokens in ones (4 rows at a time) or pairs (2 rows at a time); xs[t][g] = group sums of x */
INL void affine_rows_avx2(const float *x, const float *xs, int64_t ng, const be_mat *w, int64_t r0, int64_t r1, float *y,
                          int64_t ldy, const int bits, const int NT) {
    const uint8_t *end = (const uint8_t *)w->data + (size_t)w->rows * aq_row_bytes(w->cols, bits);
    dec8 d = dec_init(bits);
    int64_t r = r0;
    if (NT == 1)
        for (; r + 4 <= r1; r += 4) affine_blk(x, xs, ng, w, r, y, ldy, bits, 4, 1, &d, end, r + 8 <= r1);
    else
        for (; r + 2 <= r1; r += 2) affine_blk(x, xs, ng, w, r, y, ldy, bits, 2, NT, &d, end, r + 4 <= r1);
    for (; r < r1; r++) affine_blk(x, xs, ng, w, r, y, ldy, bits, 1, NT, &d, end, 0);
}

INL void gemv_affine_avx2(const float *x, int n, const be_mat *w, int64_t r0,
                                                         int64_t r1, float *y, int64_t ldy, int bits) {
    int64_t k = w->cols, ng = k / w->group;
    if (ng * 2 > XS_MAX) { gemv_affine_scalar(x, n, w, r0, r1, y, ldy, bits); return; }
    float xs[XS_MAX];
    for (int t0 = 0; t0 < n; t0 += 2) {
        int nt = n - t0 < 2 ? n - t0 : 2;
        const float *xt = x + (int64_t)t0 * k;
        for (int t = 0; t < nt; t++)
            for (int64_t g = 0; g < ng; g++) {
                __m256 a = _mm256_setzero_ps();
                for (int i = 0; i < w->group; i += 8) a = _mm256_add_ps(a, _mm256_loadu_ps(xt + t * k + g * w->group + i));
                xs[t * ng + g] = hsum(a);
            }
        float *yt = y + (int64_t)t0 * ldy;
        if (nt == 1) affine_rows_avx2(xt, xs, ng, w, r0, r1, yt, ldy, bits, 1);
        else affine_rows_avx2(xt, xs, ng, w, r0, r1, yt, ldy, bits, 2);
    }
}

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
        gemv_affine_avx2(x, n, w, r0, r1, y, ldy, b);                                                          \
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
