/*
 * gemm-amx.c — the bf16 mode's prefill matmul (matmul.c) on AMX tiles
 * (TDPBF16PS): y[n][m] = bf16(x)[n][k] . bf16(w)[m][k]^T, f32 accumulate.
 *
 * The same products as gemm-bf16.c's AVX-512 BF16 kernel (activations and
 * weights rounded to bf16 to nearest even, pairs summed in f32), another
 * summation order; AMX flushes bf16 denormals, which only values below 2^-126
 * notice. One TDPBF16PS is 16 x 16 outputs x 32 products: on a Sapphire
 * Rapids core ~900 GFLOP/s against ~100 for vdpbf16ps.
 *
 * Layout (A = tokens, B = weights, so C tiles are y's own rows):
 *   xp  [npad][kpad] u16: x rounded to bf16, rows and columns zero padded to
 *       multiples of 32 (gemm_amx_pack_x, once per matmul, shared by the pool);
 *   wv  [rows/16][kpad/2][16] u32: a block of weight rows in the tiles' pair
 *       layout (lane j of row p = the bf16 pair w[j][2p], w[j][2p+1]), zero
 *       rows past the block (gemm_amx_pack_rows, per worker, from f32 rows);
 *   one step = 2 A tiles (32 tokens x 32 k) x 2 B tiles (32 rows x 32 k) into
 *   4 C tiles (32 x 32 f32), stored straight into y when whole.
 *
 * Linux hands AMX state to a process only after arch_prctl(ARCH_REQ_XCOMP_PERM,
 * XTILEDATA); gemm_amx_available asks once and remembers the answer (a fact of
 * the CPU and kernel, like __builtin_cpu_supports'). CINFER_ISA set to
 * anything but "amx" turns the path off (avx512vnni and below: the AVX-512
 * BF16 kernel). Function-level target attributes: the build works anywhere.
 */
#include <stdlib.h>
#include <string.h>
#include "backend/cpu/gemv.h"

#if defined(__x86_64__) && defined(__linux__)
#include <cpuid.h>
#include <immintrin.h>
#include <stdatomic.h>
#include <sys/syscall.h>
#include <unistd.h>

#define AMX_TGT "amx-tile,amx-bf16,avx512f,avx512bw,avx512vl,avx512bf16"
#define AMX_KERNEL __attribute__((target(AMX_TGT)))
#define ARCH_REQ_XCOMP_PERM 0x1023
#define XFEATURE_XTILEDATA 18

/* CPUID leaf 7 EDX: AMX-BF16 (22), AMX-TILE (24); XCR0 bits 17-18 (tile state enabled by the OS);
 * then the process's permission for tile data */
static int amx_probe(void) {
    unsigned a, b, c, d;
    if (!__get_cpuid_count(7, 0, &a, &b, &c, &d) || !(d & (1u << 22)) || !(d & (1u << 24))) return 0;
    if (!__get_cpuid(1, &a, &b, &c, &d) || !(c & (1u << 27))) return 0;   /* OSXSAVE */
    unsigned lo, hi;
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    if ((lo & (3u << 17)) != (3u << 17)) return 0;
    return syscall(SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) == 0 && gemm_bf16_available();
}

/* CPUID leaf 7 EDX bit 25: AMX-INT8 (attention-kvq.c's scores) */
static int amx_int8_probe(void) {
    unsigned a, b, c, d;
    return __get_cpuid_count(7, 0, &a, &b, &c, &d) && (d & (1u << 25));
}

/* probe's answer, asked once and remembered in *known (0 = not asked yet, 1 = no, 2 = yes): CPUID is a VM exit under
 * a hypervisor, and the attention asks on every call */
static int probe_once(atomic_int *known, int (*probe)(void)) {
    int v = atomic_load_explicit(known, memory_order_relaxed);
    if (!v) atomic_store_explicit(known, v = probe() ? 2 : 1, memory_order_relaxed);
    return v == 2;
}

