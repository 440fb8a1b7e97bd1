/*
 * matmul.c — y[n][m] = x[n][k] . w[m][k]^T (+ bias) on the CPU.
 *
 * Two regimes, both split over output rows across the pool (worker ith owns
 * rows [r0, r1), so no two threads write the same output):
 *   - few tokens (n <= GEMV_MAX_N: decode, short feeds): vectorised GEMV
 *     kernels (gemv.h) read the stored dtype in place; one pass over the
 *     weights per 4 tokens. Bound by memory bandwidth. In batch-invariant
 *     mode every n takes this path: a token's sums are then the same
 *     arithmetic whatever the other tokens (the GEMM path rounds differently).
 *   - many tokens (prefill): each worker converts a block of its weight rows
 *     (up to GEMM_FLOATS, never the whole model) to f32 in its own slice of
 *     the context scratch and calls OpenBLAS sgemm on it single-threaded
 *     (big blocks: sgemm re-packs x on every call, ~8% of the time at 256
 *     rows per call);
 *     f32 weights go to sgemm straight from the mmap. Bound by sgemm FLOP/s.
 *     OpenBLAS is kept at one thread here (openblas_set_num_threads(1)) so
 *     its threads and the pool never oversubscribe the cores; two
 *     independent single-threaded sgemms run as fast as one two-threaded
 *     sgemm (bench/ceilings prints both: ~195 GFLOP/s on the 2-core Zen 4)
 *     and each thread converts its own weight block in between.
 * Activations stay f32 in the GEMV path; results differ from be_ref_matmul
 * only by summation order (tests/test-cpu-kernels.c). The GEMM path has a
 * bf16 mode (bf16_act below): the activations rounded to bf16 and AMX tiles
 * (gemm-amx.c, where the CPU and Linux grant them; every weight type of the
 * mode dequantized into the tiles' layout per block) or AVX-512
 * BF16 dot products (gemm-bf16.c), as llama.cpp does for BF16 models: about
 * twice the FLOP rate of sgemm (on a CPU without them, the rounded
 * activations go through the f32 path: same mode, no speed-up). It is also
 * how mlx-lm computes a bf16 model. MLX affine weights take the same path in
 * that mode: each worker dequantizes a block of its rows and rounds them to
 * bf16 (BF16_BLK rows), then the dot products (emulated: the rounded rows
 * through sgemm). The mode is the default for MLX affine weights on a CPU
 * with AVX-512 BF16 (their own rounding is thousands of times the
 * activations': KL in BENCHMARKS.md), opt-in for bf16 weights, off with
 * prefill_act f32 (cinfer_ctx_opts) or CINFER_BF16_ACT=0.
 */
#include <cblas.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include "backend/cpu/cpu.h"
#include "backend/cpu/gemv.h"

#define GEMV_MAX_N 8     /* up to this many tokens: GEMV kernels */
#define GEMM_FLOATS (4u << 20)   /* f32 weights converted per sgemm call, per thread (16 MiB) */
#define BF16_BLK 96      /* affine weight rows dequantized to bf16 at a time (CINFER_BF16_ACT), per thread */

void cpu_mat_row_f32(const be_mat *w, int64_t r, float *dst) {
    gemv_pick()->rows_f32[w->dt](w, r, r + 1, dst);
}

#define MM_MAX 3     /* matrices in one matmul_multi call */

typedef struct mm_job {
    const float *x;          /* [n][k] */
    int n;
    const be_mat *w, *bias;  /* GEMM path: the one matrix */
    float *y;                /* [n][m] */
    const gemv_kernels *g;
    float *scratch;          /* [nth][blk][k] (GEMM path, f16/bf16 weights) */
    int64_t blk;             /* weight rows per sgemm call */
    /* GEMV path: `count` matrices of the same cols, their rows numbered one
     * after another (matrix i owns rows [end[i-1], end[i])) */
    int count;
    const be_mat *ws[MM_MAX], *bs[MM_MAX];
    float *ys[MM_MAX];
    int64_t end[MM_MAX];
    int64_t chunk;           /* GEMV: rows per claimed chunk */
    int round_w;             /* GEMM path: converted weights rounded to bf16 (CINFER_BF16_ACT, affine) */
    uint16_t *wb;            /* bf16 dot path, affine: [nth][BF16_BLK][k] dequantized rows */
    float *wf;               /* ... and [nth][k] one row in f32 (AMX: [nth][16][k], 16 rows) */
    uint32_t *wv;            /* AMX: [nth][blk][PAD(k)/2] a block of rows in the tiles' pair layout */
    atomic_llong next;       /* GEMV: first row not yet claimed */
} mm_job;

