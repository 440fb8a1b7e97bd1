/*
 * ref.c — scalar reference implementations of the backend ops: the
 * definitions the fast CPU and CUDA ops are tested against. Plain loops,
 * double accumulation, no threads; clarity over speed.
 */
#include <math.h>
#include <stdlib.h>
#include "backend/cpu/cpu.h"

void be_ref_matmul(const float *x, int n, const be_mat *w, const be_mat *bias, float *y) {
    for (int t = 0; t < n; t++)
        for (int64_t r = 0; r < w->rows; r++) {
            double s = bias ? be_mat_get(bias, 0, r) : 0.0;
            for (int64_t i = 0; i < w->cols; i++) s += (double)x[(size_t)t * w->cols + i] * be_mat_get(w, r, i);
            y[(size_t)t * w->rows + r] = (float)s;
        }
}

void be_ref_rmsnorm(const float *x, int n, int dim, const be_mat *w, float w_add, float eps, float *y) {
    for (int t = 0; t < n; t++) {
        const float *a = x + (size_t)t * dim;
        double ss = 0;
        for (int i = 0; i < dim; i++) ss += (double)a[i] * a[i];
        double inv = 1.0 / sqrt(ss / dim + eps);
        for (int i = 0; i < dim; i++)
            y[(size_t)t * dim + i] = (float)(a[i] * inv * ((w ? be_mat_get(w, 0, i) : 1.0f) + w_add));
    }
}

void be_ref_rope(float *x, int n, int heads, int hd, int rot, const int *pos, const float *inv_freq, int neox) {
    for (int t = 0; t < n; t++)
        for (int h = 0; h < heads; h++) {
            float *v = x + ((size_t)t * heads + h) * hd;
            for (int i = 0; i < rot / 2; i++) {
                double ang = (double)pos[t] * inv_freq[i];
                int i0 = neox ? i : 2 * i, i1 = neox ? i + rot / 2 : 2 * i + 1;
                double a = v[i0], b = v[i1];
                v[i0] = (float)(a * cos(ang) - b * sin(ang));
                v[i1] = (float)(b * cos(ang) + a * sin(ang));
            }
        }
}

void be_ref_swiglu(const float *gate, const float *up, float *out, size_t n) {
    for (size_t i = 0; i < n; i++) out[i] = (float)(gate[i] / (1.0 + exp(-(double)gate[i])) * up[i]);
}

static double kv_get(const void *p, be_dtype dt, size_t i) {
    return dt == BE_F32 ? ((const float *)p)[i] : be_f16_to_f32(((const uint16_t *)p)[i]);
}

void be_ref_attention(const be_attn *a, const float *q, const void *k, const void *v, be_dtype dt, float *out) {
    int hd = a->head_dim, grp = a->n_head / a->n_kv_head;
    double *s = malloc(sizeof(double) * (size_t)(a->cap > 0 ? a->cap : 1));
    if (!s) return;
    for (int b = 0; b < a->B; b++)
        for (int i = 0; i < a->L; i++)
            for (int h = 0; h < a->n_head; h++) {
                float *o = out + (((size_t)b * a->L + i) * a->n_head + h) * hd;
                if (i >= a->len[b]) {
                    for (int d = 0; d < hd; d++) o[d] = 0;
                    continue;
                }
                int p = a->pos0[b] + i, kh = h / grp;
                const float *qq = q + (((size_t)b * a->L + i) * a->n_head + h) * hd;
                size_t base = ((size_t)b * a->n_kv_head + kh) * a->cap * hd;
                double mx = -INFINITY, sum = 0;
                for (int j = 0; j <= p; j++) {
                    int vis = !a->window || j > p - a->window;
                    s[j] = -INFINITY;
                    if (!vis) continue;
                    double d = 0;
                    for (int e = 0; e < hd; e++) d += qq[e] * kv_get(k, dt, base + (size_t)j * hd + e);
                    s[j] = d * a->scale;
                    if (s[j] > mx) mx = s[j];
                }
                for (int j = 0; j <= p; j++) sum += (s[j] = exp(s[j] - mx));
                for (int d = 0; d < hd; d++) {
                    double acc = 0;
                    for (int j = 0; j <= p; j++) acc += s[j] * kv_get(v, dt, base + (size_t)j * hd + d);
                    o[d] = (float)(acc / sum);
                }
            }
    free(s);
}
