/*
 * ref.c — scalar reference implementations of the backend ops: the
 * definitions the fast CPU and CUDA ops are tested against. Plain loops,
 * double accumulation, no threads; clarity over speed.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>
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

void be_ref_glu(const float *gate, const float *up, float *out, size_t n, int act) {
    for (size_t i = 0; i < n; i++) {
        double g = gate[i];
        double a = act == BE_ACT_GELU_TANH ? 0.5 * g * (1.0 + tanh(sqrt(2.0 / M_PI) * (g + 0.044715 * g * g * g)))
                                           : g / (1.0 + exp(-g));
        out[i] = (float)(a * up[i]);
    }
}

void be_ref_softcap(float *x, size_t n, float cap) {
    for (size_t i = 0; i < n; i++) x[i] = (float)(cap * tanh((double)x[i] / cap));
}

void be_ref_kv_write(const be_attn *a, const float *src, void *pool, be_dtype dt) {
    int hd = a->head_dim, el = (int)be_dtype_size(dt);
    for (int b = 0; b < a->B; b++)
        for (int i = 0; i < a->len[b]; i++)
            for (int h = 0; h < a->n_kv_head; h++) {
                int64_t off = be_kv_off(a->pt_host + (size_t)a->seq[b] * a->n_pt, a->page, a->n_kv_head, hd, h,
                                        a->pos0[b] + i, el);
                const float *s = src + (((size_t)b * a->L + i) * a->n_kv_head + h) * hd;
                for (int d = 0; d < hd; d++) be_kv_put(pool, dt, (size_t)off / el + d, s[d]);
            }
}

/* the definition: every key of be_span's two ranges, double sums, keys read
 * through the host page table */
void be_ref_attention(const be_attn *a, const float *q, const void *k, const void *v, be_dtype dt, float *out) {
    int hd = a->head_dim, grp = a->n_head / a->n_kv_head, el = (int)be_dtype_size(dt);
    for (int b = 0; b < a->B; b++) {
        const int32_t *pt = a->pt_host + (size_t)a->seq[b] * a->n_pt;
        for (int i = 0; i < a->L; i++)
            for (int h = 0; h < a->n_head; h++) {
                float *o = out + (((size_t)b * a->L + i) * a->n_head + h) * hd;
                for (int d = 0; d < hd; d++) o[d] = 0;
                if (i >= a->len[b]) continue;
                int p = a->pos0[b] + i, kh = h / grp, r[4];
                be_span(p, a->window, a->keep, a->run0[b], &r[0], &r[1], &r[2]);
                r[3] = p + 1;
                const float *qq = q + (((size_t)b * a->L + i) * a->n_head + h) * hd;
                double mx = -INFINITY, sum = 0, acc[hd];
                for (int d = 0; d < hd; d++) acc[d] = 0;
                for (int pass = 0; pass < 2; pass++)      /* 0: max, 1: sums */
                    for (int s = 0; s < 4; s += 2)
                        for (int j = r[s]; j < r[s + 1]; j++) {
                            size_t off = (size_t)be_kv_off(pt, a->page, a->n_kv_head, hd, kh, j, el) / el;
                            double dot = 0;
                            for (int e = 0; e < hd; e++) dot += qq[e] * (double)be_kv_get(k, dt, off + e);
                            dot *= a->scale;
                            if (a->softcap > 0) dot = a->softcap * tanh(dot / a->softcap);
                            if (!pass) { if (dot > mx) mx = dot; continue; }
                            double w = exp(dot - mx);
                            sum += w;
                            for (int d = 0; d < hd; d++) acc[d] += w * be_kv_get(v, dt, off + d);
                        }
                for (int d = 0; d < hd; d++) o[d] = (float)(acc[d] / sum);
            }
    }
}

/* the scoring statistics of one logits row (backend.h, be_score_row): the
 * definition every scoring path uses (perplexity, KL, response log-probs) */
void be_ref_score_row(const float *z, int V, int tgt, const be_score_base *base, int bi, uint16_t *codes,
                      be_score_row *o) {
    int im = 0;
    float mx = z[0], mn = z[0];
    for (int i = 1; i < V; i++) {
        if (z[i] > mx) { mx = z[i]; im = i; }
        if (z[i] < mn) mn = z[i];
    }
    double s = 0;
    for (int i = 0; i < V; i++) s += expf(z[i] - mx);
    float lse = mx + (float)log(s);
    o->lse = lse;
    o->lp = z[tgt] - lse;
    o->argmax = im;
    float top = z[im] - lse, lo = mn - lse;
    if (lo < top - 16) lo = top - 16;
    o->code_min = lo;
    o->code_scale = (top - lo) / 65535.0f;
    o->kld = 0;
    if (base) {
        const float *zb = base->z ? base->z + (size_t)bi * V : NULL;
        float lb_lse = zb ? base->lse[bi] : 0, sc = 0, bmin = 0;
        const uint16_t *q = NULL;
        if (!zb) {
            const unsigned char *r = base->rec + (size_t)bi * base->rec_bytes;
            memcpy(&sc, r, 4);
            memcpy(&bmin, r + 4, 4);
            q = (const uint16_t *)(const void *)(r + 16);
        }
        double kld = 0;
        for (int i = 0; i < V; i++) {
            float lb = zb ? zb[i] - lb_lse : sc * q[i] + bmin;
            if (lb > -16.0f) {
                float lq = z[i] - lse;
                kld += exp((double)lb) * ((double)lb - lq);
            }
        }
        o->kld = kld;
    }
    if (codes) {
        float sc = o->code_scale, inv = sc > 0 ? 1.0f / sc : 0;
        for (int i = 0; i < V; i++) {
            float lp = z[i] - lse;
            long v = sc > 0 && lp > lo ? lroundf(inv * (lp - lo)) : 0;
            codes[i] = (uint16_t)(v < 0 ? 0 : v > 65535 ? 65535 : v);
        }
    }
}

void be_ref_score(const float *z, int n, int V, const int32_t *tgt, const be_score_base *base, uint16_t *codes,
                  size_t code_stride, be_score_row *out) {
    for (int i = 0; i < n; i++)
        be_ref_score_row(z + (size_t)i * V, V, tgt[i], base, base ? base->idx[i] : 0,
                         codes ? codes + (size_t)i * code_stride : NULL, &out[i]);
}