/* rows [*r0, *r1) of m for worker ith of nth, in units of `unit` rows */
static void split_rows(int64_t m, int64_t unit, int ith, int nth, int64_t *r0, int64_t *r1) {
    int64_t nu = (m + unit - 1) / unit;
    int64_t a = nu * ith / nth * unit, b = nu * (ith + 1) / nth * unit;
    *r0 = a < m ? a : m;
    *r1 = b < m ? b : m;
}

static void add_bias(const be_mat *bias, int n, float *y, int64_t m, int64_t r0, int64_t r1) {
    if (!bias) return;
    for (int t = 0; t < n; t++)
        for (int64_t r = r0; r < r1; r++) y[(int64_t)t * m + r] += be_mat_get(bias, 0, r);
}

/* grows the context's scratch to hold need floats; 0 when it cannot (the scratch stays as it was) */
static int scratch_fit(be_ctx *c, size_t need) {
    if (c->scratch_n >= need) return 1;
    float *s = realloc(c->scratch, need * sizeof(float));
    if (!s) return 0;
    c->scratch = s;
    c->scratch_n = need;
    return 1;
}

/* GEMV rows are claimed in chunks from a shared counter rather than split in
 * fixed halves: decode is bound by memory bandwidth, and a thread that is
 * slowed down (an interrupt, another process on its core) would otherwise
 * leave the bandwidth half used while the rest wait for it. A chunk that
 * straddles two matrices is cut at the boundary. */
static void gemv_task(void *arg, int ith, int nth) {
    mm_job *j = arg;
    int64_t total = j->end[j->count - 1];
    (void)ith;
    (void)nth;
    for (;;) {
        int64_t r0 = atomic_fetch_add_explicit(&j->next, j->chunk, memory_order_relaxed);
        if (r0 >= total) return;
        int64_t r1 = r0 + j->chunk < total ? r0 + j->chunk : total;
        for (int i = 0; i < j->count && r0 < r1; i++) {
            int64_t base = i ? j->end[i - 1] : 0;
            if (r0 >= j->end[i]) continue;
            int64_t e = r1 < j->end[i] ? r1 : j->end[i];
            const be_mat *w = j->ws[i];
            j->g->gemv[w->dt](j->x, j->n, w, r0 - base, e - base, j->ys[i], w->rows);
            add_bias(j->bs[i], j->n, j->ys[i], w->rows, r0 - base, e - base);
            r0 = e;
        }
    }
}

static void bf16dot_task(void *arg, int ith, int nth) {
    const mm_job *j = arg;
    int64_t r0, r1;
    split_rows(j->w->rows, 12, ith, nth, &r0, &r1);
    if (r0 >= r1) return;
    gemm_bf16_rows((const uint32_t *)j->scratch, j->n, j->w->cols, j->w->data, j->w->rows, r0, r1, j->y);
    add_bias(j->bias, j->n, j->y, j->w->rows, r0, r1);
}

/* the bf16 dot products on affine weights: blocks of rows dequantized, rounded to bf16, multiplied */
static void bf16dot_affine_task(void *arg, int ith, int nth) {
    const mm_job *j = arg;
    int64_t k = j->w->cols, r0, r1;
    split_rows(j->w->rows, 12, ith, nth, &r0, &r1);
    uint16_t *wb = j->wb + (size_t)ith * BF16_BLK * (size_t)k;
    float *wf = j->wf + (size_t)ith * (size_t)k;
    for (int64_t rb = r0; rb < r1; rb += BF16_BLK) {
        int64_t re = rb + BF16_BLK < r1 ? rb + BF16_BLK : r1;
        for (int64_t r = rb; r < re; r++) {
            j->g->rows_f32[j->w->dt](j->w, r, r + 1, wf);
            gemm_bf16_round(wf, k, wb + (r - rb) * k);
        }
        gemm_bf16_rows((const uint32_t *)j->scratch, j->n, k, wb, j->w->rows, 0, re - rb, j->y + rb);
    }
    if (r0 < r1) add_bias(j->bias, j->n, j->y, j->w->rows, r0, r1);
}

/* the bf16 mode on AMX tiles (gemm-amx.c): each worker converts blocks of its rows, 16 at a time, to f32
 * and into the tiles' bf16 pair layout, then runs every token block over the block */
