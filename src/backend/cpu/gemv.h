/*
 * gemv.h — the CPU matrix-vector kernels (gemv-avx512.c, gemv-avx2.c,
 * gemv-scalar.c) that cpu_matmul (matmul.c) uses for few tokens, and the row
 * converters its GEMM path uses.
 *
 * A kernel computes, for the weight rows r in [r0, r1) and tokens t < n:
 *     y[t*ldy + r] = sum_i x[t*k + i] * w[r][i]          (no bias, k = w->cols)
 * reading w (row-major [rows][k], stored dtype) in place and accumulating in
 * f32. Affine-quantized types (gemv-affine.c) accumulate per group,
 * scale * sum(x*q) + bias * sum(x), as MLX's quantized_matmul. Any n >= 1 and any k >= 1 work (tails are masked or scalar); kernels
 * are fastest for n <= 4 (one pass over the weights per 4 tokens, while the
 * row block stays in L1). x rows are contiguous (stride k).
 *
 * The AVX-512 / AVX2 versions are compiled with function-level target
 * attributes so the build works on any x86-64; gemv_pick() chooses at run time
 * with __builtin_cpu_supports. Non-x86 builds get only the scalar versions.
 */
#ifndef CINFER_GEMV_H
#define CINFER_GEMV_H
#include <stdint.h>
#include "backend/backend.h"

typedef void (*gemv_fn)(const float *x, int n, const be_mat *w, int64_t r0, int64_t r1, float *y, int64_t ldy);
/* converts rows [r0, r1) of w[.][k] to f32 dst[(r1-r0)][k] */
typedef void (*rows_f32_fn)(const be_mat *w, int64_t r0, int64_t r1, float *dst);

/* rearranges x[n][k] into xp[n][k] in the order a kernel wants it */
typedef void (*prep_x_fn)(const float *x, int n, int64_t k, float *xp);

/* Decode kernels read s rows at a time (4; 2 for pairs of tokens) as s long sequential streams: rows
 * [r0, r1) cut into s parts walked side by side, rows r, r + h, .., r + (s-1) h for r in [r0, r0 + h),
 * then the rows from r0 + s h one by one. Adjacent rows interleaved read about half as fast on the 2-core
 * Zen 4 VM (their streams are cut every 4 KiB page, where the hardware prefetchers stop); h is odd
 * because streams a power of two of bytes apart alias (gemv-avx512.c measured both). Returns h (0 when
 * fewer than s rows). */
static inline int64_t gemv_streams(int64_t r0, int64_t r1, int s) {
    int64_t h = (r1 - r0) / s;
    return h - (h > 1 && !(h & 1));
}

typedef struct gemv_kernels {
    const char *isa;          /* "avx512", "avx2", "scalar" */
    gemv_fn gemv[BE_N_DTYPES];          /* indexed by be_dtype */
    rows_f32_fn rows_f32[BE_N_DTYPES];
    /* NULL: gemv[dt] takes x as is; else gemv[dt] must be given prep_x[dt]'s
     * rearranged copy of x in place of x (same size, n*k floats) */
    prep_x_fn prep_x[BE_N_DTYPES];
} gemv_kernels;

/* best kernels this CPU runs (CINFER_ISA=scalar|avx2|avx512|avx512vnni caps the choice; CINFER_INT8_ACT=1
 * swaps in gemv-affine-i8.c's int8-activation kernels for 4- and 8-bit affine weights) */
const gemv_kernels *gemv_pick(void);
/* 1 when CINFER_ISA caps the kernels below isa ("amx" > "avx512vnni" > "avx512" > "avx2" > "scalar";
 * unset or empty: no cap; a name not in that list caps everything) */
int cpu_isa_capped(const char *isa);
/* one specific set, NULL if this CPU (or build) lacks it: for tests */
const gemv_kernels *gemv_isa(const char *isa);

extern const gemv_kernels gemv_scalar_kernels;
/* the avx512 set with gemv-affine-vnni.c's 4-bit decode kernel (exact integer products on a 24-bit
 * fixed-point x); NULL where the CPU lacks AVX-512 VNNI */
const gemv_kernels *gemv_avx512_vnni(void);
/* base with the int8-activation kernels for BE_Q4 / BE_Q8 (gemv-affine-i8.c); base itself when it has none */
const gemv_kernels *gemv_int8_act(const gemv_kernels *base);

/* gemv-affine.c: the affine-quantized kernels (one per bit width), which the
 * sets' tables list through these initializers */
