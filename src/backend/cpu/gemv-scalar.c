/*
 * gemv-scalar.c — portable matrix-vector kernels (the fallback on CPUs without
 * AVX2, and on non-x86 builds) and the run-time choice of kernel set.
 *
 * Contract: gemv.h. Accumulates in f32 with 4 partial sums per row (the same
 * association as a 4-lane vector loop, which the compiler may vectorise).
 */
#include <stdlib.h>
#include <string.h>
#include "backend/cpu/gemv.h"

static inline float ld_f32(const void *w, int64_t i) { return ((const float *)w)[i]; }
static inline float ld_f16(const void *w, int64_t i) { return be_f16_to_f32(((const uint16_t *)w)[i]); }
static inline float ld_bf16(const void *w, int64_t i) { return be_bf16_to_f32(((const uint16_t *)w)[i]); }

#define SCALAR_KERNELS(NAME, LD)                                                              \
    static void gemv_##NAME##_scalar(const float *x, int n, const be_mat *wm,         \
                                     int64_t r0, int64_t r1, float *y, int64_t ldy) { \
        int64_t k = wm->cols; const void *w = wm->data;         \
        for (int64_t r = r0; r < r1; r++) {                                                   \
            int64_t base = r * k;                                                             \
            for (int t = 0; t < n; t++) {                                                     \
                const float *xt = x + (int64_t)t * k;                                         \
                float s0 = 0, s1 = 0, s2 = 0, s3 = 0;                                         \
                int64_t i = 0;                                                                \
                for (; i + 4 <= k; i += 4) {                                                  \
                    s0 += xt[i] * LD(w, base + i);                                            \
                    s1 += xt[i + 1] * LD(w, base + i + 1);                                    \
                    s2 += xt[i + 2] * LD(w, base + i + 2);                                    \
                    s3 += xt[i + 3] * LD(w, base + i + 3);                                    \
                }                                                                             \
                for (; i < k; i++) s0 += xt[i] * LD(w, base + i);                             \
                y[(int64_t)t * ldy + r] = (s0 + s1) + (s2 + s3);                              \
            }                                                                                 \
        }                                                                                     \
    }                                                                                         \
    static void rows_##NAME##_scalar(const be_mat *wm, int64_t r0, int64_t r1,        \
                                     float *dst) { \
        int64_t k = wm->cols; const void *w = wm->data;                                            \
        for (int64_t i = r0 * k; i < r1 * k; i++) *dst++ = LD(w, i);                          \
    }

SCALAR_KERNELS(f32, ld_f32)
SCALAR_KERNELS(f16, ld_f16)
SCALAR_KERNELS(bf16, ld_bf16)

const gemv_kernels gemv_scalar_kernels = {
    "scalar",
    { gemv_f32_scalar, gemv_f16_scalar, gemv_bf16_scalar, AFFINE_ENTRIES(gemv, scalar) },
    { rows_f32_scalar, rows_f16_scalar, rows_bf16_scalar, AFFINE_ENTRIES(rows, scalar) },
    { NULL, NULL, NULL },
};

const gemv_kernels *gemv_isa(const char *isa) {
#ifdef GEMV_X86
    if (!strcmp(isa, "avx512vnni")) return gemv_avx512_vnni();
    if (!strcmp(isa, "avx512"))
        return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                       __builtin_cpu_supports("avx512vl") ? &gemv_avx512_kernels : NULL;
    if (!strcmp(isa, "avx2"))
        return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
                       __builtin_cpu_supports("f16c") ? &gemv_avx2_kernels : NULL;
#endif
    if (!strcmp(isa, "scalar")) return &gemv_scalar_kernels;
    return NULL;
}

int cpu_isa_capped(const char *isa) {
    static const char *order[] = { "amx", "avx512vnni", "avx512", "avx2", "scalar" };
    const char *cap = getenv("CINFER_ISA");
    if (!cap || !*cap) return 0;
    int ci = 5, ii = 0;
    for (int i = 0; i < 5; i++) {
        if (!strcmp(cap, order[i])) ci = i;
        if (!strcmp(isa, order[i])) ii = i;
    }
    return ci > ii;
}

const gemv_kernels *gemv_pick(void) {
    /* CINFER_ISA caps the choice (benchmarks and tests of the fallbacks) */
    const char *cap = getenv("CINFER_ISA");
    static const char *order[] = { "avx512vnni", "avx512", "avx2", "scalar" };
    int start = 0;
    if (cap && !strcmp(cap, "avx512")) start = 1;
    if (cap && !strcmp(cap, "avx2")) start = 2;
    if (cap && !strcmp(cap, "scalar")) start = 3;
    const char *i8 = getenv("CINFER_INT8_ACT");
    for (int i = start; i < 4; i++) {
        const gemv_kernels *g = gemv_isa(order[i]);
        if (g) return i8 && !strcmp(i8, "1") ? gemv_int8_act(g) : g;
    }
    return &gemv_scalar_kernels;
}
