/*
 * attention-avx512.c — the two products of attention-gemm.c's items on
 * AVX-512 f32 FMAs, for blocks of 4 queries (or, decoding, 4 query heads of
 * one kv head), with the keys' transposition and the widening of f16/bf16
 * pages that feed them:
 *     S[r][c] = scale * sum_d Q[r][d] KT[d][c]        (keys transposed once per item)
 *     O[r][d] = sum_c S[r][c] V[c][d]
 * f32 throughout (the same definition as the sgemm calls they replace, another
 * summation order). Why not sgemm: a block of 4 queries stops at its own last
 * visible key (causal prefill skips the masked half), and OpenBLAS picks its
 * kernel by CPU model: on a model it does not know it falls back to SSE3
 * (Debian's 0.3.21 on the AMX Xeon: "Prescott", 25 GFLOP/s a core).
 * Function-level target attributes; att_avx512_available says when to call.
 */
#include "backend/cpu/gemv.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#include <stdlib.h>
#include <string.h>

#define TGT __attribute__((target("avx512f,avx512bw,avx512vl")))

int att_avx512_available(void) {
    return !cpu_isa_capped("avx512") && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
           __builtin_cpu_supports("avx512vl");
}

static inline __mmask16 tail_mask(int left) { return left >= 16 ? (__mmask16)0xffff : left <= 0 ? 0 : (__mmask16)((1u << left) - 1); }

/* 16 elements of b from element i (lanes outside m: 0) as f32: b f32 (bt 0), bf16 (1) or f16 (2) */
TGT static inline __attribute__((always_inline)) __m512 ld16(const void *b, size_t i, __mmask16 m, int bt) {
    if (!bt) return _mm512_maskz_loadu_ps(m, (const float *)b + i);
    __m256i h = _mm256_maskz_loadu_epi16(m, (const uint16_t *)b + i);
    return bt == 1 ? _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16)) : _mm512_cvtph_ps(h);
}

/* c[r][n] = alpha * sum_{p < kk} a[r][p] b[p][n] (+ c[r][n] when add) for r < rows (<= 4), n < cols (a[r][p] at
 * a + r lda + p ps: ps 1, or 8 for the scores of att_amx_scores' [key][8] layout; b's elements of type bt, see
 * ld16, its rows ldb elements apart): blocks of 4 rows x 64 columns (16 accumulators), b's rows loaded whole, a's
 * values broadcast; pf (or NULL): a matrix laid out as b whose lines are prefetched as b's are read (the next
 * segment's values) */
TGT static inline __attribute__((always_inline)) void rows4(const float *a, int lda, int ps, int rows, const void *b, int bt,
                                                           int ldb, int cols, int kk, float alpha, float *c, int ldc,
                                                           int add, const void *pf) {
    const int es = bt ? 2 : 4;
    const float *ar[4];
    for (int i = 0; i < 4; i++) ar[i] = a + (size_t)(i < rows ? i : rows - 1) * lda;
    for (int c0 = 0; c0 < cols; c0 += 64) {
        __mmask16 m[4];
        for (int j = 0; j < 4; j++) m[j] = tail_mask(cols - c0 - 16 * j);
        __m512 acc[4][4];
#pragma GCC unroll 4
        for (int i = 0; i < 4; i++)
#pragma GCC unroll 4
            for (int j = 0; j < 4; j++)
                acc[i][j] = add && i < rows ? _mm512_maskz_loadu_ps(m[j], c + (size_t)i * ldc + c0 + 16 * j) : _mm512_setzero_ps();
        for (int p = 0; p < kk; p++) {
            size_t bi = (size_t)p * ldb + c0;
            if (pf)
                for (int o = 0; o < 64 * es && c0 + o / es < cols; o += 64) _mm_prefetch((const char *)pf + bi * es + o, _MM_HINT_T1);
            __m512 b0 = ld16(b, bi, m[0], bt), b1 = ld16(b, bi + 16, m[1], bt);
            __m512 b2 = ld16(b, bi + 32, m[2], bt), b3 = ld16(b, bi + 48, m[3], bt);
#pragma GCC unroll 4
            for (int i = 0; i < 4; i++) {
                __m512 x = _mm512_set1_ps(ar[i][(size_t)p * ps]);
                acc[i][0] = _mm512_fmadd_ps(x, b0, acc[i][0]);
                acc[i][1] = _mm512_fmadd_ps(x, b1, acc[i][1]);
                acc[i][2] = _mm512_fmadd_ps(x, b2, acc[i][2]);
                acc[i][3] = _mm512_fmadd_ps(x, b3, acc[i][3]);
            }
        }
        __m512 al = _mm512_set1_ps(alpha);
#pragma GCC unroll 4
        for (int i = 0; i < 4; i++)   /* (unrolled whole, with the rows test inside: acc stays in registers) */
#pragma GCC unroll 4
            for (int j = 0; j < 4; j++)
                if (i < rows) _mm512_mask_storeu_ps(c + (size_t)i * ldc + c0 + 16 * j, m[j], alpha == 1.0f ? acc[i][j] : _mm512_mul_ps(acc[i][j], al));
    }
}

