/*
 * gemv-affine-i8.c — opt-in (CINFER_INT8_ACT=1) decode kernels for 4- and
 * 8-bit MLX affine weights on int8-rounded activations, as llama.cpp's Q4_0 /
 * Q8_0 dot products do: x is cut into blocks of 32, each rounded to int8 with
 * its own f32 scale d = max|x|/127 (prep_i8_q4 / prep_i8_q8), and the code x
 * activation products are summed in integers (maddubs / madd), then scaled
 * per block in f32. The bias term uses the exact f32 block sums of x. Only
 * the rounding of x differs from the f32 kernels: tests/test-quant.c checks
 * these against be_ref_matmul on the int8-rounded x, and BENCHMARKS.md
 * reports the KL this rounding costs.
 *
 * Prepared x, per token t at xp + t*k floats: int8 q[k] (4-bit: each block
 * of 32 stored as its 16 even then its 16 odd elements, the order of the low
 * and high nibbles of 16 code bytes), then f32 d[k/32], then f32 sum[k/32].
 */
#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#include <math.h>
#include <pthread.h>
#include <string.h>
#include "backend/cpu/gemv.h"
#include "quant/affine.h"
#include "backend/cpu/avx2.h"
#define KERNEL static __attribute__((target(TGT)))

static void prep_i8(const float *x, int n, int64_t k, float *xp, int perm) {
    for (int t = 0; t < n; t++) {
        const float *xt = x + (int64_t)t * k;
        int8_t *q = (int8_t *)(xp + (int64_t)t * k);
        float *d = (float *)(q + k), *s = d + k / 32;
        for (int64_t b = 0; b < k / 32; b++) {
            const float *v = xt + b * 32;
            float amax = 0, sum = 0;
            for (int i = 0; i < 32; i++) { amax = fmaxf(amax, fabsf(v[i])); sum += v[i]; }
            float db = amax / 127.0f, id = db > 0 ? 1.0f / db : 0.0f;
            for (int i = 0; i < 32; i++) {
                int j = perm ? (i % 2 ? 16 + i / 2 : i / 2) : i;
                q[b * 32 + j] = (int8_t)lrintf(v[i] * id);
            }
            d[b] = db;
            s[b] = sum;
        }
    }
}
static void prep_i8_q4(const float *x, int n, int64_t k, float *xp) { prep_i8(x, n, k, xp, 1); }
static void prep_i8_q8(const float *x, int n, int64_t k, float *xp) { prep_i8(x, n, k, xp, 0); }


/* R rows from r, one token; bits 4 or 8 */
INL void i8_blk(const float *xpt, const be_mat *w, int64_t r, float *y, const int bits, const int R, int pf) {
    int64_t k = w->cols, ng = k / w->group, nb = w->group / 32;
    size_t rb = aq_row_bytes(k, bits);
    const int8_t *xq = (const int8_t *)xpt;
    const float *d = (const float *)(xq + k), *sums = d + k / 32;
    const uint8_t *row = (const uint8_t *)w->data + (size_t)r * rb;
    const __m256i m0f = _mm256_set1_epi8(0x0f), ones = _mm256_set1_epi16(1);
    __m256 acc[4];
    float bsum[4] = {0, 0, 0, 0};
    _Pragma("GCC unroll 4") for (int a = 0; a < R; a++) acc[a] = _mm256_setzero_ps();
    for (int64_t g = 0; g < ng; g++) {
        __m256 aq[4];
        float xs = 0;
        _Pragma("GCC unroll 4") for (int a = 0; a < R; a++) aq[a] = _mm256_setzero_ps();
        for (int64_t j = 0; j < nb; j++) {
            int64_t blk = g * nb + j;
            __m256 dv = _mm256_set1_ps(d[blk]);
            __m256i xv = _mm256_loadu_si256((const __m256i *)(xq + blk * 32));
            xs += sums[blk];
            if (pf && ((blk * 4 * bits) & 63) == 0)   /* the next 4 rows, a cache line ahead of use */
                _Pragma("GCC unroll 4") for (int a = 0; a < R; a++)
                    _mm_prefetch((const char *)row + (size_t)(2 * R + a) * rb + (size_t)blk * 4 * bits, _MM_HINT_T0);
            if (bits == 4) {
                _Pragma("GCC unroll 4") for (int a = 0; a < R; a++) {
                    __m128i v = _mm_loadu_si128((const __m128i *)(row + (size_t)a * rb + (size_t)blk * 16));
                    __m256i c = _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(v, 4), v), m0f);
                    __m256i p = _mm256_madd_epi16(_mm256_maddubs_epi16(c, xv), ones);
                    aq[a] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), dv, aq[a]);
                }
            } else {
                __m256i xlo = _mm256_cvtepi8_epi16(_mm256_castsi256_si128(xv)), xhi = _mm256_cvtepi8_epi16(_mm256_extracti128_si256(xv, 1));
                _Pragma("GCC unroll 4") for (int a = 0; a < R; a++) {
                    const uint8_t *p8 = row + (size_t)a * rb + (size_t)blk * 32;
                    __m256i lo = _mm256_cvtepu8_epi16(_mm_loadu_si128((const __m128i *)p8));
                    __m256i hi = _mm256_cvtepu8_epi16(_mm_loadu_si128((const __m128i *)(p8 + 16)));
                    __m256i p = _mm256_add_epi32(_mm256_madd_epi16(lo, xlo), _mm256_madd_epi16(hi, xhi));
                    aq[a] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), dv, aq[a]);
                }
            }
        }
        _Pragma("GCC unroll 4") for (int a = 0; a < R; a++) {
            int64_t gi = (r + a) * ng + g;
            acc[a] = _mm256_fmadd_ps(aq[a], _mm256_set1_ps(ld_sb(w->scales, w->sdt, gi)), acc[a]);
            bsum[a] += ld_sb(w->biases, w->sdt, gi) * xs;
        }
    }
    _Pragma("GCC unroll 4") for (int a = 0; a < R; a++) y[r + a] = hsum(acc[a]) + bsum[a];
}

