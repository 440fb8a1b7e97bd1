/*
 * ref-kvq.c — the scalar references of the quantized KV ops (be_ops.kvq_write,
 * be_ops.kvq_attention; the definitions in backend.h): the CPU backend's
 * kernels and the CUDA ones are tested against these.
 */
#include <stdlib.h>
#include <string.h>
#include "backend/cpu/cpu.h"
#include "quant/affine.h"

/* slot of (kv head h, position j) of row b's sequence in a pool */
static int64_t kvq_slot(const be_attn *a, int b, int h, int j) {
    return be_kv_off(a->pt_host + (size_t)a->seq[b] * a->n_pt, a->page, a->n_kv_head, 1, h, j, 1);
}

/* the codes, scales and biases of one slot */
typedef struct kvq_row {
    uint8_t *codes;
    void *scales, *biases;
} kvq_row;

static kvq_row kvq_at(const be_kvq *p, int hd, int64_t slot) {
    size_t ng = (size_t)(hd / p->group), es = be_dtype_size(p->sdt);
    kvq_row r = {(uint8_t *)p->codes + (size_t)slot * aq_row_bytes(hd, p->bits),
                 (char *)p->scales + (size_t)slot * ng * es, (char *)p->biases + (size_t)slot * ng * es};
    return r;
}

void be_ref_kvq_write(const be_attn *a, const float *src, const be_kvq *p) {
    int hd = a->head_dim;
    for (int b = 0; b < a->B; b++)
        for (int i = 0; i < a->len[b]; i++)
            for (int h = 0; h < a->n_kv_head; h++) {
                kvq_row r = kvq_at(p, hd, kvq_slot(a, b, h, a->pos0[b] + i));
                const float *s = src + (((size_t)b * a->L + i) * a->n_kv_head + h) * hd;
                aq_quantize_row(s, hd, p->bits, p->group, AQ_ROUND_GPU, p->sdt, r.codes, r.scales, r.biases);
            }
}

/* deq[hd] = the values of slot (b, kv head h, position j) */
static void kvq_deq(const be_attn *a, const be_kvq *p, int b, int h, int j, float *deq) {
    kvq_row r = kvq_at(p, a->head_dim, kvq_slot(a, b, h, j));
    aq_dequant_row(r.codes, r.scales, r.biases, p->sdt, p->bits, p->group, 0, a->head_dim, deq);
}

/* query i of row b, head h -> out[hd]; s[max_span], deq[2*hd] scratch */
void be_ref_kvq_query(const be_attn *a, const float *q, const be_kvq *k, const be_kvq *v, int kernel, int b, int i,
                      int h, float *s, float *qs, float *out) {
    int hd = a->head_dim, grp = a->n_head / a->n_kv_head;
    float *o = out, *deq = qs + hd;
    memset(o, 0, sizeof(float) * hd);
    if (i >= a->len[b]) return;
    int p = a->pos0[b] + i, kh = h / grp, r[4], n = 0;
    be_span(p, a->window, a->keep, a->run0[b], &r[0], &r[1], &r[2]);
    r[3] = p + 1;
    const float *qq = q + (((size_t)b * a->L + i) * a->n_head + h) * hd;
    for (int d = 0; d < hd; d++) qs[d] = qq[d] * a->scale;
    for (int g = 0; g < 4; g += 2)
        for (int j = r[g]; j < r[g + 1]; j++, n++) {
            kvq_deq(a, k, b, kh, j, deq);
            float dot = 0;
            for (int d = 0; d < hd; d++) dot += qs[d] * deq[d];
            s[n] = a->softcap > 0 ? be_softcap(dot, a->softcap) : dot;
        }
    if (kernel != BE_KVQ_TILED) {   /* a precise softmax, then p . V */
        float m = -INFINITY, l = 0;
        for (int t = 0; t < n; t++) m = s[t] > m ? s[t] : m;
        for (int t = 0; t < n; t++) l += expf(s[t] - m);
        n = 0;
        for (int g = 0; g < 4; g += 2)
            for (int j = r[g]; j < r[g + 1]; j++, n++) {
                float pj = expf(s[n] - m) / l;
                kvq_deq(a, v, b, kh, j, deq);
                for (int d = 0; d < hd; d++) o[d] += pj * deq[d];
            }
        return;
    }
    /* tiled: a new tile at each range start and at every multiple of BE_KVQ_TILE */
    float m = -INFINITY, l = 0;
    n = 0;
    for (int g = 0; g < 4; g += 2)
        for (int j0 = r[g], j1; j0 < r[g + 1]; j0 = j1) {
            j1 = (j0 / BE_KVQ_TILE + 1) * BE_KVQ_TILE;
            if (j1 > r[g + 1]) j1 = r[g + 1];
            float tm = m, ts = 0;
            for (int t = 0; t < j1 - j0; t++) tm = s[n + t] > tm ? s[n + t] : tm;
            float f = expf(m - tm);   /* 0 for the first tile (m = -inf) */
            for (int d = 0; d < hd; d++) o[d] *= f;
            for (int t = 0; t < j1 - j0; t++) {
                float e = expf(s[n + t] - tm);
                ts += e;
                kvq_deq(a, v, b, kh, j0 + t, deq);
                for (int d = 0; d < hd; d++) o[d] += e * deq[d];
            }
            l = f * l + ts;
            m = tm;
            n += j1 - j0;
        }
    for (int d = 0; d < hd; d++) o[d] /= l;
}

void be_ref_kvq_attention(const be_attn *a, const float *q, const be_kvq *k, const be_kvq *v, int kernel, float *out) {
    int hd = a->head_dim, span = a->max_span > 0 ? a->max_span : 1;
    float *qs = malloc(sizeof(float) * (size_t)hd * 2), *s = malloc(sizeof(float) * (size_t)span);
    if (!qs || !s) { free(qs); free(s); return; }
    for (int b = 0; b < a->B; b++)
        for (int i = 0; i < a->L; i++)
            for (int h = 0; h < a->n_head; h++)
                be_ref_kvq_query(a, q, k, v, kernel, b, i, h, s, qs, out + (((size_t)b * a->L + i) * a->n_head + h) * hd);
    free(qs);
    free(s);
}