#define AFFINE_DECL(b, isa)                                                                        \
    void gemv_q##b##_##isa(const float *x, int n, const be_mat *w, int64_t r0, int64_t r1, float *y, int64_t ldy); \
    void rows_q##b##_##isa(const be_mat *w, int64_t r0, int64_t r1, float *dst);
#define AFFINE_DECLS(isa) AFFINE_DECL(2, isa) AFFINE_DECL(3, isa) AFFINE_DECL(4, isa) AFFINE_DECL(5, isa) \
    AFFINE_DECL(6, isa) AFFINE_DECL(8, isa)
#define AFFINE_ENTRIES(pre, isa) [BE_Q2] = pre##_q2_##isa, [BE_Q3] = pre##_q3_##isa, [BE_Q4] = pre##_q4_##isa, \
    [BE_Q5] = pre##_q5_##isa, [BE_Q6] = pre##_q6_##isa, [BE_Q8] = pre##_q8_##isa
AFFINE_DECLS(scalar)

/* gemm-bf16.c: prefill matmul for bf16 weights with AVX-512 BF16 dot
 * products on bf16-rounded activations (opt-in: CINFER_BF16_ACT=1).
 * xp holds gemm_bf16_xp_words(n, k) u32; tmp holds k+1 u16. */
int gemm_bf16_available(void);
size_t gemm_bf16_xp_words(int n, int64_t k);
void gemm_bf16_pack_x(const float *x, int n, int64_t k, uint32_t *xp, uint16_t *tmp);
/* dst[i] = bf16(src[i]) (round to nearest even); AVX-512 where gemm_bf16_available */
void gemm_bf16_round(const float *src, int64_t k, uint16_t *dst);
void gemm_bf16_rows(const uint32_t *xp, int n, int64_t k, const uint16_t *w, int64_t m, int64_t r0,
                    int64_t r1, float *y);

/* gemm-amx.c: the same bf16 mode on AMX tiles (TDPBF16PS), where the CPU and the OS grant them
 * (CINFER_ISA set to anything but "amx" turns them off). Sizes are padded to GEMM_AMX_PAD:
 * xp holds GEMM_AMX_PAD(n) * GEMM_AMX_XLD(k) u16, wv GEMM_AMX_PAD(rows) * GEMM_AMX_PAD(k) / 2 u32.
 * gemm_amx_pack_rows packs f32 rows w[rows][k] (rounded to bf16); gemm_amx_block writes
 * y[t * ldy + r] for t < n, r < rows. */
#define GEMM_AMX_PAD(v) (((int64_t)(v) + 31) / 32 * 32)
#define GEMM_AMX_XLD(k) (GEMM_AMX_PAD(k) + 32)   /* xp's row stride: rows a power of two apart share cache sets */
int gemm_amx_available(void);
int gemm_amx_int8_available(void);   /* ... with AMX-INT8 (tile products of bytes) */
/* the calling thread's tiles 0..n-1 (n <= 8) as rows[i] x colsb[i] bytes (palette 1); _tile_release ends them */
void amx_tiles(int n, const uint8_t *rows, const uint16_t *colsb);
void amx_tiles_full(void);   /* all eight tiles 16 rows x 64 bytes */
void gemm_amx_pack_x(const float *x, int n, int64_t k, uint16_t *xp);
void gemm_amx_pack_rows(const float *w, int rows, int64_t k, uint32_t *wv);
void gemm_amx_block(const uint16_t *xp, int n, int64_t k, const uint32_t *wv, int rows, float *y, int64_t ldy);

/* attention-avx512.c: attention-gemm.c's products for blocks of up to 4 queries (rows), f32:
 * s[r][c] = scale * q[r] . kt[.][c] for c < cols; o[r] = sum_{c < cols} s[r][c] v[c] (+ o[r] when add).
 * pf (or NULL): the next segment's values (att_pv_avx512) or keys (att_transpose_avx512), laid out as v or src,
 * prefetched into L2 line by line as this segment's are read */
int att_avx512_available(void);
/* s[i] = exp(s[i] - mx) for i < n (glibc's libmvec expf on 16 lanes); returns their sum */
float att_exp_avx512(float *s, int n, float mx);
/* max(mx, s[0..n)); s[i] *= f for i < n */
float att_max_avx512(const float *s, int n, float mx);
void att_scale_avx512(float *s, int n, float f);
void att_qk_avx512(const float *q, int ldq, int rows, const float *kt, int ldk, int cols, int hd, float scale,
                   float *s, int lds);
void att_pv_avx512(const float *s, int lds, int rows, int cols, const float *v, int hd, float *o, int ldo, int add,
                   const float *pf);
