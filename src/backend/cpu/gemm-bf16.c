/*
 * gemm-bf16.c — prefill matmul for bf16 weights with AVX-512 BF16 dot
 * products (vdpbf16ps): y[n][m] = bf16(x)[n][k] . w[m][k]^T, f32 accumulate.
 *
 * Opt-in (CINFER_BF16_ACT=1, see matmul.c): the activations are rounded to
 * bf16 (round to nearest even) before the products, as llama.cpp does for
 * BF16 models, so results differ from the exact f32 path by that rounding
 * (relative ~2^-9 per activation, averaging out over k). Weights are used
 * exactly, in place: no conversion, no packing.
 *
 * Layout: x is packed once per call (gemm_bf16_pack_x) into token blocks of
 * 32: xp[nb][kp][32] of u32, each the bf16 pair (x[t][2i], x[t][2i+1]), zero
 * padded past n and past k. The micro-kernel holds 12 weight rows x 32 tokens
 * of f32 accumulators (24 zmm): per pair index i it loads two x vectors
 * (16 tokens' pairs each), broadcasts the 12 rows' weight pairs w[r][2i..2i+1]
 * straight from the row-major weights, and issues 24 vdpbf16ps (each 16 lanes
 * x 2 products). Outputs are scattered to y[t][r] (stride m).
 * An odd k's last weight is loaded alone (the pair would read past the row).
 *
 * Function-level target attributes; used only when __builtin_cpu_supports
 * reports avx512bf16 and CINFER_ISA caps nothing below avx512 (gemm_bf16_available);
 * elsewhere matmul.c feeds the same rounded activations to the f32 path.
 */
#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#include <stdlib.h>
#include <string.h>
#include "backend/cpu/gemv.h"

#define TGT "avx512f,avx512bw,avx512vl,avx512dq,avx512bf16"
#define KERNEL __attribute__((target(TGT)))
#define MR 12   /* weight rows per tile */
#define NR 32   /* tokens per tile */

int gemm_bf16_available(void) {
    if (cpu_isa_capped("avx512")) return 0;
    return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
           __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512bf16");
}

size_t gemm_bf16_xp_words(int n, int64_t k) {
    return (size_t)((n + NR - 1) / NR) * (size_t)((k + 1) / 2) * NR;
}

/* dst[i] = bf16(src[i]), round to nearest even (be_f32_to_bf16's rule for finite values) */
KERNEL void gemm_bf16_round(const float *src, int64_t k, uint16_t *dst) {
    int64_t i = 0;
    for (; i + 16 <= k; i += 16) _mm256_storeu_si256((__m256i *)(dst + i), (__m256i)_mm512_cvtneps_pbh(_mm512_loadu_ps(src + i)));
    for (; i < k; i++) dst[i] = be_f32_to_bf16(src[i]);
}

/* x[n][k] f32 -> xp[nb][kp][NR] bf16 pairs; tmp holds one bf16 row (k+1 u16) */
KERNEL void gemm_bf16_pack_x(const float *x, int n, int64_t k, uint32_t *xp, uint16_t *tmp) {
    int64_t kp = (k + 1) / 2;
    int nb = (n + NR - 1) / NR;
    for (int t = 0; t < nb * NR; t++) {
        uint32_t *dst = xp + (size_t)(t / NR) * kp * NR + t % NR;
        if (t >= n) {
            for (int64_t i = 0; i < kp; i++) dst[i * NR] = 0;
            continue;
        }
        gemm_bf16_round(x + (size_t)t * k, k, tmp);
        tmp[k] = 0;
        for (int64_t j = 0; j < kp; j++) {
            uint32_t v;
            memcpy(&v, tmp + 2 * j, 4);
            dst[j * NR] = v;
        }
    }
}

