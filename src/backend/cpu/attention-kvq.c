/*
 * attention-kvq.c — the CPU backend's be_ops.kvq_attention: attention over
 * affine-quantized K/V pools (be_kvq) straight from the codes, never a
 * dequantized copy. The definitions are be_ref_kvq_attention's two kernels
 * (ref-kvq.c); this computes both within float rounding of them:
 *
 * Work unit = (row b, query i, kv head, block of <= 8 of its query heads, key
 * block). The query heads that share a kv head (GQA) are the 8 lanes of one
 * pass over that head's keys, so each code is decoded once for all of them.
 * Keys are visited in tiles (be_span's ranges cut at every multiple of
 * BE_KVQ_TILE, as the tiled definition does), with an online softmax across
 * tiles; the unfused definition's precise softmax differs from that only in
 * rounding. Per key and group of G values (MLX's qmm association):
 *   score = sum_g s_g * sum_{i in g} qs_i c_i + b_g * sum_{i in g} qs_i
 * and, with e_j = exp(score_j - m), the output accumulates
 *   o += sum_j (e_j s_jg) c_j  (per group)  and  ob_g += sum_j e_j b_jg,
 * out = (o + ob) / l. Long contexts with few units (one sequence, few kv
 * heads) split each query's tiles into key blocks whose partial (m, l, o)
 * are merged afterwards, so every thread has work.
 * Codes are decoded 8 at a time by avx2.h's decoder, specialized for 4 and 8
 * bits, generic for 2, 3, 5, 6. Without AVX2 (or CINFER_ISA=scalar) the
 * reference runs, one query head per task over the pool.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include "backend/cpu/cpu.h"
#include "backend/cpu/gemv.h"
#include "quant/affine.h"

#define HB 8   /* query heads per pass: the lanes of a vector */

typedef struct kvq_job {
    const be_attn *a;
    const float *q;
    const be_kvq *k, *v;
    int kernel;
    float *out;
    int grp, nhb, nblk;   /* query heads per kv head; head blocks of HB; key blocks per query */
    size_t units;         /* B * L * n_kv * nhb * nblk */
    float *ws;            /* [nth][ws_per] */
    size_t ws_per;
    float *part;          /* [units][2 HB + HB hd]: m, l, o of each key block (nblk > 1) */
} kvq_job;

/* the reference, one query head per task (no AVX2) */
static void ref_task(void *arg, int ith, int nth) {
    const kvq_job *j = arg;
    const be_attn *a = j->a;
    int hd = a->head_dim, span = a->max_span > 0 ? a->max_span : 1;
    float *s = j->ws + (size_t)ith * j->ws_per;
    size_t total = (size_t)a->B * a->L * a->n_head, w0 = total * ith / nth, w1 = total * (ith + 1) / nth;
    for (size_t w = w0; w < w1; w++)
        be_ref_kvq_query(a, j->q, j->k, j->v, j->kernel, (int)(w / a->n_head / a->L), (int)(w / a->n_head % a->L),
                         (int)(w % a->n_head), s, s + span, j->out + w * hd);
}

static int n_tiles(int lo, int hi) { return lo < hi ? (hi - 1) / BE_KVQ_TILE - lo / BE_KVQ_TILE + 1 : 0; }

/* merges the key blocks' partials of every (row, query, kv head, head block) into out */
static void merge(const kvq_job *j) {
    const be_attn *a = j->a;
    int hd = a->head_dim, nb = j->nblk;
    size_t ps = 2 * HB + (size_t)HB * hd, groups = j->units / (size_t)nb;
    for (size_t u = 0; u < groups; u++) {
        int hb = (int)(u % j->nhb), kh = (int)(u / j->nhb % a->n_kv_head);
        size_t bi = u / j->nhb / a->n_kv_head;   /* b * L + i */
        int nh = j->grp - hb * HB < HB ? j->grp - hb * HB : HB;
        const float *p = j->part + u * nb * ps;
        for (int t = 0; t < nh; t++) {
            float *o = j->out + (bi * a->n_head + (size_t)kh * j->grp + (size_t)hb * HB + t) * hd;
            float m = -INFINITY, l = 0;
            for (int k = 0; k < nb; k++) m = p[k * ps + t] > m ? p[k * ps + t] : m;
            memset(o, 0, sizeof(float) * hd);
            if (m == -INFINITY) continue;   /* a padded query */
            for (int k = 0; k < nb; k++) {
                const float *pk = p + k * ps;
                float f = expf(pk[t] - m);
                l += f * pk[HB + t];
                for (int d = 0; d < hd; d++) o[d] += f * pk[2 * HB + t * hd + d];
            }
            for (int d = 0; d < hd; d++) o[d] /= l;
        }
    }
}