/* dst[d][t] = src[t][d] for t < n, d < hd, dst's rows ldd apart (keys [n][hd] into kt[hd][ldd]) */
void att_transpose_avx512(const float *src, int n, int hd, float *dst, size_t ldd, const float *pf);
/* dst[i] = src[i] for i < n, src f16 (bf16 = 0) or bf16 (1) */
void att_widen_avx512(const void *src, int bf16, size_t n, float *dst, const void *pf);
/* one query's scores as st[key][8] (att_amx_scores): its softmax per head over [a0, a1) and [b0, b1), zeros
 * elsewhere; o[r] = sum_{c < cols} st[c][h0 + r] v[c] (+ o[r] when add) for r < rows (<= 4), v's rows f32, bf16
 * or f16 (vdt: 16-bit pages read in place) */
void att_softmax_t_avx512(float *st, int T, int a0, int a1, int b0, int b1, float cap);
void att_pv_t_avx512(const float *st, int h0, int rows, int cols, const void *v, be_dtype vdt, int hd, float *o, int ldo,
                     int add, const void *pf);

/* attention-amx.c: one query's scores on AMX bf16 tiles, st[t][h] = scale q[h] . k[t] for a kv head's group of
 * grp <= 8 heads (lanes past grp: 0), keys f32 (split exactly into three bf16 parts), f16 (two) or bf16 rows; pf (or NULL):
 * rows laid out as k (the next segment's), prefetched into L2 as k's are read. att_amx_takes says when
 * (gemm_amx_available, grp <= 8, hd a multiple of 32 up to ATT_AMX_HD); ws: att_amx_ws_bytes(hd) bytes; begin
 * configures the tiles and splits the queries, end releases the tiles. */
#define ATT_AMX_HD 256
int att_amx_takes(int grp, int hd);
size_t att_amx_ws_bytes(int hd);
void att_amx_begin(const float *q, int grp, int hd, void *ws);
void att_amx_scores(void *ws, const void *k, be_dtype kdt, int n, int hd, float scale, float *st, const void *pf);
void att_amx_end(void);
/* many queries (prefill): the item's keys (f32 rows, a segment [col, col + n) at a time, col 0 first) packed as B
 * tiles into kb (att_amx_kt_bytes), then S[r][c] = scale q[r] . k[c] for blocks of up to 16 queries, keys c <
 * c_end in whole blocks of 16 (at most T), the same three-part products; ws as above */
size_t att_amx_kt_bytes(int T, int hd);
void att_amx_pack_kt(const float *k, int n, int hd, int col, int T, void *kb);
void att_amx_qk(const float *q, int ldq, int rows, const void *kb, int T, int c_end, int hd, float scale, float *S, int lds,
                void *ws);
/* the item's values packed likewise (att_amx_vt_bytes), then o[r] = sum_{c < c_end} P[r][c] v[c] for up to 16 rows
 * (written; P's columns from c_end on read as 0), P and v in three parts each */
size_t att_amx_vt_bytes(int T, int hd);
void att_amx_pack_v(const float *v, int n, int hd, int col, int T, void *vb);
void att_amx_pv(const float *P, int lds, int rows, int c_end, const void *vb, int T, int hd, float *o, int ldo, void *ws);

/* attention-gemm.c: be_ops.attention through sgemm (same contract; any B, L,
 * GQA, window, f32/f16 cache). Returns non-zero, having done nothing, when
 * its workspace cannot be allocated. */
struct be_ctx;
int cpu_attention_gemm(struct be_ctx *c, const be_attn *a, const float *q, const void *k,
                       const void *v, be_dtype kv_dt, float *out);
#if defined(__x86_64__) || defined(__i386__)
extern const gemv_kernels gemv_avx2_kernels;
extern const gemv_kernels gemv_avx512_kernels;
AFFINE_DECLS(avx2)
/* gemv-affine-avx512.c: the avx512 set's affine decode kernels (its row conversion is AVX2's) */
#define AFFINE_GEMV_DECL(b, isa) void gemv_q##b##_##isa(const float *x, int n, const be_mat *w, int64_t r0, int64_t r1, float *y, int64_t ldy);
AFFINE_GEMV_DECL(2, avx512) AFFINE_GEMV_DECL(3, avx512) AFFINE_GEMV_DECL(4, avx512) AFFINE_GEMV_DECL(5, avx512)
AFFINE_GEMV_DECL(6, avx512) AFFINE_GEMV_DECL(8, avx512)
#define GEMV_X86 1
#endif
#endif
