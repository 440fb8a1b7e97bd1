/*
 * gemv-affine-vnni.c — the default decode kernel for 4-bit MLX affine
 * weights on CPUs with AVX-512 VNNI: exact integer products on a 24-bit
 * fixed-point form of the f32 activations.
 *
 * x is cut into blocks of 8; a block with largest |x| = m gets a power of
 * two d = 2^e, the smallest with m / d <= 127, and each x_i becomes the
 * integer X_i = round(x_i * 2^16 / d) (|X_i| <= 127 * 2^16: the scaling is
 * exact, the rounding is the only one, at most 2^-17 d <= 2^-23 m). X_i is
 * held as three signed bytes, X = 2^16 x0 + 2^8 x1 + x2 (balanced digits),
 * so a block's products with a row's 4-bit codes c are summed exactly in
 * int32 (a dword lane: |S| <= 8 * 15 * 127 * 2^16 < 2^30) by vpdpbusd (u8
 * codes x s8 digits) joined by Horner's rule:
 *     S = ((c.x0) << 8 + c.x1) << 8 + c.x2 = sum_i c_i X_i
 * Then, in f32, as MLX's quantized_matmul associates it,
 *     y = sum over groups g of s_g * sum over g's blocks (d / 2^16) S + b_g * sum_g x
 * (sum_g x from the same digits). Against the f32 kernels (gemv-affine-body.h)
 * the only difference is x_i's rounding to 2^-23 of its block's largest
 * value, below the f32 rounding of the sums those kernels accumulate:
 * tests/test-quant.c holds both to the same bound against be_ref_matmul (an
 * outlier case included) and reports each one's worst error; BENCHMARKS.md
 * has the KL against the f32 kernel.
 *
 * Why: with f32 activations each code costs a conversion and an FMA, and on
 * Zen 4 the conversions, shifts and byte moves share two of the four vector
 * pipes: the f32 kernel takes 12-14 cycles a row's 64 codes (a matrix in L3,
 * 1 thread). Here a row's 128 codes (one 64-byte load) cost 6 vpdpbusd, 1
 * multiply and 1 FMA on the multiply pipes, 1 shift, 2 Horner shifts, 1
 * conversion and 1 permute on the others, 2 ANDs anywhere: 5.7 cycles a 64
 * codes measured (BENCHMARKS.md, issue 11).
 *
 * Prepared x (prep_q4_vnni, gemv.h's prep_x contract), per token t at
 * xp + t*k floats, for k % 128 == 0: 448 bytes a block of 128 values: for
 * each digit the 64 even-indexed values' (64 bytes), then the odd-indexed'
 * (the order the decoder leaves the codes in), then f32 dv[16] = d / 2^16
 * of the 8-value blocks. Any other k: x is copied as it is and the f32
 * kernel runs.
 *
 * The decoder: 64 code bytes (128 codes) in one zmm; & 0x0F = the codes
 * 0, 2, .., 126, >> 4 & 0x0F = the codes 1, 3, .., 127, each one u8 a byte:
 * dword lane j of both sums codes 8j .. 8j+7 (a block). Rows are read as 4
 * streams (gemv_streams), each prefetched VN_PFD bytes ahead.
 */
#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#include <math.h>
#include <pthread.h>
#include <string.h>
#include "backend/cpu/gemv.h"
#include "quant/affine.h"

#define TGTV "avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c"
#define INLV static inline __attribute__((always_inline, target(TGTV)))
#define KERNELV static __attribute__((target(TGTV)))
#define VN_PFD 1024    /* software prefetch distance in each stream (bytes): 1 thread +10% (bench, Zen 4) */
#define VN_UNITS 512   /* groups of one row kept on the stack (k <= 16384 at group 32) */
#define VN_SB 448      /* prepared bytes a block of 128 values */

/* e (as a float) for 16 block maxima m: the smallest with m 2^-e <= 127; 0 where m is 0, Inf or NaN (bad) */
INLV __m512 vn_exp(__m512 m, __mmask16 *bad) {
    /* floor(log2 m) - 6, one more when the mantissa passes 127/64 */
    __m512 e = _mm512_sub_ps(_mm512_getexp_ps(m), _mm512_set1_ps(6.0f));
    e = _mm512_mask_add_ps(e, _mm512_cmp_ps_mask(_mm512_getmant_ps(m, _MM_MANT_NORM_1_2, _MM_MANT_SIGN_zero), _mm512_set1_ps(127.0f / 64.0f),
                                                 _CMP_GT_OQ), e, _mm512_set1_ps(1.0f));
    *bad = _mm512_cmp_ps_mask(m, _mm512_set1_ps(INFINITY), _CMP_NLT_UQ);   /* Inf or NaN */
    return _mm512_mask_mov_ps(e, *bad | _mm512_cmp_ps_mask(m, _mm512_setzero_ps(), _CMP_EQ_OQ), _mm512_setzero_ps());
}