#ifdef GEMV_X86
#include <immintrin.h>
#include "backend/cpu/avx2.h"

/* exp of 8 lanes (Cephes' expf: range reduction by ln 2 in two parts, degree-5 polynomial; about
 * 1 ulp); x < -88.38 (and -inf) gives 0 */
INL __m256 exp8(__m256 x) {
    __m256 ok = _mm256_cmp_ps(x, _mm256_set1_ps(-88.3762626647949f), _CMP_GE_OQ);
    x = _mm256_min_ps(_mm256_max_ps(x, _mm256_set1_ps(-88.3762626647949f)), _mm256_set1_ps(88.3762626647949f));
    __m256 fx = _mm256_floor_ps(_mm256_fmadd_ps(x, _mm256_set1_ps(1.44269504088896341f), _mm256_set1_ps(0.5f)));
    x = _mm256_fnmadd_ps(fx, _mm256_set1_ps(0.693359375f), x);
    x = _mm256_fnmadd_ps(fx, _mm256_set1_ps(-2.12194440e-4f), x);
    __m256 y = _mm256_set1_ps(1.9875691500e-4f);
    y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(1.3981999507e-3f));
    y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(8.3334519073e-3f));
    y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(4.1665795894e-2f));
    y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(1.6666665459e-1f));
    y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(5.0000001201e-1f));
    y = _mm256_fmadd_ps(y, _mm256_mul_ps(x, x), _mm256_add_ps(x, _mm256_set1_ps(1.0f)));
    __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvttps_epi32(fx), _mm256_set1_epi32(127)), 23);
    return _mm256_and_ps(_mm256_mul_ps(y, _mm256_castsi256_ps(e)), ok);
}

/* lane h = the sum of the lanes of p[h] */
INL __m256 reduce8(const __m256 *p) {
    __m256 t0 = _mm256_hadd_ps(p[0], p[1]), t1 = _mm256_hadd_ps(p[2], p[3]);
    __m256 t2 = _mm256_hadd_ps(p[4], p[5]), t3 = _mm256_hadd_ps(p[6], p[7]);
    __m256 u0 = _mm256_hadd_ps(t0, t1), u1 = _mm256_hadd_ps(t2, t3);
    return _mm256_add_ps(_mm256_permute2f128_ps(u0, u1, 0x20), _mm256_permute2f128_ps(u0, u1, 0x31));
}

/* what one unit reads: its queries (scaled, zero for pad heads) and the pools */
typedef struct unit_in {
    const float *qs;    /* [HB][hd] */
    const float *sq;    /* [ng][HB] group sums of qs */
    int hd, ng, G;
    const be_kvq *k, *v;
    size_t rb;          /* bytes of one row of codes */
} unit_in;

/* S[jj][HB] = the scores of keys slot[0..n) for the NH heads (pad lanes 0) */
INL void tile_scores(const unit_in *x, const dec8 *dc, const int64_t *slot, int n, float *S, const int bits,
                     const int NH) {
    const uint8_t *codes = x->k->codes;
    for (int jj = 0; jj < n; jj++) {
        const uint8_t *row = codes + (size_t)slot[jj] * x->rb, *end = row + x->rb;
        int64_t si = slot[jj] * x->ng;
        __m256 sv = _mm256_setzero_ps();
        for (int g = 0; g < x->ng; g++) {
            __m256 P[HB];
            _Pragma("GCC unroll 8") for (int h = 0; h < HB; h++) P[h] = _mm256_setzero_ps();
            for (int c = g * x->G / 8; c < (g + 1) * x->G / 8; c++) {
                __m256 cv = dec(dc, row + (size_t)c * bits, bits, end);
                _Pragma("GCC unroll 8") for (int h = 0; h < NH; h++)
                    P[h] = _mm256_fmadd_ps(_mm256_loadu_ps(x->qs + (size_t)h * x->hd + c * 8), cv, P[h]);
            }
            __m256 b = _mm256_mul_ps(_mm256_set1_ps(ld_sb(x->k->biases, x->k->sdt, si + g)), _mm256_loadu_ps(x->sq + g * HB));
            sv = _mm256_add_ps(sv, _mm256_fmadd_ps(_mm256_set1_ps(ld_sb(x->k->scales, x->k->sdt, si + g)), reduce8(P), b));
        }
        _mm256_storeu_ps(S + (size_t)jj * HB, sv);
    }
}