/* one tile: rows r[0..MR) (pointers to their first pair), tokens block xb */
KERNEL static void tile(const uint16_t *const *wr, const uint32_t *xb, int64_t k, int rows,
                        int tokens, float *y, int64_t ldy) {
    __m512 acc[MR][2];
    for (int r = 0; r < MR; r++) acc[r][0] = acc[r][1] = _mm512_setzero_ps();
    int64_t kfull = k / 2;
    const uint16_t *p0 = wr[0], *p1 = wr[1], *p2 = wr[2], *p3 = wr[3], *p4 = wr[4], *p5 = wr[5];
    const uint16_t *p6 = wr[6], *p7 = wr[7], *p8 = wr[8], *p9 = wr[9], *p10 = wr[10], *p11 = wr[11];
#define DP(R, P)                                                                                   \
    do {                                                                                           \
        uint32_t wv;                                                                               \
        memcpy(&wv, (P) + 2 * i, 4);                                                               \
        __m512bh b = (__m512bh)_mm512_set1_epi32((int)wv);                                         \
        acc[R][0] = _mm512_dpbf16_ps(acc[R][0], x0, b);                                            \
        acc[R][1] = _mm512_dpbf16_ps(acc[R][1], x1, b);                                            \
    } while (0)
    for (int64_t i = 0; i < kfull; i++) {
        __m512bh x0 = (__m512bh)_mm512_loadu_si512(xb + i * NR);
        __m512bh x1 = (__m512bh)_mm512_loadu_si512(xb + i * NR + 16);
        DP(0, p0); DP(1, p1); DP(2, p2); DP(3, p3); DP(4, p4); DP(5, p5);
        DP(6, p6); DP(7, p7); DP(8, p8); DP(9, p9); DP(10, p10); DP(11, p11);
    }
#undef DP
    if (k & 1) {   /* last weight alone: its pair partner would be past the row */
        int64_t i = kfull;
        __m512bh x0 = (__m512bh)_mm512_loadu_si512(xb + i * NR);
        __m512bh x1 = (__m512bh)_mm512_loadu_si512(xb + i * NR + 16);
        for (int r = 0; r < MR; r++) {
            __m512bh b = (__m512bh)_mm512_set1_epi32((int)wr[r][2 * i]);
            acc[r][0] = _mm512_dpbf16_ps(acc[r][0], x0, b);
            acc[r][1] = _mm512_dpbf16_ps(acc[r][1], x1, b);
        }
    }
    __m512i idx = _mm512_mullo_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
                                     _mm512_set1_epi32((int)ldy));
    for (int h = 0; h < 2; h++) {
        int left = tokens - 16 * h;
        if (left <= 0) break;
        __mmask16 m = left >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << left) - 1);
        for (int r = 0; r < rows; r++)
            _mm512_mask_i32scatter_ps(y + (int64_t)16 * h * ldy + r, m, idx, acc[r][h], 4);
    }
}

/* rows [r0, r1) of y[n][m] from packed x */
KERNEL void gemm_bf16_rows(const uint32_t *xp, int n, int64_t k, const uint16_t *w, int64_t m,
                           int64_t r0, int64_t r1, float *y) {
    int64_t kp = (k + 1) / 2;
    int nb = (n + NR - 1) / NR;
    for (int64_t r = r0; r < r1; r += MR) {
        int rows = r1 - r < MR ? (int)(r1 - r) : MR;
        const uint16_t *wr[MR];
        for (int i = 0; i < MR; i++) wr[i] = w + (r + (i < rows ? i : rows - 1)) * k;
        for (int b = 0; b < nb; b++) {
            int tokens = n - b * NR < NR ? n - b * NR : NR;
            tile(wr, xp + (size_t)b * kp * NR, k, rows, tokens, y + (int64_t)b * NR * m + r, m);
        }
    }
}
#else
#include "backend/cpu/gemv.h"
int gemm_bf16_available(void) { return 0; }
size_t gemm_bf16_xp_words(int n, int64_t k) { (void)n; (void)k; return 0; }
void gemm_bf16_pack_x(const float *x, int n, int64_t k, uint32_t *xp, uint16_t *tmp) {
    (void)x; (void)n; (void)k; (void)xp; (void)tmp;
}
void gemm_bf16_round(const float *src, int64_t k, uint16_t *dst) {
    for (int64_t i = 0; i < k; i++) dst[i] = be_f32_to_bf16(src[i]);
}
void gemm_bf16_rows(const uint32_t *xp, int n, int64_t k, const uint16_t *w, int64_t m, int64_t r0,
                    int64_t r1, float *y) {
    (void)xp; (void)n; (void)k; (void)w; (void)m; (void)r0; (void)r1; (void)y;
}
#endif
