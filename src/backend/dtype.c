/*
 * dtype.c — element sizes, names and scalar conversions between float32 and
 * the 16-bit formats (IEEE half, bfloat16), round-to-nearest-even, NaN kept.
 */
#include <string.h>
#include "backend/backend.h"

size_t be_dtype_size(be_dtype t) { return t == BE_F32 ? 4 : 2; }

const char *be_dtype_name(be_dtype t) {
    return t == BE_F32 ? "f32" : t == BE_F16 ? "f16" : "bf16";
}

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

float be_mat_get(const be_mat *m, int64_t r, int64_t c) {
    size_t i = (size_t)r * (size_t)m->cols + (size_t)c;
    switch (m->dt) {
    case BE_F32: return ((const float *)m->data)[i];
    case BE_F16: return be_f16_to_f32(((const uint16_t *)m->data)[i]);
    case BE_BF16: return be_bf16_to_f32(((const uint16_t *)m->data)[i]);
    }
    return 0;
}

float be_kv_get(const void *p, be_dtype dt, size_t i) {
    if (dt == BE_F32) return ((const float *)p)[i];
    uint16_t h = ((const uint16_t *)p)[i];
    return dt == BE_F16 ? be_f16_to_f32(h) : be_bf16_to_f32(h);
}

void be_kv_put(void *p, be_dtype dt, size_t i, float x) {
    if (dt == BE_F32) ((float *)p)[i] = x;
    else ((uint16_t *)p)[i] = dt == BE_F16 ? be_f32_to_f16(x) : be_f32_to_bf16(x);
}
