/*
 * affine.h — MLX's affine quantization of float rows: the one place that
 * knows the code layout and the rounding rules (weights, the converter, and
 * later the quantized KV pages all call these).
 *
 * A row of `cols` floats is cut into groups of `group` values; each group
 * keeps a scale s and a bias b (stored in the scale dtype, f32/f16/bf16) and
 * one `bits`-bit code q per value, with value = s*q + b. Codes form a
 * little-endian bit stream per row: code k occupies bits [k*bits, (k+1)*bits)
 * of the row's bytes (for 2/4/8 bits that is "first code in the low bits of
 * each uint32"; 3/5/6 bits are the byte-packed 8-codes-in-3/5 bytes and
 * 4-in-3 streams). A row takes cols*bits/8 bytes; MLX exposes it as uint32
 * [cols*bits/32], which needs cols % 32 == 0 (true for every group size).
 *
 * Quantizing one group (../shared/specs/quantization.md, checked bit for bit
 * against MLX 0.32.1 in tests/test-quant.c): all float32, n = 2^bits - 1,
 *   mx = max w (GPU rule: max(0, max w)), mn = min w,
 *   s0 = max((mx - mn)/n, 1e-7); |mn| > |mx| ? (s = s0, edge = mn) : (s = -s0, edge = mx);
 *   q0 = round(edge/s); q0 != 0 ? (s = edge/q0, b = edge) : (b = 0);
 *   q = clamp(round((w - b)/s), 0, n)    with the unrounded s and b,
 * and only then s and b are rounded to the scale dtype. round: CPU rule =
 * rint (ties to even), GPU (Metal/CUDA) rule = half away from zero.
 */
#ifndef CINFER_AFFINE_H
#define CINFER_AFFINE_H
#include <stddef.h>
#include <stdint.h>
#include "backend/backend.h"

typedef enum aq_rounding { AQ_ROUND_GPU = 0, AQ_ROUND_CPU = 1 } aq_rounding;

/* 1 when bits is 2, 3, 4, 5, 6 or 8 and group is 32, 64 or 128 */
int aq_valid(int bits, int group);
/* bytes of one packed row of cols values (cols % 8 == 0) */
static inline BE_HD size_t aq_row_bytes(int64_t cols, int bits) { return (size_t)cols * (size_t)bits / 8; }

/* code k of a packed row, and its store (the other codes kept) */
static inline uint32_t aq_code(const uint8_t *row, int64_t k, int bits) {
    uint64_t bit = (uint64_t)k * (uint64_t)bits, v = 0;
    const uint8_t *p = row + (bit >> 3);
    int sh = (int)(bit & 7), nb = (sh + bits + 7) >> 3;
    for (int i = 0; i < nb; i++) v |= (uint64_t)p[i] << (8 * i);
    return (uint32_t)(v >> sh) & ((1u << bits) - 1);
}
void aq_put_code(uint8_t *row, int64_t k, int bits, uint32_t q);

/* Quantizes w[cols] (cols % group == 0) into packed[aq_row_bytes] and
 * scales/biases[cols/group] of dtype sdt. */
void aq_quantize_row(const float *w, int64_t cols, int bits, int group, aq_rounding r, be_dtype sdt, uint8_t *packed,
                     void *scales, void *biases);
/* dst[cnt] = values c0 .. c0+cnt-1 of a packed row, s*q + b in f32 (the
 * definition the kernels are tested against; scales/biases of the whole row) */
void aq_dequant_row(const uint8_t *packed, const void *scales, const void *biases, be_dtype sdt, int bits, int group,
                    int64_t c0, int64_t cnt, float *dst);
/* MLX's mx.dequantize: the same, computed in the scale dtype (bf16/f16: rounded after each op) */
void aq_dequant_row_mlx(const uint8_t *packed, const void *scales, const void *biases, be_dtype sdt, int bits,
                        int group, int64_t cols, float *dst);
/* sum_i x[i] * (s*q_i + b) over a packed row of cols values, f32: the scalar reference dot */
float aq_dot_row(const float *x, const uint8_t *packed, const void *scales, const void *biases, be_dtype sdt, int bits,
                 int group, int64_t cols);
#endif