static void amx_task(void *arg, int ith, int nth) {
    const mm_job *j = arg;
    int64_t k = j->w->cols, kp2 = GEMM_AMX_PAD(k) / 2, r0, r1;
    split_rows(j->w->rows, 32, ith, nth, &r0, &r1);
    uint32_t *wv = j->wv + (size_t)ith * (size_t)(j->blk * kp2);
    float *wf = j->wf + (size_t)ith * 16 * (size_t)k;
    for (int64_t rb = r0; rb < r1; rb += j->blk) {
        int64_t re = rb + j->blk < r1 ? rb + j->blk : r1, tail = (re - rb) & 31;
        for (int64_t g = rb; g < re; g += 16) {
            int rows = re - g < 16 ? (int)(re - g) : 16;
            j->g->rows_f32[j->w->dt](j->w, g, g + rows, wf);
            gemm_amx_pack_rows(wf, rows, k, wv + (size_t)((g - rb) / 16 * kp2 * 16));
        }
        if (tail && tail <= 16)   /* the step's second group of 16 rows lies past the block: zeros */
            memset(wv + (size_t)((re - rb + 15) / 16 * kp2 * 16), 0, (size_t)kp2 * 16 * 4);
        gemm_amx_block((const uint16_t *)j->scratch, j->n, k, wv, (int)(re - rb), j->y + rb, j->w->rows);
    }
    if (r0 < r1) add_bias(j->bias, j->n, j->y, j->w->rows, r0, r1);
}

static void gemm_task(void *arg, int ith, int nth) {
    const mm_job *j = arg;
    int64_t m = j->w->rows, k = j->w->cols, r0, r1;
    split_rows(m, 16, ith, nth, &r0, &r1);
    if (r0 >= r1) return;
    if (j->w->dt == BE_F32) {
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, j->n, (int)(r1 - r0), (int)k, 1.0f,
                    j->x, (int)k, (const float *)j->w->data + r0 * k, (int)k, 0.0f, j->y + r0, (int)m);
    } else {
        float *s = j->scratch + (size_t)ith * (size_t)j->blk * (size_t)k;
        for (int64_t rb = r0; rb < r1; rb += j->blk) {
            int64_t re = rb + j->blk < r1 ? rb + j->blk : r1;
            j->g->rows_f32[j->w->dt](j->w, rb, re, s);
            for (size_t i = 0; j->round_w && i < (size_t)(re - rb) * (size_t)k; i++) s[i] = be_bf16_to_f32(be_f32_to_bf16(s[i]));
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, j->n, (int)(re - rb), (int)k, 1.0f,
                        j->x, (int)k, s, (int)k, 0.0f, j->y + rb, (int)m);
        }
    }
    add_bias(j->bias, j->n, j->y, m, r0, r1);
}

/* the GEMV path over count matrices (same cols and dtype) in one pool run */
static void gemv_multi(be_ctx *c, const float *x, int n, int count, const be_mat *const *w, const be_mat *const *bias,
                       float *const *y) {
    mm_job j = { .x = x, .n = n, .g = gemv_pick(), .count = count };
    int64_t total = 0;
    for (int i = 0; i < count; i++) {
        j.ws[i] = w[i];
        j.bs[i] = bias ? bias[i] : NULL;
        j.ys[i] = y[i];
        j.end[i] = total += w[i]->rows;
    }
    {   /* chunks: ~8 per thread, at least 16 rows (a few KiB of weights) */
        int64_t ch = total / ((int64_t)cpu_pool_size(c->pool) * 8);
        j.chunk = ch < 16 ? 16 : (ch + 3) / 4 * 4;
        atomic_init(&j.next, 0);
    }
    prep_x_fn prep = j.g->prep_x[w[0]->dt];
    if (prep) {   /* the kernel wants x rearranged: a copy in the scratch (n*k floats) */
        if (!scratch_fit(c, (size_t)n * (size_t)w[0]->cols)) j.g = &gemv_scalar_kernels;
        if (j.g->prep_x[w[0]->dt]) { prep(x, n, w[0]->cols, c->scratch); j.x = c->scratch; }
    }
    cpu_pool_run(c->pool, gemv_task, &j);
}

/* the GEMV kernels for few tokens, and for any number in batch-invariant mode */
static int gemv_path(const be_ctx *c, int n) { return n <= GEMV_MAX_N || c->batch_inv; }

void cpu_matmul_multi(be_ctx *c, const float *x, int n, int count, const be_mat *const *w, const be_mat *const *bias,
                      float *const *y) {
    int same = count <= MM_MAX && gemv_path(c, n);
    for (int i = 1; i < count && same; i++) same = w[i]->dt == w[0]->dt && w[i]->cols == w[0]->cols;
    if (same) { gemv_multi(c, x, n, count, w, bias, y); return; }
    for (int i = 0; i < count; i++) cpu_matmul(c, x, n, w[i], bias ? bias[i] : NULL, y[i]);
}

static void matmul_gemm(be_ctx *c, const float *x, int n, const be_mat *w, const be_mat *bias, float *y, int act);

/* the GEMM path's bf16 mode for w: the context's prefill_act; where that is auto, CINFER_BF16_ACT
 * (1: on, 0: off); where that is unset too, on for MLX affine weights when the CPU has the bf16 dot
 * products. Forced on, it applies to bf16 and MLX affine weights (f16/f32 stay f32). */