int gemm_amx_available(void) {
    static atomic_int known;
    return !cpu_isa_capped("amx") && probe_once(&known, amx_probe);
}

/* ... and its int8 products */
int gemm_amx_int8_available(void) {
    static atomic_int known;
    return probe_once(&known, amx_int8_probe) && gemm_amx_available();
}

AMX_KERNEL void gemm_amx_pack_x(const float *x, int n, int64_t k, uint16_t *xp) {
    int64_t kpad = GEMM_AMX_PAD(k), ld = GEMM_AMX_XLD(k);
    int npad = (int)GEMM_AMX_PAD(n);
    for (int t = 0; t < npad; t++) {
        uint16_t *d = xp + (size_t)t * (size_t)ld;
        int64_t i = 0;
        if (t < n) {
            gemm_bf16_round(x + (size_t)t * (size_t)k, k, d);
            i = k;
        }
        memset(d + i, 0, (size_t)(kpad - i) * 2);
    }
}

AMX_KERNEL void gemm_amx_pack_rows(const float *w, int rows, int64_t k, uint32_t *wv) {
    int64_t kpad = GEMM_AMX_PAD(k), kp2 = kpad / 2, kfull = k / 2;
    for (int g = 0; g < (rows + 15) / 16; g++) {
        uint32_t *dst = wv + (size_t)g * (size_t)kp2 * 16;
        int live = rows - 16 * g < 16 ? rows - 16 * g : 16;
        __mmask16 lanes = (__mmask16)((1u << live) - 1);
        /* lane j reads row 16g + j: pairs of floats as one 64-bit gather, two gathers a tile row */
        __m512i idx = _mm512_mullo_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
                                         _mm512_set1_epi32((int)k));
        __m256i lo8 = _mm512_castsi512_si256(idx), hi8 = _mm512_extracti64x4_epi64(idx, 1);
        const float *base = w + (size_t)g * 16 * (size_t)k;
        __mmask8 mlo = (__mmask8)(lanes & 0xff), mhi = (__mmask8)(lanes >> 8);
        int64_t p = 0;
        for (; p < kfull; p++) {
            const float *src = base + 2 * p;
            __m512 a = _mm512_castpd_ps(_mm512_mask_i32gather_pd(_mm512_setzero_pd(), mlo, lo8, src, 4));
            __m512 b = _mm512_castpd_ps(_mm512_mask_i32gather_pd(_mm512_setzero_pd(), mhi, hi8, src, 4));
            _mm512_storeu_si512(dst + (size_t)p * 16, (__m512i)_mm512_cvtne2ps_pbh(b, a));
        }
        for (; p < kp2; p++) {   /* an odd k's last weight alone, then the zero padding */
            uint32_t *d = dst + (size_t)p * 16;
            for (int j = 0; j < 16; j++)
                d[j] = 2 * p < k && j < live ? be_f32_to_bf16(base[(size_t)j * (size_t)k + 2 * p]) : 0;
        }
    }
}

/* tiles 0..n-1 configured as rows[i] x colsb[i] bytes (palette 1), the others unused */
AMX_KERNEL void amx_tiles(int n, const uint8_t *rows, const uint16_t *colsb) {
    struct __attribute__((aligned(64))) { uint8_t palette, start_row, reserved[14]; uint16_t colsb[16]; uint8_t rows[16]; } cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.palette = 1;
    for (int i = 0; i < n && i < 8; i++) {
        cfg.colsb[i] = colsb[i];
        cfg.rows[i] = rows[i];
    }
    _tile_loadconfig(&cfg);
}

/* all eight tiles at the largest shape, 16 rows x 64 bytes */
AMX_KERNEL void amx_tiles_full(void) {
    static const uint8_t rows[8] = {16, 16, 16, 16, 16, 16, 16, 16};
    static const uint16_t colsb[8] = {64, 64, 64, 64, 64, 64, 64, 64};
    amx_tiles(8, rows, colsb);
}