/* glibc's libmvec: expf on 16 lanes (AVX-512), the vector ABI's name */
__m512 _ZGVeN16v_expf(__m512 x);

TGT float att_exp_avx512(float *s, int n, float mx) {
    __m512 m = _mm512_set1_ps(mx), acc = _mm512_setzero_ps();
    for (int i = 0; i < n; i += 16) {
        __mmask16 k = tail_mask(n - i);
        __m512 e = _ZGVeN16v_expf(_mm512_sub_ps(_mm512_maskz_loadu_ps(k, s + i), m));
        e = _mm512_maskz_mov_ps(k, e);
        _mm512_mask_storeu_ps(s + i, k, e);
        acc = _mm512_add_ps(acc, e);
    }
    return _mm512_reduce_add_ps(acc);
}

TGT float att_max_avx512(const float *s, int n, float mx) {
    __m512 m = _mm512_set1_ps(mx);
    for (int i = 0; i < n; i += 16) m = _mm512_max_ps(m, _mm512_mask_loadu_ps(m, tail_mask(n - i), s + i));
    return _mm512_reduce_max_ps(m);
}

TGT void att_scale_avx512(float *s, int n, float f) {
    __m512 v = _mm512_set1_ps(f);
    for (int i = 0; i < n; i += 16) {
        __mmask16 k = tail_mask(n - i);
        _mm512_mask_storeu_ps(s + i, k, _mm512_mul_ps(_mm512_maskz_loadu_ps(k, s + i), v));
    }
}

TGT void att_qk_avx512(const float *q, int ldq, int rows, const float *kt, int ldk, int cols, int hd, float scale,
                   float *s, int lds) {
    rows4(q, ldq, 1, rows, kt, 0, ldk, cols, hd, scale, s, lds, 0, NULL);
}

/* dst[i] = the f16 or bf16 src[i] widened, i < n: 16 at a time */
TGT void att_widen_avx512(const void *src, int bf16, size_t n, float *dst, const void *pf) {
    const uint16_t *h = src;
    size_t i = 0;
    for (; i + 16 <= n; i += 16) {
        if (pf && !(i & 31)) _mm_prefetch((const char *)((const uint16_t *)pf + i), _MM_HINT_T1);
        __m256i x = _mm256_loadu_si256((const __m256i *)(h + i));
        _mm512_storeu_ps(dst + i, bf16 ? _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(x), 16)) : _mm512_cvtph_ps(x));
    }
    for (; i < n; i++) dst[i] = bf16 ? be_bf16_to_f32(h[i]) : be_f16_to_f32(h[i]);
}

/* dst[d][t] = src[t][d] for t < n, d < hd (dst's rows ldd apart): 16 x 16 blocks in registers, the edges one by one;
 * pf (or NULL): n x hd floats laid out as src (the next segment's keys), each block's lines prefetched there */