static int bf16_act(const be_ctx *c, const be_mat *w) {
    int mode = c->prefill_act, aff = be_traits(w->dt)->affine;
    const char *e = mode == BE_ACT_AUTO ? getenv("CINFER_BF16_ACT") : NULL;
    if (e && *e) mode = strcmp(e, "0") ? BE_ACT_BF16 : BE_ACT_F32;
    if (mode == BE_ACT_BF16) return w->dt == BE_BF16 || aff;
    return mode == BE_ACT_AUTO && aff && gemm_bf16_available();
}

void cpu_matmul(be_ctx *c, const float *x, int n, const be_mat *w, const be_mat *bias, float *y) {
    if (gemv_path(c, n)) { gemv_multi(c, x, n, 1, &w, &bias, &y); return; }
    int act = bf16_act(c, w);
    if (act && !gemm_bf16_available()) {
        /* the opt-in without AVX-512 BF16: the same bf16-rounded activations into the f32 path
         * (products of two bf16 values are exact in f32), so the mode means one thing on every CPU */
        size_t len = (size_t)n * (size_t)w->cols;
        float *xr = malloc(len * sizeof(float));
        if (xr) {
            for (size_t i = 0; i < len; i++) xr[i] = be_bf16_to_f32(be_f32_to_bf16(x[i]));
            matmul_gemm(c, xr, n, w, bias, y, act);
            free(xr);
            return;
        }
    }
    matmul_gemm(c, x, n, w, bias, y, act);
}

/* the GEMM paths of cpu_matmul (more tokens than the GEMV takes); act: bf16_act's answer */
static void matmul_gemm(be_ctx *c, const float *x, int n, const be_mat *w, const be_mat *bias, float *y, int act) {
    mm_job j = { .x = x, .n = n, .w = w, .bias = bias, .y = y, .g = gemv_pick() };
    j.round_w = act && w->dt != BE_BF16;   /* (emulated mode: x already rounded by cpu_matmul) */
    if (act && gemm_amx_available()) {
        /* bf16 mode on AMX: x packed once (bf16, padded), blocks of ~1 MiB of rows per worker */
        int nth = cpu_pool_size(c->pool);
        int64_t kpad = GEMM_AMX_PAD(w->cols), blk = (1 << 20) / (kpad * 2) / 32 * 32;
        j.blk = blk < 32 ? 32 : blk > 512 ? 512 : blk;
        size_t xw = (size_t)(GEMM_AMX_PAD(n) * GEMM_AMX_XLD(w->cols) / 2), vw = (size_t)(j.blk * kpad / 2) * (size_t)nth;
        if (scratch_fit(c, xw + vw + (size_t)nth * 16 * (size_t)w->cols)) {
            gemm_amx_pack_x(x, n, w->cols, (uint16_t *)c->scratch);
            j.scratch = c->scratch;
            j.wv = (uint32_t *)(c->scratch + xw);
            j.wf = c->scratch + xw + vw;
            cpu_pool_run(c->pool, amx_task, &j);
            return;
        }
    }
    if (act && gemm_bf16_available()) {
        /* bf16 mode: activations rounded to bf16, AVX-512 BF16 dot products; affine rows dequantized per block */
        int nth = cpu_pool_size(c->pool), aff = w->dt != BE_BF16;
        size_t words = gemm_bf16_xp_words(n, w->cols), xw = words + ((size_t)w->cols + 2) / 2;
        size_t wbw = aff ? ((size_t)nth * BF16_BLK * (size_t)w->cols + 1) / 2 : 0;   /* u16 pairs, in floats */
        if (scratch_fit(c, xw + wbw + (aff ? (size_t)nth * (size_t)w->cols : 0))) {
            gemm_bf16_pack_x(x, n, w->cols, (uint32_t *)c->scratch, (uint16_t *)(c->scratch + words));
            j.scratch = c->scratch;
            j.wb = (uint16_t *)(c->scratch + xw);
            j.wf = c->scratch + xw + wbw;
            cpu_pool_run(c->pool, aff ? bf16dot_affine_task : bf16dot_task, &j);
            return;
        }
    }
    if (w->dt != BE_F32) {
        int nth = cpu_pool_size(c->pool);
        int64_t per = ((w->rows + 15) / 16 + nth - 1) / nth * 16;   /* split_rows' largest share */
        int64_t cap = (int64_t)(GEMM_FLOATS / (size_t)w->cols);
        j.blk = per < cap ? per : cap;
        if (j.blk < 16) j.blk = 16;
        if (!scratch_fit(c, (size_t)nth * (size_t)j.blk * (size_t)w->cols)) {
            gemv_multi(c, x, n, 1, &w, &bias, &y);   /* no room for the GEMM blocks: the GEMV kernels still give the answer */
            return;
        }
        j.scratch = c->scratch;
    }
    if (openblas_get_num_threads() != 1) openblas_set_num_threads(1);
    cpu_pool_run(c->pool, gemm_task, &j);
}