/* 16 values under exponents e as their three digits, stored 16 bytes each at o, o + 128, o + 256 */
INLV void vn_digits(__m512 v, __m512 e, __mmask16 bad, uint8_t *o) {
    __m512i X = _mm512_cvtps_epi32(_mm512_scalef_ps(v, _mm512_sub_ps(_mm512_set1_ps(16.0f), e)));   /* exact scaling, one rounding */
    X = _mm512_mask_mov_epi32(X, bad, _mm512_setzero_si512());
    __m512i d2 = _mm512_srai_epi32(_mm512_slli_epi32(X, 24), 24);
    __m512i X1 = _mm512_srai_epi32(_mm512_sub_epi32(X, d2), 8);
    __m512i d1 = _mm512_srai_epi32(_mm512_slli_epi32(X1, 24), 24);
    __m512i d0 = _mm512_srai_epi32(_mm512_sub_epi32(X1, d1), 8);
    _mm_storeu_si128((__m128i *)o, _mm512_cvtepi32_epi8(d0));
    _mm_storeu_si128((__m128i *)(o + 128), _mm512_cvtepi32_epi8(d1));
    _mm_storeu_si128((__m128i *)(o + 256), _mm512_cvtepi32_epi8(d2));
}

/* one block of 128 x values into its VN_SB bytes at o */
INLV void vn_block(const float *x, uint8_t *o) {
    const __m512i ie = _mm512_set_epi32(30, 28, 26, 24, 22, 20, 18, 16, 14, 12, 10, 8, 6, 4, 2, 0);
    const __m512i io = _mm512_set_epi32(31, 29, 27, 25, 23, 21, 19, 17, 15, 13, 11, 9, 7, 5, 3, 1);
    const __m512i pick = _mm512_set_epi32(28, 24, 20, 16, 12, 8, 4, 0, 28, 24, 20, 16, 12, 8, 4, 0);
    __m512 de[4];
    for (int i = 0; i < 4; i++) {   /* values 32i .. 32i+31: dword lanes 4i .. 4i+3, a 128-bit lane of E and O each */
        __m512 a = _mm512_loadu_ps(x + 32 * i), b = _mm512_loadu_ps(x + 32 * i + 16);
        __m512 E = _mm512_permutex2var_ps(a, ie, b), O = _mm512_permutex2var_ps(a, io, b);
        __m512 m = _mm512_max_ps(_mm512_abs_ps(E), _mm512_abs_ps(O));   /* a block's largest |x|, in its 128-bit lane */
        m = _mm512_max_ps(m, _mm512_permute_ps(m, 0xB1));
        m = _mm512_max_ps(m, _mm512_permute_ps(m, 0x4E));
        __mmask16 bad;
        __m512 e = vn_exp(m, &bad);
        vn_digits(E, e, bad, o + 16 * i);
        vn_digits(O, e, bad, o + 64 + 16 * i);
        /* d / 2^16; a NaN or Inf makes its block's results NaN */
        de[i] = _mm512_mask_mov_ps(_mm512_scalef_ps(_mm512_set1_ps(1.0f), _mm512_sub_ps(e, _mm512_set1_ps(16.0f))), bad, _mm512_set1_ps(NAN));
    }
    __m512 lo = _mm512_permutex2var_ps(de[0], pick, de[1]), hi = _mm512_permutex2var_ps(de[2], pick, de[3]);
    _mm512_storeu_ps((float *)(o + 384), _mm512_mask_blend_ps(0xFF00, lo, hi));
}

KERNELV void prep_q4_vnni(const float *x, int n, int64_t k, float *xp) {
    if (k % 128) {
        memcpy(xp, x, sizeof(float) * (size_t)n * (size_t)k);
        return;
    }
    for (int t = 0; t < n; t++)
        for (int64_t c = 0; c < k / 128; c++) vn_block(x + (int64_t)t * k + 128 * c, (uint8_t *)(xp + (int64_t)t * k) + VN_SB * c);
}