TGT void att_transpose_avx512(const float *src, int n, int hd, float *dst, size_t ldd, const float *pf) {
    int n16 = n / 16 * 16, h16 = hd / 16 * 16;
    for (int t0 = 0; t0 < n16; t0 += 16)
        for (int d0 = 0; d0 < h16; d0 += 16) {
            __m512 r[16], u[16];
            for (int i = 0; pf && i < 16; i++) _mm_prefetch((const char *)(pf + (size_t)(t0 + i) * hd + d0), _MM_HINT_T1);
#pragma GCC unroll 16   /* every loop over r and u unrolled whole: they stay in registers */
            for (int i = 0; i < 16; i++) r[i] = _mm512_loadu_ps(src + (size_t)(t0 + i) * hd + d0);
#pragma GCC unroll 8
            for (int i = 0; i < 16; i += 2) {   /* pairs of rows interleaved by element, */
                u[i] = _mm512_unpacklo_ps(r[i], r[i + 1]);
                u[i + 1] = _mm512_unpackhi_ps(r[i], r[i + 1]);
            }
#pragma GCC unroll 4
            for (int i = 0; i < 16; i += 4) {   /* then by element pair: 4 rows' column in each 128-bit lane, */
                r[i] = _mm512_castpd_ps(_mm512_unpacklo_pd(_mm512_castps_pd(u[i]), _mm512_castps_pd(u[i + 2])));
                r[i + 1] = _mm512_castpd_ps(_mm512_unpackhi_pd(_mm512_castps_pd(u[i]), _mm512_castps_pd(u[i + 2])));
                r[i + 2] = _mm512_castpd_ps(_mm512_unpacklo_pd(_mm512_castps_pd(u[i + 1]), _mm512_castps_pd(u[i + 3])));
                r[i + 3] = _mm512_castpd_ps(_mm512_unpackhi_pd(_mm512_castps_pd(u[i + 1]), _mm512_castps_pd(u[i + 3])));
            }
#pragma GCC unroll 4
            for (int i = 0; i < 4; i++) {   /* then the 128-bit lanes of the four groups of 4 rows gathered */
                __m512 a0 = _mm512_shuffle_f32x4(r[i], r[4 + i], 0x88), a1 = _mm512_shuffle_f32x4(r[i], r[4 + i], 0xdd);
                __m512 b0 = _mm512_shuffle_f32x4(r[8 + i], r[12 + i], 0x88), b1 = _mm512_shuffle_f32x4(r[8 + i], r[12 + i], 0xdd);
                u[i] = _mm512_shuffle_f32x4(a0, b0, 0x88);
                u[8 + i] = _mm512_shuffle_f32x4(a0, b0, 0xdd);
                u[4 + i] = _mm512_shuffle_f32x4(a1, b1, 0x88);
                u[12 + i] = _mm512_shuffle_f32x4(a1, b1, 0xdd);
            }
#pragma GCC unroll 16
            for (int i = 0; i < 16; i++) _mm512_storeu_ps(dst + (size_t)(d0 + i) * ldd + t0, u[i]);   /* u[i]: column i */
        }
    for (int t = 0; t < n; t++)
        for (int d = t < n16 ? h16 : 0; d < hd; d++) dst[(size_t)d * ldd + t] = src[(size_t)t * hd + d];
}

TGT void att_pv_avx512(const float *s, int lds, int rows, int cols, const float *v, int hd, float *o, int ldo, int add,
                   const float *pf) {
    rows4(s, lds, 1, rows, v, 0, hd, hd, cols, 1.0f, o, ldo, add, pf);
}

TGT void att_pv_t_avx512(const float *st, int h0, int rows, int cols, const void *v, be_dtype vdt, int hd, float *o, int ldo,
                         int add, const void *pf) {
    if (vdt == BE_BF16) rows4(st + h0, 1, 8, rows, v, 1, hd, hd, cols, 1.0f, o, ldo, add, pf);
    else if (vdt == BE_F16) rows4(st + h0, 1, 8, rows, v, 2, hd, hd, cols, 1.0f, o, ldo, add, pf);
    else rows4(st + h0, 1, 8, rows, v, 0, hd, hd, cols, 1.0f, o, ldo, add, pf);
}

/* the union of [a0, a1) and [b0, b1) within [0, T) as at most two ordered, disjoint ranges r[0..2n) */
static int union2(int T, int a0, int a1, int b0, int b1, int r[4]) {
    int in[2][2] = {{a0 < 0 ? 0 : a0, a1 > T ? T : a1}, {b0 < 0 ? 0 : b0, b1 > T ? T : b1}}, n = 0;
    if (in[1][0] < in[0][0]) {
        int t0 = in[0][0], t1 = in[0][1];
        in[0][0] = in[1][0], in[0][1] = in[1][1], in[1][0] = t0, in[1][1] = t1;
    }
    for (int i = 0; i < 2; i++) {
        if (in[i][1] <= in[i][0]) continue;
        if (n && in[i][0] <= r[2 * n - 1]) {
            if (in[i][1] > r[2 * n - 1]) r[2 * n - 1] = in[i][1];
        } else {
            r[2 * n] = in[i][0], r[2 * n + 1] = in[i][1], n++;
        }
    }
    return n;
}

/* the softmax of st[t][h] (8 heads a key) over the keys [a0, a1) and [b0, b1) for each head, zeros elsewhere
 * (softcapped first when cap > 0); two keys a vector */
