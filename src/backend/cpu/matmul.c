/*
 * matmul.c — y[n][m] = x[n][k] . w[m][k]^T (+ bias) on the CPU.
 * Few rows (decode): dot products straight from the stored dtype, split over
 * output rows across the pool. Many rows (prefill): convert a block of
 * weight rows to f32 into the context scratch and call OpenBLAS sgemm; only
 * one block is ever converted at a time, never the whole model.
 */
#include <cblas.h>
#include <stdlib.h>
#include <string.h>
#include "backend/cpu/cpu.h"

void cpu_mat_row_f32(const be_mat *w, int64_t r, float *dst) {
    size_t k = (size_t)w->cols, off = (size_t)r * k;
    if (w->dt == BE_F32) {
        memcpy(dst, (const float *)w->data + off, k * sizeof(float));
    } else if (w->dt == BE_BF16) {
        const uint16_t *s = (const uint16_t *)w->data + off;
        for (size_t i = 0; i < k; i++) dst[i] = be_bf16_to_f32(s[i]);
    } else {
        const uint16_t *s = (const uint16_t *)w->data + off;
        for (size_t i = 0; i < k; i++) dst[i] = be_f16_to_f32(s[i]);
    }
}

typedef struct gemv_job {
    const float *x;
    int n;
    const be_mat *w, *bias;
    float *y;
} gemv_job;

static float dot_row(const be_mat *w, int64_t r, const float *x) {
    size_t k = (size_t)w->cols, off = (size_t)r * k;
    float s = 0;
    if (w->dt == BE_F32) {
        const float *a = (const float *)w->data + off;
        for (size_t i = 0; i < k; i++) s += a[i] * x[i];
    } else if (w->dt == BE_BF16) {
        const uint16_t *a = (const uint16_t *)w->data + off;
        for (size_t i = 0; i < k; i++) s += be_bf16_to_f32(a[i]) * x[i];
    } else {
        const uint16_t *a = (const uint16_t *)w->data + off;
        for (size_t i = 0; i < k; i++) s += be_f16_to_f32(a[i]) * x[i];
    }
    return s;
}

static void gemv_task(void *arg, int ith, int nth) {
    gemv_job *j = arg;
    int64_t m = j->w->rows, r0 = m * ith / nth, r1 = m * (ith + 1) / nth;
    for (int t = 0; t < j->n; t++)
        for (int64_t r = r0; r < r1; r++) {
            float s = dot_row(j->w, r, j->x + (size_t)t * j->w->cols);
            if (j->bias) s += be_mat_get(j->bias, 0, r);
            j->y[(size_t)t * m + r] = s;
        }
}

void cpu_matmul(be_ctx *c, const float *x, int n, const be_mat *w, const be_mat *bias, float *y) {
    int64_t m = w->rows, k = w->cols;
    if (n <= 4) {
        gemv_job j = {x, n, w, bias, y};
        cpu_pool_run(c->pool, gemv_task, &j);
        return;
    }
    if (w->dt == BE_F32) {
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, n, (int)m, (int)k, 1.0f, x, (int)k,
                    (const float *)w->data, (int)k, 0.0f, y, (int)m);
    } else {
        int64_t blk = m < 1024 ? m : 1024;
        size_t need = (size_t)blk * (size_t)k;
        if (c->scratch_n < need) {
            float *s = realloc(c->scratch, need * sizeof(float));
            if (!s) {   /* fall back to the row-wise path rather than fail */
                gemv_job j = {x, n, w, bias, y};
                cpu_pool_run(c->pool, gemv_task, &j);
                return;
            }
            c->scratch = s;
            c->scratch_n = need;
        }
        for (int64_t r0 = 0; r0 < m; r0 += blk) {
            int64_t nb = m - r0 < blk ? m - r0 : blk;
            for (int64_t r = 0; r < nb; r++) cpu_mat_row_f32(w, r0 + r, c->scratch + (size_t)r * k);
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, n, (int)nb, (int)k, 1.0f, x, (int)k,
                        c->scratch, (int)k, 0.0f, y + r0, (int)m);
        }
    }
    if (bias)
        for (int t = 0; t < n; t++)
            for (int64_t r = 0; r < m; r++) y[(size_t)t * m + r] += be_mat_get(bias, 0, r);
}