/* a block of 128's products with codes lo (even) and hi (odd): S of each block of 8 (a lane), exact */
INLV __m512i vn_dot(__m512i lo, __m512i hi, const uint8_t *o) {
    __m512i s = _mm512_dpbusd_epi32(_mm512_setzero_si512(), lo, _mm512_loadu_si512(o));
    s = _mm512_dpbusd_epi32(s, hi, _mm512_loadu_si512(o + 64));
    s = _mm512_dpbusd_epi32(_mm512_slli_epi32(s, 8), lo, _mm512_loadu_si512(o + 128));
    s = _mm512_dpbusd_epi32(s, hi, _mm512_loadu_si512(o + 192));
    s = _mm512_dpbusd_epi32(_mm512_slli_epi32(s, 8), lo, _mm512_loadu_si512(o + 256));
    return _mm512_dpbusd_epi32(s, hi, _mm512_loadu_si512(o + 320));
}

/* 16 scales or biases (f32/f16/bf16) from element i, the first `cnt` (<= 16) of them, the rest 0 */
INLV __m512 vn_ld16(const void *p, be_dtype dt, int64_t i, int cnt) {
    const __mmask16 m = (__mmask16)(cnt >= 16 ? 0xFFFF : (1u << cnt) - 1);
    if (dt == BE_F32) return _mm512_maskz_loadu_ps(m, (const float *)p + i);
    __m256i h = _mm256_maskz_loadu_epi16(m, (const uint16_t *)p + i);
    if (dt == BE_F16) return _mm512_cvtph_ps(h);
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

/* a token's group sums of x, from its digits (the x the products see): G / 8 lanes a group */
INLV void vn_sums(const uint8_t *xp, int64_t k, const int G, float *xs) {
    const __m512i ones = _mm512_set1_epi8(1);
    for (int64_t c = 0; c < k / 128; c++) {
        const uint8_t *o = xp + VN_SB * c;
        __m512 t = _mm512_mul_ps(_mm512_cvtepi32_ps(vn_dot(ones, ones, o)), _mm512_loadu_ps((const float *)(o + 384)));
        for (int q = 0; q < 128 / G; q++)
            xs[c * (128 / G) + q] = _mm512_mask_reduce_add_ps((__mmask16)(((1u << (G / 8)) - 1) << (q * G / 8)), t);
    }
}

/* the R (1..4) rows r + a h (a < R: gemv_streams), one token (prepared x xp, its group sums xs); R and
 * G are constants in each call */
INLV void vn_blk(const uint8_t *xp, const float *xs, const be_mat *w, int64_t r, int64_t h, float *y, const int R, const int G) {
    const int64_t k = w->cols, nb = k / 128, ng = k / G;
    const size_t rb = aq_row_bytes(k, 4);
    const uint8_t *rows[4];
    _Pragma("GCC unroll 4") for (int a = 0; a < R; a++) rows[a] = (const uint8_t *)w->data + (size_t)(r + a * h) * rb;
    /* per row: the scales as f32, and the bias term sum_g b_g xs_g (f32 lanes, then one sum) */
    float sf[4][VN_UNITS + 16], bsum[4];   /* (+16: the 16-wide loads and stores stay inside) */
    _Pragma("GCC unroll 4") for (int a = 0; a < R; a++) {
        const int64_t g0 = (r + a * h) * ng;
        __m512 bv = _mm512_setzero_ps();
        for (int64_t g = 0; g < ng; g += 16) {
            const int cnt = ng - g < 16 ? (int)(ng - g) : 16;
            bv = _mm512_fmadd_ps(vn_ld16(w->biases, w->sdt, g0 + g, cnt), _mm512_maskz_loadu_ps((__mmask16)((1u << cnt) - 1), xs + g), bv);
            _mm512_storeu_ps(sf[a] + g, vn_ld16(w->scales, w->sdt, g0 + g, cnt));
        }
        bsum[a] = _mm512_reduce_add_ps(bv);
    }
    /* lane j's group within a block of 128: j / (G / 8) */
    const __m512i gi = _mm512_srli_epi32(_mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0), G == 32 ? 2 : G == 64 ? 3 : 4);
    const __m512i m0f = _mm512_set1_epi8(0x0f);
    __m512 acc[4];
    _Pragma("GCC unroll 4") for (int a = 0; a < R; a++) acc[a] = _mm512_setzero_ps();
    for (int64_t c = 0; c < nb; c++) {
        const uint8_t *o = xp + VN_SB * c;
        const __m512 dv = _mm512_loadu_ps((const float *)(o + 384));
        _Pragma("GCC unroll 4") for (int a = 0; a < R; a++) {
            _mm_prefetch((const char *)rows[a] + 64 * c + VN_PFD, _MM_HINT_T0);
            __m512i raw = _mm512_loadu_si512(rows[a] + 64 * c);
            __m512i lo = _mm512_and_si512(raw, m0f), hi = _mm512_and_si512(_mm512_srli_epi16(raw, 4), m0f);
            __m512 sv = G == 128 ? _mm512_set1_ps(sf[a][c]) : _mm512_permutexvar_ps(gi, _mm512_loadu_ps(sf[a] + c * (128 / G)));
            acc[a] = _mm512_fmadd_ps(_mm512_mul_ps(_mm512_cvtepi32_ps(vn_dot(lo, hi, o)), dv), sv, acc[a]);
        }
    }
    _Pragma("GCC unroll 4") for (int a = 0; a < R; a++) y[r + a * h] = _mm512_reduce_add_ps(acc[a]) + bsum[a];
}

