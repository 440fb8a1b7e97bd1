/*
 * dtype.c — element sizes, names and scalar conversions between float32 and
 * the 16-bit formats (IEEE half, bfloat16), round-to-nearest-even, NaN kept;
 * the traits of every stored type, the MLX affine-quantized ones included
 * (their codes are read through quant/affine.h).
 */
#include <string.h>
#include "backend/backend.h"
#include "quant/affine.h"


float be_f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000) << 16, exp = (h >> 10) & 0x1f, man = h & 0x3ff, bits;
    if (exp == 0) {
        if (man == 0) {
            bits = sign;
        } else {            /* subnormal: normalise */
            int e = -1;
            do { man <<= 1; e++; } while (!(man & 0x400));
            bits = sign | ((uint32_t)(127 - 15 - e) << 23) | ((man & 0x3ff) << 13);
        }
    } else if (exp == 31) {
        bits = sign | 0x7f800000u | (man << 13);
    } else {
        bits = sign | ((exp + 112) << 23) | (man << 13);
    }
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

uint16_t be_f32_to_f16(float f) {
    uint32_t x;
    memcpy(&x, &f, 4);
    uint32_t sign = (x >> 16) & 0x8000;
    int32_t exp = (int32_t)((x >> 23) & 0xff) - 127 + 15;
    uint32_t man = x & 0x7fffff;
    if (((x >> 23) & 0xff) == 0xff) return (uint16_t)(sign | 0x7c00 | (man ? 0x200 : 0));
    if (exp >= 31) return (uint16_t)(sign | 0x7c00);
    if (exp <= 0) {
        if (exp < -10) return (uint16_t)sign;
        man |= 0x800000;
        int shift = 14 - exp;
        uint32_t half = man >> shift, rem = man & ((1u << shift) - 1), mid = 1u << (shift - 1);
        if (rem > mid || (rem == mid && (half & 1))) half++;
        return (uint16_t)(sign | half);
    }
    uint32_t h = sign | ((uint32_t)exp << 10) | (man >> 13), rem = man & 0x1fff;
    if (rem > 0x1000 || (rem == 0x1000 && (h & 1))) h++;
    return (uint16_t)h;
}

uint16_t be_f32_to_bf16(float f) {
    uint32_t x;
    memcpy(&x, &f, 4);
    if ((x & 0x7fffffff) > 0x7f800000) return (uint16_t)((x >> 16) | 0x40);
    x += 0x7fff + ((x >> 16) & 1);
    return (uint16_t)(x >> 16);
}

static float get_f32(const void *p, size_t i) { return ((const float *)p)[i]; }
static float get_f16(const void *p, size_t i) { return be_f16_to_f32(((const uint16_t *)p)[i]); }
static float get_bf16(const void *p, size_t i) { return be_bf16_to_f32(((const uint16_t *)p)[i]); }
static void put_f32(void *p, size_t i, float x) { ((float *)p)[i] = x; }
static void put_f16(void *p, size_t i, float x) { ((uint16_t *)p)[i] = be_f32_to_f16(x); }
static void put_bf16(void *p, size_t i, float x) { ((uint16_t *)p)[i] = be_f32_to_bf16(x); }

#define AFFINE(b) {"q" #b, NULL, 0, NULL, NULL, b, 1}
static const be_type_traits traits[BE_N_DTYPES] = {
    [BE_F32] = {"f32", "F32", 4, get_f32, put_f32, 32, 0},
    [BE_F16] = {"f16", "F16", 2, get_f16, put_f16, 16, 0},
    [BE_BF16] = {"bf16", "BF16", 2, get_bf16, put_bf16, 16, 0},
    [BE_Q2] = AFFINE(2), [BE_Q3] = AFFINE(3), [BE_Q4] = AFFINE(4),
    [BE_Q5] = AFFINE(5), [BE_Q6] = AFFINE(6), [BE_Q8] = AFFINE(8),
};

const be_type_traits *be_traits(be_dtype t) { return &traits[t]; }
size_t be_dtype_size(be_dtype t) { return traits[t].size; }
const char *be_dtype_name(be_dtype t) { return traits[t].name; }

int be_dtype_from_st(const char *st_name, be_dtype *out) {
    for (int t = 0; t < BE_N_DTYPES; t++)
        if (traits[t].st_name && !strcmp(st_name, traits[t].st_name)) { *out = (be_dtype)t; return 1; }
    return 0;
}

int be_dtype_affine(int bits, be_dtype *out) {
    for (int t = 0; t < BE_N_DTYPES; t++)
        if (traits[t].affine && traits[t].bits == bits) { *out = (be_dtype)t; return 1; }
    return 0;
}

size_t be_mat_bytes(const be_mat *m) {
    size_t n = (size_t)m->rows * (size_t)m->cols;
    if (!traits[m->dt].affine) return n * traits[m->dt].size;
    return n * (size_t)traits[m->dt].bits / 8 + 2 * (n / (size_t)m->group) * traits[m->sdt].size;
}

int be_dtype_from_name(const char *name, be_dtype *out) {
    for (int t = 0; name && t < BE_N_DTYPES; t++)
        if (!traits[t].affine && !strcmp(name, traits[t].name)) { *out = (be_dtype)t; return 1; }
    return 0;
}

float be_mat_get(const be_mat *m, int64_t r, int64_t c) {
    if (traits[m->dt].affine) {
        int bits = traits[m->dt].bits;
        size_t gi = (size_t)r * (size_t)(m->cols / m->group) + (size_t)(c / m->group);
        const uint8_t *row = (const uint8_t *)m->data + (size_t)r * aq_row_bytes(m->cols, bits);
        return be_kv_get(m->scales, m->sdt, gi) * (float)aq_code(row, c, bits) + be_kv_get(m->biases, m->sdt, gi);
    }
    return traits[m->dt].get(m->data, (size_t)r * (size_t)m->cols + (size_t)c);
}

float be_kv_get(const void *p, be_dtype dt, size_t i) { return traits[dt].get(p, i); }
void be_kv_put(void *p, be_dtype dt, size_t i, float x) { traits[dt].put(p, i, x); }