TGT void att_softmax_t_avx512(float *st, int T, int a0, int a1, int b0, int b1, float cap) {
    if (cap > 0) for (size_t i = 0; i < 8 * (size_t)T; i++) st[i] = be_softcap(st[i], cap);
    int r[4], n = union2(T, a0, a1, b0, b1, r);
    __m512 m = _mm512_set1_ps(-INFINITY), sum = _mm512_setzero_ps();
    for (int g = 0; g < n; g++)
        for (int t = r[2 * g]; t < r[2 * g + 1]; t += 2)
            m = _mm512_max_ps(m, _mm512_mask_loadu_ps(m, r[2 * g + 1] - t > 1 ? 0xffff : 0x00ff, st + 8 * (size_t)t));
    __m256 m8 = _mm256_max_ps(_mm512_castps512_ps256(m), _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(m), 1)));
    m = _mm512_castpd_ps(_mm512_insertf64x4(_mm512_castpd256_pd512(_mm256_castps_pd(m8)), _mm256_castps_pd(m8), 1));
    int prev = 0;
    for (int g = 0; g < n; g++) {
        memset(st + 8 * (size_t)prev, 0, sizeof(float) * 8 * (size_t)(r[2 * g] - prev));
        for (int t = r[2 * g]; t < r[2 * g + 1]; t += 2) {
            __mmask16 k = r[2 * g + 1] - t > 1 ? 0xffff : 0x00ff;
            __m512 e = _mm512_maskz_mov_ps(k, _ZGVeN16v_expf(_mm512_sub_ps(_mm512_maskz_loadu_ps(k, st + 8 * (size_t)t), m)));
            _mm512_mask_storeu_ps(st + 8 * (size_t)t, k, e);
            sum = _mm512_add_ps(sum, e);
        }
        prev = r[2 * g + 1];
    }
    memset(st + 8 * (size_t)prev, 0, sizeof(float) * 8 * (size_t)(T - prev));
    __m256 s8 = _mm256_add_ps(_mm512_castps512_ps256(sum), _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(sum), 1)));
    s8 = _mm256_div_ps(_mm256_set1_ps(1.0f), s8);
    __m512 inv = _mm512_castpd_ps(_mm512_insertf64x4(_mm512_castpd256_pd512(_mm256_castps_pd(s8)), _mm256_castps_pd(s8), 1));
    for (int g = 0; g < n; g++)
        for (int t = r[2 * g]; t < r[2 * g + 1]; t += 2) {
            __mmask16 k = r[2 * g + 1] - t > 1 ? 0xffff : 0x00ff;
            _mm512_mask_storeu_ps(st + 8 * (size_t)t, k, _mm512_mul_ps(_mm512_maskz_loadu_ps(k, st + 8 * (size_t)t), inv));
        }
}
#else
int att_avx512_available(void) { return 0; }
float att_exp_avx512(float *s, int n, float mx) { (void)s; (void)n; (void)mx; return 0; }
float att_max_avx512(const float *s, int n, float mx) { (void)s; (void)n; return mx; }
void att_scale_avx512(float *s, int n, float f) { (void)s; (void)n; (void)f; }
void att_qk_avx512(const float *q, int ldq, int rows, const float *kt, int ldk, int cols, int hd, float scale,
                   float *s, int lds) {
    (void)q; (void)ldq; (void)rows; (void)kt; (void)ldk; (void)cols; (void)hd; (void)scale; (void)s; (void)lds;
}
void att_pv_avx512(const float *s, int lds, int rows, int cols, const float *v, int hd, float *o, int ldo, int add,
                   const float *pf) {
    (void)s; (void)lds; (void)rows; (void)cols; (void)v; (void)hd; (void)o; (void)ldo; (void)add; (void)pf;
}
void att_pv_t_avx512(const float *st, int h0, int rows, int cols, const void *v, be_dtype vdt, int hd, float *o, int ldo,
                     int add, const void *pf) {
    (void)st; (void)h0; (void)rows; (void)cols; (void)v; (void)vdt; (void)hd; (void)o; (void)ldo; (void)add; (void)pf;
}
void att_softmax_t_avx512(float *st, int T, int a0, int a1, int b0, int b1, float cap) {
    (void)st; (void)T; (void)a0; (void)a1; (void)b0; (void)b1; (void)cap;
}
void att_transpose_avx512(const float *src, int n, int hd, float *dst, size_t ldd, const float *pf) {
    (void)src; (void)n; (void)hd; (void)dst; (void)ldd; (void)pf;
}
void att_widen_avx512(const void *src, int bf16, size_t n, float *dst, const void *pf) {
    (void)src; (void)bf16; (void)n; (void)dst; (void)pf;
}
#endif