/* rows [r0, r1) of tokens [0, nt) (x, y at their first; xs their group sums): the 4 streams of
 * gemv_streams, then the rows left over; the tokens of a row block one after the other, while its
 * rows are in L1 */
#define VN_T 4   /* tokens whose group sums are made at once */
INLV void vn_rows(const float *x, float xs[][VN_UNITS + 16], int nt, const be_mat *w, int64_t r0, int64_t r1, float *y,
                  int64_t ldy, const int G) {
    const int64_t k = w->cols, h = gemv_streams(r0, r1, 4);
    for (int t = 0; t < nt; t++) vn_sums((const uint8_t *)(x + (int64_t)t * k), k, G, xs[t]);
    for (int64_t r = r0; r < r0 + h; r++)
        for (int t = 0; t < nt; t++) vn_blk((const uint8_t *)(x + (int64_t)t * k), xs[t], w, r, h, y + (int64_t)t * ldy, 4, G);
    for (int64_t r = r0 + 4 * h; r < r1; r++)
        for (int t = 0; t < nt; t++) vn_blk((const uint8_t *)(x + (int64_t)t * k), xs[t], w, r, 0, y + (int64_t)t * ldy, 1, G);
}

KERNELV void gemv_q4_vnni(const float *x, int n, const be_mat *w, int64_t r0, int64_t r1, float *y, int64_t ldy) {
    const int64_t k = w->cols;
    const int G = w->group;
    if (k % 128 || (G != 32 && G != 64 && G != 128) || k / G > VN_UNITS) {   /* x as it is (prep_q4_vnni copied it) */
        gemv_avx512_kernels.gemv[BE_Q4](x, n, w, r0, r1, y, ldy);
        return;
    }
    float xs[VN_T][VN_UNITS + 16];
    for (int t0 = 0; t0 < n; t0 += VN_T) {
        const int nt = n - t0 < VN_T ? n - t0 : VN_T;
        const float *xt = x + (int64_t)t0 * k;
        float *yt = y + (int64_t)t0 * ldy;
        switch (G) {
        case 32: vn_rows(xt, xs, nt, w, r0, r1, yt, ldy, 32); break;
        case 64: vn_rows(xt, xs, nt, w, r0, r1, yt, ldy, 64); break;
        default: vn_rows(xt, xs, nt, w, r0, r1, yt, ldy, 128); break;
        }
    }
}

/* the avx512 set with the 4-bit entry replaced, built once */
static pthread_once_t vn_once = PTHREAD_ONCE_INIT;
static gemv_kernels vn_set;
static void vn_fill(void) {
    vn_set = gemv_avx512_kernels;
    vn_set.isa = "avx512vnni";
    vn_set.gemv[BE_Q4] = gemv_q4_vnni;
    vn_set.prep_x[BE_Q4] = prep_q4_vnni;
}
const gemv_kernels *gemv_avx512_vnni(void) {
    if (!gemv_isa("avx512") || !__builtin_cpu_supports("avx512dq") || !__builtin_cpu_supports("avx512vnni")) return NULL;
    pthread_once(&vn_once, vn_fill);
    return &vn_set;
}
#else
#include "backend/cpu/gemv.h"
const gemv_kernels *gemv_avx512_vnni(void) { return NULL; }
#endif