/* o[h][hd] += sum_jj E[jj][h] s_jg c_j, ob[g][h] += sum_jj E[jj][h] b_jg; W[n][HB] scratch */
INL void tile_pv(const unit_in *x, const dec8 *dc, const int64_t *slot, int n, const float *E, float *W, float *o,
                 float *ob, const int bits, const int NH) {
    const uint8_t *codes = x->v->codes;
    for (int g = 0; g < x->ng; g++) {
        __m256 obv = _mm256_loadu_ps(ob + g * HB);
        for (int jj = 0; jj < n; jj++) {
            int64_t si = slot[jj] * x->ng + g;
            __m256 e = _mm256_loadu_ps(E + (size_t)jj * HB);
            _mm256_storeu_ps(W + (size_t)jj * HB, _mm256_mul_ps(e, _mm256_set1_ps(ld_sb(x->v->scales, x->v->sdt, si))));
            obv = _mm256_fmadd_ps(e, _mm256_set1_ps(ld_sb(x->v->biases, x->v->sdt, si)), obv);
        }
        _mm256_storeu_ps(ob + g * HB, obv);
        for (int c = g * x->G / 8; c < (g + 1) * x->G / 8; c++) {
            __m256 acc[HB];
            _Pragma("GCC unroll 8") for (int h = 0; h < NH; h++) acc[h] = _mm256_loadu_ps(o + (size_t)h * x->hd + c * 8);
            for (int jj = 0; jj < n; jj++) {
                const uint8_t *row = codes + (size_t)slot[jj] * x->rb;
                __m256 cv = dec(dc, row + (size_t)c * bits, bits, row + x->rb);
                _Pragma("GCC unroll 8") for (int h = 0; h < NH; h++)
                    acc[h] = _mm256_fmadd_ps(_mm256_broadcast_ss(W + (size_t)jj * HB + h), cv, acc[h]);
            }
            _Pragma("GCC unroll 8") for (int h = 0; h < NH; h++) _mm256_storeu_ps(o + (size_t)h * x->hd + c * 8, acc[h]);
        }
    }
}

/* one tile: scores, the online-softmax update of m, l, o, ob (vectors over the HB lanes), p.V */
INL void tile_run(const unit_in *x, const dec8 *dc, const int64_t *slot, int n, float softcap, float *S, float *W,
                  float *o, float *ob, __m256 *m, __m256 *l, const int bits, const int NH) {
    tile_scores(x, dc, slot, n, S, bits, NH);
    if (softcap > 0)
        for (int t = 0; t < n * HB; t++) S[t] = be_softcap(S[t], softcap);
    __m256 tm = *m, sum = _mm256_setzero_ps();
    for (int jj = 0; jj < n; jj++) tm = _mm256_max_ps(tm, _mm256_loadu_ps(S + (size_t)jj * HB));
    __m256 f = exp8(_mm256_sub_ps(*m, tm));   /* 0 on the first tile (m = -inf) */
    float fs[HB];
    _mm256_storeu_ps(fs, f);
    _Pragma("GCC unroll 8") for (int h = 0; h < NH; h++) {
        __m256 fh = _mm256_set1_ps(fs[h]);
        for (int d = 0; d < x->hd; d += 8)
            _mm256_storeu_ps(o + (size_t)h * x->hd + d, _mm256_mul_ps(fh, _mm256_loadu_ps(o + (size_t)h * x->hd + d)));
    }
    for (int g = 0; g < x->ng; g++) _mm256_storeu_ps(ob + g * HB, _mm256_mul_ps(f, _mm256_loadu_ps(ob + g * HB)));
    for (int jj = 0; jj < n; jj++) {
        __m256 e = exp8(_mm256_sub_ps(_mm256_loadu_ps(S + (size_t)jj * HB), tm));
        _mm256_storeu_ps(S + (size_t)jj * HB, e);
        sum = _mm256_add_ps(sum, e);
    }
    *l = _mm256_fmadd_ps(*l, f, sum);
    *m = tm;
    tile_pv(x, dc, slot, n, S, W, o, ob, bits, NH);
}

/* slot[j - j0] = be_kv_off's slot of keys j0..j1-1, a page at a time (page is a power of two) */
static void fill_slots(const be_attn *a, const int32_t *pt, int kh, int j0, int j1, int64_t *slot) {
    int sh = __builtin_ctz((unsigned)a->page);
    for (int j = j0; j < j1;) {
        int pg = j >> sh, e = (pg + 1) << sh;
        int64_t base = ((int64_t)pt[pg] * a->n_kv_head + kh) << sh;
        for (e = e < j1 ? e : j1; j < e; j++) slot[j - j0] = base + (j & (a->page - 1));
    }
}

