/*
 * affine.c — MLX affine quantize / dequantize / dot on packed rows (affine.h).
 * Scalar and exact; the fast dot products live in the backends' kernels and
 * are tested against aq_dot_row.
 */
#include <math.h>
#include "quant/affine.h"

int aq_valid(int bits, int group) {
    return (bits == 2 || bits == 3 || bits == 4 || bits == 5 || bits == 6 || bits == 8) &&
           (group == 32 || group == 64 || group == 128);
}

void aq_put_code(uint8_t *row, int64_t k, int bits, uint32_t q) {
    uint64_t bit = (uint64_t)k * (uint64_t)bits;
    uint8_t *p = row + (bit >> 3);
    int sh = (int)(bit & 7), nb = (sh + bits + 7) >> 3;
    uint64_t v = 0, mask = (uint64_t)((1u << bits) - 1) << sh;
    for (int i = 0; i < nb; i++) v |= (uint64_t)p[i] << (8 * i);
    v = (v & ~mask) | ((uint64_t)(q & ((1u << bits) - 1)) << sh);
    for (int i = 0; i < nb; i++) p[i] = (uint8_t)(v >> (8 * i));
}

static float rnd(float x, aq_rounding r) { return r == AQ_ROUND_CPU ? rintf(x) : roundf(x); }

void aq_quantize_row(const float *w, int64_t cols, int bits, int group, aq_rounding r, be_dtype sdt, uint8_t *packed,
                     void *scales, void *biases) {
    const float n = (float)((1 << bits) - 1), eps = 1e-7f;
    for (int64_t g = 0; g < cols / group; g++) {
        const float *v = w + g * group;
        float mx = r == AQ_ROUND_GPU ? 0.0f : v[0], mn = v[0];
        for (int i = 0; i < group; i++) {
            if (v[i] > mx) mx = v[i];
            if (v[i] < mn) mn = v[i];
        }
        float s0 = (mx - mn) / n;
        if (!(s0 > eps)) s0 = eps;
        float scale, edge;
        if (fabsf(mn) > fabsf(mx)) { scale = s0; edge = mn; }
        else { scale = -s0; edge = mx; }
        float q0 = rnd(edge / scale, r), bias = 0.0f;
        if (q0 != 0.0f) { scale = edge / q0; bias = edge; }
        for (int i = 0; i < group; i++) {
            float q = rnd((v[i] - bias) / scale, r);
            q = q < 0.0f ? 0.0f : q > n ? n : q;
            aq_put_code(packed, g * group + i, bits, (uint32_t)q);
        }
        be_kv_put(scales, sdt, (size_t)g, scale);
        be_kv_put(biases, sdt, (size_t)g, bias);
    }
}

void aq_dequant_row(const uint8_t *packed, const void *scales, const void *biases, be_dtype sdt, int bits, int group,
                    int64_t c0, int64_t cnt, float *dst) {
    for (int64_t i = 0; i < cnt; i++) {
        int64_t c = c0 + i, g = c / group;
        float s = be_kv_get(scales, sdt, (size_t)g), b = be_kv_get(biases, sdt, (size_t)g);
        dst[i] = s * (float)aq_code(packed, c, bits) + b;
    }
}

void aq_dequant_row_mlx(const uint8_t *packed, const void *scales, const void *biases, be_dtype sdt, int bits,
                        int group, int64_t cols, float *dst) {
    for (int64_t c = 0; c < cols; c++) {
        int64_t g = c / group;
        float s = be_kv_get(scales, sdt, (size_t)g), b = be_kv_get(biases, sdt, (size_t)g), t;
        uint16_t h = 0;
        if (sdt == BE_F32) { dst[c] = s * (float)aq_code(packed, c, bits) + b; continue; }
        be_kv_put(&h, sdt, 0, s * (float)aq_code(packed, c, bits));
        t = be_kv_get(&h, sdt, 0) + b;
        be_kv_put(&h, sdt, 0, t);
        dst[c] = be_kv_get(&h, sdt, 0);
    }
}

float aq_dot_row(const float *x, const uint8_t *packed, const void *scales, const void *biases, be_dtype sdt, int bits,
                 int group, int64_t cols) {
    float acc = 0.0f;
    for (int64_t g = 0; g < cols / group; g++) {
        float s = be_kv_get(scales, sdt, (size_t)g), b = be_kv_get(biases, sdt, (size_t)g), sq = 0.0f, sx = 0.0f;
        for (int i = 0; i < group; i++) {
            int64_t c = g * group + i;
            sq += x[c] * (float)aq_code(packed, c, bits);
            sx += x[c];
        }
        acc += s * sq + b * sx;
    }
    return acc;
}