INL void gemv_i8(const float *xp, int n, const be_mat *w, int64_t r0, int64_t r1, float *y, int64_t ldy, const int bits) {
    int64_t k = w->cols;
    int64_t r = r0;
    for (; r + 4 <= r1; r += 4)
        for (int t = 0; t < n; t++) i8_blk(xp + (int64_t)t * k, w, r, y + (int64_t)t * ldy, bits, 4, t == 0 && r + 12 <= r1);
    for (; r < r1; r++)
        for (int t = 0; t < n; t++) i8_blk(xp + (int64_t)t * k, w, r, y + (int64_t)t * ldy, bits, 1, 0);
}
KERNEL void gemv_q4_i8(const float *x, int n, const be_mat *w, int64_t r0, int64_t r1, float *y, int64_t ldy) {
    gemv_i8(x, n, w, r0, r1, y, ldy, 4);
}
KERNEL void gemv_q8_i8(const float *x, int n, const be_mat *w, int64_t r0, int64_t r1, float *y, int64_t ldy) {
    gemv_i8(x, n, w, r0, r1, y, ldy, 8);
}

/* the base set with the 4- and 8-bit entries replaced, built once per base */
typedef struct i8_set { pthread_once_t once; const gemv_kernels *base; gemv_kernels k; } i8_set;
static i8_set sets[2] = {{PTHREAD_ONCE_INIT, NULL, {0}}, {PTHREAD_ONCE_INIT, NULL, {0}}};
static void fill(i8_set *s, const gemv_kernels *base) {
    s->k = *base;
    s->k.isa = base == &gemv_avx512_kernels ? "avx512+int8act" : "avx2+int8act";
    s->k.gemv[BE_Q4] = gemv_q4_i8;
    s->k.gemv[BE_Q8] = gemv_q8_i8;
    s->k.prep_x[BE_Q4] = prep_i8_q4;
    s->k.prep_x[BE_Q8] = prep_i8_q8;
}
static void fill_avx2(void) { fill(&sets[0], &gemv_avx2_kernels); }
static void fill_avx512(void) { fill(&sets[1], &gemv_avx512_kernels); }

const gemv_kernels *gemv_int8_act(const gemv_kernels *base) {
    if (base == &gemv_avx2_kernels) { pthread_once(&sets[0].once, fill_avx2); return &sets[0].k; }
    if (base == &gemv_avx512_kernels || base == gemv_avx512_vnni()) {   /* (the vnni set differs only in q4) */
        pthread_once(&sets[1].once, fill_avx512);
        return &sets[1].k;
    }
    return base;
}
#else
#include "backend/cpu/gemv.h"
const gemv_kernels *gemv_int8_act(const gemv_kernels *base) { return base; }
#endif