/* the kernel for (bits, NH) as a function: the tiles [t0, t1) of one query's ranges r[4] */
#define TILES_FN(name, BITS, NHC)                                                                                 \
    static __attribute__((target(TGT), noinline)) void name(const unit_in *x, const be_attn *a, const int32_t *pt,  \
        int kh, const int *r, int t0, int t1, float *S, float *W, int64_t *slot, float *o, float *ob, __m256 *m,  \
        __m256 *l, int bits_rt) {                                                                                \
        const int bits = BITS ? BITS : bits_rt;                                                                  \
        dec8 dc = dec_init(bits);                                                                                \
        for (int g = 0, t = 0; g < 4 && t < t1; g += 2)                                                          \
            for (int j0 = r[g], j1; j0 < r[g + 1] && t < t1; j0 = j1, t++) {                                     \
                j1 = (j0 / BE_KVQ_TILE + 1) * BE_KVQ_TILE;                                                       \
                if (j1 > r[g + 1]) j1 = r[g + 1];                                                                \
                if (t < t0) continue;                                                                            \
                fill_slots(a, pt, kh, j0, j1, slot);                                                           \
                tile_run(x, &dc, slot, j1 - j0, a->softcap, S, W, o, ob, m, l, bits, NHC);                       \
            }                                                                                                    \
    }
TILES_FN(tiles_q4_h8, 4, 8)
TILES_FN(tiles_q4_h4, 4, 4)
TILES_FN(tiles_q4_h1, 4, 1)
TILES_FN(tiles_q8_h8, 8, 8)
TILES_FN(tiles_q8_h4, 8, 4)
TILES_FN(tiles_q8_h1, 8, 1)
TILES_FN(tiles_qn_h8, 0, 8)
TILES_FN(tiles_qn_h4, 0, 4)
TILES_FN(tiles_qn_h1, 0, 1)

typedef void (*tiles_fn)(const unit_in *, const be_attn *, const int32_t *, int, const int *, int, int, float *,
                         float *, int64_t *, float *, float *, __m256 *, __m256 *, int);

static __attribute__((target(TGT))) void unit_task(void *arg, int ith, int nth) {
    const kvq_job *j = arg;
    const be_attn *a = j->a;
    int hd = a->head_dim, G = j->k->group, ng = hd / G, bits = j->k->bits;
    float *qs = j->ws + (size_t)ith * j->ws_per, *sq = qs + HB * hd, *o = sq + ng * HB, *ob = o + HB * hd;
    float *S = ob + ng * HB, *W = S + BE_KVQ_TILE * HB;
    int64_t *slot = (int64_t *)(W + BE_KVQ_TILE * HB);
    unit_in x = {qs, sq, hd, ng, G, j->k, j->v, aq_row_bytes(hd, bits)};
    size_t u0 = j->units * ith / nth, u1 = j->units * (ith + 1) / nth;
    for (size_t u = u0; u < u1; u++) {
        int blk = (int)(u % j->nblk), hb = (int)(u / j->nblk % j->nhb);
        int kh = (int)(u / j->nblk / j->nhb % a->n_kv_head);
        size_t bi = u / j->nblk / j->nhb / a->n_kv_head;
        int b = (int)(bi / a->L), i = (int)(bi % a->L), nh = j->grp - hb * HB < HB ? j->grp - hb * HB : HB;
        int h0 = kh * j->grp + hb * HB;
        float *po = j->nblk > 1 ? j->part + u * (2 * HB + (size_t)HB * hd) : NULL;
        if (i >= a->len[b]) {   /* a padded query: zeros (merge: m = -inf) */
            if (po) { for (int t = 0; t < HB; t++) po[t] = -INFINITY; }
            else memset(j->out + (bi * a->n_head + h0) * hd, 0, sizeof(float) * hd * nh);
            continue;
        }
        int p = a->pos0[b] + i, r[4];
        be_span(p, a->window, a->keep, a->run0[b], &r[0], &r[1], &r[2]);
        r[3] = p + 1;
        int nt = n_tiles(r[0], r[1]) + n_tiles(r[2], r[3]);
        int t0 = (int)((int64_t)nt * blk / j->nblk), t1 = (int)((int64_t)nt * (blk + 1) / j->nblk);
        memset(qs, 0, sizeof(float) * HB * hd);
        memset(sq, 0, sizeof(float) * ng * HB);
        for (int t = 0; t < nh; t++) {
            const float *qq = j->q + (bi * a->n_head + h0 + t) * hd;
            for (int d = 0; d < hd; d++) {
                qs[t * hd + d] = qq[d] * a->scale;
                sq[d / G * HB + t] += qs[t * hd + d];
            }
        }
        memset(o, 0, sizeof(float) * HB * hd);
        memset(ob, 0, sizeof(float) * ng * HB);
        __m256 m = _mm256_set1_ps(-INFINITY), l = _mm256_setzero_ps();
        int NH = nh > 4 ? 8 : nh > 1 ? 4 : 1, bk = bits == 4 ? 0 : bits == 8 ? 1 : 2;
        static const tiles_fn fns[3][3] = {{tiles_q4_h1, tiles_q4_h4, tiles_q4_h8},
                                           {tiles_q8_h1, tiles_q8_h4, tiles_q8_h8},
                                           {tiles_qn_h1, tiles_qn_h4, tiles_qn_h8}};
        if (t0 < t1)
            fns[bk][NH == 1 ? 0 : NH == 4 ? 1 : 2](&x, a, a->pt_host + (size_t)a->seq[b] * a->n_pt, kh, r, t0, t1, S, W,
                                                   slot, o, ob, &m, &l, bits);
        float ms[HB], ls[HB];
        _mm256_storeu_ps(ms, m);
        _mm256_storeu_ps(ls, l);
        for (int t = 0; t < nh; t++)   /* fold the bias sums in: o = sum e (s c + b) */
            for (int d = 0; d < hd; d++) o[t * hd + d] += ob[d / G * HB + t];
        if (po) {
            memcpy(po, ms, sizeof ms);
            memcpy(po + HB, ls, sizeof ls);
            memcpy(po + 2 * HB, o, sizeof(float) * HB * hd);
        } else {
            for (int t = 0; t < nh; t++) {
                float *out = j->out + (bi * a->n_head + h0 + t) * hd, inv = 1.0f / ls[t];
                for (int d = 0; d < hd; d++) out[d] = o[t * hd + d] * inv;
            }
        }
    }
}
#endif