/* the 4 C tiles of a step to y[t0..t0+32)[r0..r0+32), only what lies inside n x rows */
AMX_KERNEL static void store_part(float *y, int64_t ldy, int nt, int nr) {
    float tmp[4][16 * 16] __attribute__((aligned(64)));
    _tile_stored(0, tmp[0], 64);
    _tile_stored(1, tmp[1], 64);
    _tile_stored(2, tmp[2], 64);
    _tile_stored(3, tmp[3], 64);
    for (int q = 0; q < 4; q++) {   /* tile q: tokens 16 (q / 2) .., rows 16 (q % 2) .. */
        int t0 = 16 * (q / 2), c0 = 16 * (q % 2);
        for (int t = t0; t < t0 + 16 && t < nt; t++)
            for (int c = c0; c < c0 + 16 && c < nr; c++) y[(int64_t)t * ldy + c] = tmp[q][(t - t0) * 16 + c - c0];
    }
}

AMX_KERNEL void gemm_amx_block(const uint16_t *xp, int n, int64_t k, const uint32_t *wv, int rows, float *y,
                               int64_t ldy) {
    amx_tiles_full();
    int64_t kpad = GEMM_AMX_PAD(k), kp2 = kpad / 2, ld = GEMM_AMX_XLD(k), xs = ld * 2;
    for (int t0 = 0; t0 < n; t0 += 32) {
        const uint16_t *a0 = xp + (size_t)t0 * (size_t)ld, *a1 = a0 + 16 * (size_t)ld;
        for (int r0 = 0; r0 < rows; r0 += 32) {
            const uint32_t *b0 = wv + (size_t)(r0 / 16) * (size_t)kp2 * 16, *b1 = b0 + (size_t)kp2 * 16;
            _tile_zero(0);
            _tile_zero(1);
            _tile_zero(2);
            _tile_zero(3);
            for (int64_t kk = 0; kk < kpad; kk += 32) {
                _tile_loadd(4, a0 + kk, xs);
                _tile_loadd(6, b0 + kk / 2 * 16, 64);
                _tile_dpbf16ps(0, 4, 6);
                _tile_loadd(7, b1 + kk / 2 * 16, 64);
                _tile_dpbf16ps(1, 4, 7);
                _tile_loadd(5, a1 + kk, xs);
                _tile_dpbf16ps(2, 5, 6);
                _tile_dpbf16ps(3, 5, 7);
            }
            float *yb = y + (int64_t)t0 * ldy + r0;
            if (n - t0 >= 32 && rows - r0 >= 32) {
                _tile_stored(0, yb, ldy * 4);
                _tile_stored(1, yb + 16, ldy * 4);
                _tile_stored(2, yb + 16 * ldy, ldy * 4);
                _tile_stored(3, yb + 16 * ldy + 16, ldy * 4);
            } else {
                store_part(yb, ldy, n - t0 < 32 ? n - t0 : 32, rows - r0 < 32 ? rows - r0 : 32);
            }
        }
    }
    _tile_release();
}
#else
void amx_tiles(int n, const uint8_t *rows, const uint16_t *colsb) { (void)n; (void)rows; (void)colsb; }
void amx_tiles_full(void) {}
int gemm_amx_available(void) { return 0; }
int gemm_amx_int8_available(void) { return 0; }
void gemm_amx_pack_x(const float *x, int n, int64_t k, uint16_t *xp) { (void)x; (void)n; (void)k; (void)xp; }
void gemm_amx_pack_rows(const float *w, int rows, int64_t k, uint32_t *wv) { (void)w; (void)rows; (void)k; (void)wv; }
void gemm_amx_block(const uint16_t *xp, int n, int64_t k, const uint32_t *wv, int rows, float *y, int64_t ldy) {
    (void)xp; (void)n; (void)k; (void)wv; (void)rows; (void)y; (void)ldy;
}
#endif