void cpu_kvq_attention(be_ctx *c, const be_attn *a, const float *q, const be_kvq *k, const be_kvq *v, int kernel,
                       float *out) {
    int hd = a->head_dim, span = a->max_span > 0 ? a->max_span : 1, nth = c->n_threads;
    kvq_job j = {a, q, k, v, kernel, out, a->n_head / a->n_kv_head, 0, 1, 0, NULL, 0, NULL};
    j.nhb = (j.grp + HB - 1) / HB;
    double work = (double)a->B * a->L * a->n_head * hd * span;
    int fast = 0;
#ifdef GEMV_X86
    fast = strcmp(gemv_pick()->isa, "scalar") != 0 && hd % 8 == 0 && k->group == v->group && k->bits == v->bits &&
           k->sdt == v->sdt;
#endif
    size_t need;
    if (fast) {
        size_t base = (size_t)a->B * a->L * a->n_kv_head * j.nhb;
        int max_tiles = span / BE_KVQ_TILE + 2;
        if (work >= 65536.0 && base < 2 * (size_t)nth && !c->batch_inv) {   /* few units: split the keys too */
            j.nblk = (int)((2 * (size_t)nth + base - 1) / base);
            if (j.nblk > max_tiles) j.nblk = max_tiles;
        }
        j.units = base * j.nblk;
        int ng = hd / k->group;
        j.ws_per = (2 * (size_t)HB * hd + 2 * (size_t)ng * HB + 2 * (size_t)BE_KVQ_TILE * HB + 2 * BE_KVQ_TILE + 15) / 16 * 16;
        need = (size_t)nth * j.ws_per + (j.nblk > 1 ? j.units * (2 * HB + (size_t)HB * hd) : 0);
    } else {
        j.ws_per = ((size_t)span + 2 * hd + 15) / 16 * 16;
        need = (size_t)nth * j.ws_per;
    }
    if (c->att_n < need) {
        float *p = realloc(c->att, need * sizeof(float));
        if (!p) { be_ref_kvq_attention(a, q, k, v, kernel, out); return; }
        c->att = p;
        c->att_n = need;
    }
    j.ws = c->att;
    j.part = c->att + (size_t)nth * j.ws_per;
    cpu_task_fn fn = ref_task;
#ifdef GEMV_X86
    if (fast) fn = unit_task;
#endif
    if (work < 65536.0) fn(&j, 0, 1);
    else cpu_pool_run(c->pool, fn, &j);
    if (fast && j.nblk > 1) merge(&j);
}
