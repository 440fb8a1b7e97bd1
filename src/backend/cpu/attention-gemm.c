/*
 * attention-gemm.c — attention over the paged KV cache through OpenBLAS
 * sgemm: the CPU attention op's fast path (same contract as be_ops.attention,
 * checked against be_ref_attention in tests/test-cpu-kernels.c).
 *
 * Work is split over the pool by (row b, kv head, block of <= ATT_QB
 * queries). For one item the keys any of its queries may see are the union
 * of be_span's ranges over its queries: sinks [s_lo of the first query,
 * s_hi of the last) and the run [r_lo of the first query, last position].
 * They are laid out as the columns of S, split into segments that each lie
 * in one page; then, for each query head of the group:
 *     S[M][T] = scale * Q[M][hd] . K_seg[n][hd]^T     (sgemm per segment)
 *     per row: softmax over its own be_span columns, 0 elsewhere
 *     O[M][hd] = sum over segments S[:, seg] . V_seg   (sgemm, into out)
 * With one query per row (decode) the group's query heads are adjacent in
 * q and share their mask, so they go as one [grp][hd] matrix. The masked
 * part of S is computed and discarded: sgemm at ~100 GFLOP/s per core wins
 * over exact scalar loops by far. f16/bf16 pages are widened to f32 into
 * the thread's workspace first, segment by segment.
 *
 * On a CPU with AVX-512, attention-avx512.c's products replace sgemm:
 * many queries (prefill) in blocks of 4 queries that stop at their own last
 * visible key (many_queries), one query (decode) with the group's heads as
 * the rows, a page's keys transposed at a time (one_query; OpenBLAS falls
 * back to SSE3 on a CPU model it does not know, see attention-avx512.c).
 * Where the CPU grants AMX tiles and a kv head has at most 8 query heads,
 * one query's scores go to bf16 tile products instead (attention-amx.c: the
 * keys as tile rows, f32 ones split exactly into three bf16 parts), laid out
 * [key][8 heads] for the softmax and p.V that follow (one_query_amx); many
 * queries' scores and p.V likewise, 16 queries against the item's keys and
 * values packed once as tiles (many_queries with j->amx_pf; a row's softmax
 * then runs to the end of its block of 16).
 *
 * Workspace: the context's attention buffer (c->att), grown on first use to
 * n_threads x (ATT_QB*T + 3*T*hd) floats + the segment list (+ the AMX
 * scratch; with many queries on tiles also the packed keys and values, about
 * 12*T*hd bytes), T <= max_span + ATT_QB + keep. Like
 * cpu_matmul, it keeps OpenBLAS single-threaded: the pool runs the threads.
 * Padded queries (i >= len[b]) get zeros.
 */
#include <cblas.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include "backend/cpu/cpu.h"
#include "backend/cpu/gemv.h"

#define ATT_QB 128   /* queries per work item */

typedef struct ag_job {
    const be_attn *a;
    const float *q;          /* [B][L][n_head][hd] */
    const void *k, *v;       /* pools [n_pages][n_kv][page][hd] */
    be_dtype dt;
    float *out;              /* [B][L][n_head][hd] */
    float *ws;               /* [nth][ws_per] */
    size_t ws_per;
    int tmax;                /* most keys of any item */
    int nqb;                 /* query blocks per row */
    int vec;                 /* attention-avx512.c's kernels (att_avx512_available) */
    int amx;                 /* one query's scores on AMX tiles (att_amx_takes) */
    int amx_pf;              /* many queries' scores on AMX tiles */
    size_t amx_f;            /* their scratch (and the packed keys), floats at the end of each thread's ws */
} ag_job;

/* softmax of s[0..T) over the columns [a0, a1) and [b0, b1), zero elsewhere;
 * scores softcapped first when cap > 0. vec: AVX-512 over the ranges (the
 * exponentials by libmvec's expf, 16 at a time: att_exp_avx512) */
static void masked_softmax(float *s, int T, int a0, int a1, int b0, int b1, float cap, int vec) {
    float mx = -INFINITY, sum = 0;
    if (cap > 0) for (int t = 0; t < T; t++) s[t] = be_softcap(s[t], cap);
    if (vec && a1 <= b0 && b0 <= b1) {   /* both ranges in order (an empty run may start past its end): exponentials, zeros around */
        if (a1 > a0) mx = att_max_avx512(s + a0, a1 - a0, mx);
        mx = att_max_avx512(s + b0, b1 - b0, mx);
        memset(s, 0, sizeof(float) * (size_t)(a0 < T ? a0 : T));
        sum = a1 > a0 ? att_exp_avx512(s + a0, a1 - a0, mx) : 0.0f;
        if (b0 > a1) memset(s + a1, 0, sizeof(float) * (size_t)(b0 - a1));
        sum += b1 > b0 ? att_exp_avx512(s + b0, b1 - b0, mx) : 0.0f;
        if (T > b1) memset(s + b1, 0, sizeof(float) * (size_t)(T - b1));
        att_scale_avx512(s + a0, b1 - a0, 1.0f / sum);   /* (the zeros outside stay zeros) */
        return;
    }
    for (int t = a0; t < a1; t++) if (s[t] > mx) mx = s[t];
    for (int t = b0; t < b1; t++) if (s[t] > mx) mx = s[t];
    for (int t = 0; t < T; t++) {
        int in = (t >= a0 && t < a1) || (t >= b0 && t < b1);
        s[t] = in ? expf(s[t] - mx) : 0.0f;
        sum += s[t];
    }
    float inv = 1.0f / sum;
    for (int t = 0; t < T; t++) s[t] *= inv;
}

typedef struct seg {
    int col, n;
    const float *k, *v;   /* f32 rows: the pool's, or 16-bit pages widened (NULL: not widened, see off) */
    size_t off;           /* the segment's first element in the pools */
} seg;

/* the item's key columns as segments inside one page each; 16-bit pages are
 * widened into kf/vf at their column, unless kf is NULL (one_query widens a
 * segment at a time). Returns the number of segments. */
static int segments(const ag_job *j, const int32_t *pt, int kh, const int rng[4], float *kf, float *vf, seg *sg) {
    const be_attn *a = j->a;
    int hd = a->head_dim, el = (int)be_dtype_size(j->dt), ns = 0, col = 0;
    for (int g = 0; g < 4; g += 2)
        for (int t = rng[g]; t < rng[g + 1];) {
            int n = a->page - t % a->page;
            if (n > rng[g + 1] - t) n = rng[g + 1] - t;
            size_t off = (size_t)be_kv_off(pt, a->page, a->n_kv_head, hd, kh, t, el) / el;
            seg s = {col, n, (const float *)j->k + off, (const float *)j->v + off, off};
            if (j->dt != BE_F32 && !kf) {
                s.k = s.v = NULL;
            } else if (j->dt != BE_F32) {
                if (j->vec) {
                    att_widen_avx512((const uint16_t *)j->k + off, j->dt == BE_BF16, (size_t)n * hd, kf + (size_t)col * hd, NULL);
                    att_widen_avx512((const uint16_t *)j->v + off, j->dt == BE_BF16, (size_t)n * hd, vf + (size_t)col * hd, NULL);
                } else {
                    for (size_t e = 0; e < (size_t)n * hd; e++) {
                        kf[(size_t)col * hd + e] = be_kv_get(j->k, j->dt, off + e);
                        vf[(size_t)col * hd + e] = be_kv_get(j->v, j->dt, off + e);
                    }
                }
                s.k = kf + (size_t)col * hd;
                s.v = vf + (size_t)col * hd;
            }
            sg[ns++] = s;
            col += n;
            t += n;
        }
    return ns;
}

/* many queries on AVX-512 (attention-avx512.c): the item's keys transposed into kt[hd][T] and its values
 * gathered into vf[T][hd] once; then per query head, blocks of 4 queries, each up to the last key any of
 * its queries sees (blk_end), in runs of ATT_CH keys so that a run of kt and of vf stays in cache while
 * every block of the item passes over it */
#define ATT_CH 256
static int blk_end(const be_attn *a, int b, int i0, int r0, int M, int rng2, int n1, int T) {
    int nr = M - r0 < 4 ? M - r0 : 4, e = n1 + a->pos0[b] + i0 + r0 + nr - rng2;
    return e < T ? e : T;
}

static void many_queries(const ag_job *j, int b, int kh, int i0, int M, const int rng[4], int n1, int T, const seg *sg,
                         int ns, float *S, float *kt, float *vf, void *aw) {
    const be_attn *a = j->a;
    int hd = a->head_dim, grp = a->n_head / a->n_kv_head;
    size_t ld = (size_t)a->n_head * hd;
    /* (j->amx_pf) the keys and the values as B tiles */
    void *kb = (char *)aw + (att_amx_ws_bytes(hd) + 63) / 64 * 64, *vb = (char *)kb + att_amx_kt_bytes(T, hd);
    for (int e = 0; e < ns; e++) {
        if (j->amx_pf) {
            att_amx_pack_kt(sg[e].k, sg[e].n, hd, sg[e].col, T, kb);
            att_amx_pack_v(sg[e].v, sg[e].n, hd, sg[e].col, T, vb);
            continue;
        }
        att_transpose_avx512(sg[e].k, sg[e].n, hd, kt + sg[e].col, (size_t)T, NULL);
        if (sg[e].v != vf + (size_t)sg[e].col * hd)
            memcpy(vf + (size_t)sg[e].col * hd, sg[e].v, sizeof(float) * (size_t)sg[e].n * hd);
    }
    const int qb = j->amx_pf ? 16 : 4;   /* a row's scores run to its block's last key: blocks of 16 (tiles) or 4 */
    for (int g = 0; g < grp; g++) {
        const float *Q = j->q + ((size_t)b * a->L + i0) * ld + (size_t)(kh * grp + g) * hd;
        float *O = j->out + ((size_t)b * a->L + i0) * ld + (size_t)(kh * grp + g) * hd;
        for (int r0 = 0; j->amx_pf && r0 < M; r0 += 16) {   /* 16 queries a tile, up to their last 4-block's end */
            int r1 = M - r0 < 16 ? M : r0 + 16;
            att_amx_qk(Q + (size_t)r0 * ld, (int)ld, r1 - r0, kb, T, blk_end(a, b, i0, (r1 - 1) / 4 * 4, M, rng[2], n1, T), hd,
                       a->scale, S + (size_t)r0 * T, T, aw);
        }
        for (int c0 = 0; !j->amx_pf && c0 < T; c0 += ATT_CH)
            for (int r0 = 0; r0 < M; r0 += 4) {
                int cb = blk_end(a, b, i0, r0, M, rng[2], n1, T), n = cb - c0 < ATT_CH ? cb - c0 : ATT_CH;
                if (n > 0)
                    att_qk_avx512(Q + (size_t)r0 * ld, (int)ld, M - r0 < 4 ? M - r0 : 4, kt + c0, T, n, hd, a->scale,
                                  S + (size_t)r0 * T + c0, T);
            }
        for (int r = 0; r < M; r++) {
            int p = a->pos0[b] + i0 + r, sp[3];
            be_span(p, a->window, a->keep, a->run0[b], &sp[0], &sp[1], &sp[2]);
            int c0 = sp[0] - rng[0], c1 = sp[1] - rng[0];
            if (c1 < c0) c1 = c0;
            int r1 = M - r / qb * qb < qb ? M : r / qb * qb + qb;
            masked_softmax(S + (size_t)r * T, blk_end(a, b, i0, (r1 - 1) / 4 * 4, M, rng[2], n1, T), c0, c1,
                           n1 + sp[2] - rng[2], n1 + p + 1 - rng[2], a->softcap, 1);
        }
        for (int r0 = 0; j->amx_pf && r0 < M; r0 += 16) {
            int r1 = M - r0 < 16 ? M : r0 + 16;
            att_amx_pv(S + (size_t)r0 * T, T, r1 - r0, blk_end(a, b, i0, (r1 - 1) / 4 * 4, M, rng[2], n1, T), vb, T, hd,
                       O + (size_t)r0 * ld, (int)ld, aw);
        }
        for (int c0 = 0; !j->amx_pf && c0 < T; c0 += ATT_CH)
            for (int r0 = 0; r0 < M; r0 += 4) {
                int cb = blk_end(a, b, i0, r0, M, rng[2], n1, T), n = cb - c0 < ATT_CH ? cb - c0 : ATT_CH;
                if (n > 0)
                    att_pv_avx512(S + (size_t)r0 * T + c0, T, M - r0 < 4 ? M - r0 : 4, n, vf + (size_t)c0 * hd, hd,
                                  O + (size_t)r0 * ld, (int)ld, c0 > 0, NULL);
            }
    }
}

/* segment e + 1's keys or values in the pool (f32 or 16-bit) when it is as long as segment e: prefetched
 * while segment e's are read */
static const void *next_raw(const ag_job *j, const seg *sg, int e, int ns, int v) {
    if (e + 1 >= ns || sg[e + 1].n < sg[e].n) return NULL;
    return (const char *)(v ? j->v : j->k) + sg[e + 1].off * be_dtype_size(j->dt);
}
/* the same for f32 pools only (read in place; 16-bit ones prefetch as they are widened) */
static const float *next_seg(const ag_job *j, const seg *sg, int e, int ns, int v) {
    return j->dt == BE_F32 ? (const float *)next_raw(j, sg, e, ns, v) : NULL;
}
/* segment e's keys (v = 0) or values (1) as f32 rows: the pool's, or 16-bit pages widened into wk (the next
 * segment's prefetched meanwhile) */
static const float *seg_rows(const ag_job *j, const seg *sg, int e, int ns, int v, float *wk) {
    const float *r = v ? sg[e].v : sg[e].k;
    if (r) return r;
    att_widen_avx512((const uint16_t *)(v ? j->v : j->k) + sg[e].off, j->dt == BE_BF16, (size_t)sg[e].n * j->a->head_dim, wk,
                     next_raw(j, sg, e, ns, v));
    return wk;
}

/* one query with its scores on AMX tiles (attention-amx.c; j->amx): st[T][8], the keys as tile rows (bf16 pages
 * read in place, f16 ones widened a segment at a time into wk), the softmax per head across a key's lanes, p.V as
 * one_query's with the scores read 8 apart */
static void one_query_amx(const ag_job *j, int b, int p, const int rng[4], int n1, int T, const seg *sg, int ns,
                          const float *Q, float *O, float *st, void *aw) {
    const be_attn *a = j->a;
    int hd = a->head_dim, grp = a->n_head / a->n_kv_head, sp[3];
    att_amx_begin(Q, grp, hd, aw);
    for (int e = 0; e < ns; e++)   /* the pages' rows in place, whatever their dtype */
        att_amx_scores(aw, (const char *)j->k + sg[e].off * be_dtype_size(j->dt), j->dt, sg[e].n, hd, a->scale,
                       st + 8 * (size_t)sg[e].col, next_raw(j, sg, e, ns, 0));
    att_amx_end();
    be_span(p, a->window, a->keep, a->run0[b], &sp[0], &sp[1], &sp[2]);
    int c0 = sp[0] - rng[0], c1 = sp[1] - rng[0];
    att_softmax_t_avx512(st, T, c0, c1 < c0 ? c0 : c1, n1 + sp[2] - rng[2], n1 + p + 1 - rng[2], a->softcap);
    for (int e = 0; e < ns; e++) {
        const void *v = (const char *)j->v + sg[e].off * be_dtype_size(j->dt);
        for (int r0 = 0; r0 < grp; r0 += 4)
            att_pv_t_avx512(st + 8 * (size_t)sg[e].col, r0, grp - r0 < 4 ? grp - r0 : 4, sg[e].n, v, j->dt, hd,
                            O + (size_t)r0 * hd, hd, e > 0, r0 ? NULL : next_raw(j, sg, e, ns, 1));
    }
}

/* one query on AVX-512 (decode): the kv head's grp query heads are the rows, all with the query's mask; each
 * segment's keys transposed into kt[hd][n] (in cache: a segment lies in one page), then the same products as
 * many_queries, 4 heads at a time. f32 pages are read in place, the next segment's prefetched while one is read;
 * 16-bit pages are widened a segment at a time into wk (keys, then values: n x hd floats, in cache). */
static void one_query(const ag_job *j, int b, int kh, int i0, const int rng[4], int n1, int T, const seg *sg, int ns,
                      float *S, float *kt, float *wk, void *aw) {
    const be_attn *a = j->a;
    int hd = a->head_dim, grp = a->n_head / a->n_kv_head, p = a->pos0[b] + i0, sp[3];
    size_t at = ((size_t)b * a->L + i0) * a->n_head * hd + (size_t)kh * grp * hd;
    const float *Q = j->q + at;
    float *O = j->out + at;
    if (j->amx) {
        one_query_amx(j, b, p, rng, n1, T, sg, ns, Q, O, S, aw);
        return;
    }
    for (int e = 0; e < ns; e++) {
        int n = sg[e].n;
        att_transpose_avx512(seg_rows(j, sg, e, ns, 0, wk), n, hd, kt, (size_t)n, next_seg(j, sg, e, ns, 0));
        for (int r0 = 0; r0 < grp; r0 += 4)
            att_qk_avx512(Q + (size_t)r0 * hd, hd, grp - r0 < 4 ? grp - r0 : 4, kt, n, n, hd, a->scale,
                          S + (size_t)r0 * T + sg[e].col, T);
    }
    be_span(p, a->window, a->keep, a->run0[b], &sp[0], &sp[1], &sp[2]);
    int c0 = sp[0] - rng[0], c1 = sp[1] - rng[0];
    if (c1 < c0) c1 = c0;
    for (int r = 0; r < grp; r++)
        masked_softmax(S + (size_t)r * T, T, c0, c1, n1 + sp[2] - rng[2], n1 + p + 1 - rng[2], a->softcap, 1);
    for (int e = 0; e < ns; e++) {
        const float *v = seg_rows(j, sg, e, ns, 1, wk);
        for (int r0 = 0; r0 < grp; r0 += 4)
            att_pv_avx512(S + (size_t)r0 * T + sg[e].col, T, grp - r0 < 4 ? grp - r0 : 4, sg[e].n, v, hd,
                          O + (size_t)r0 * hd, hd, e > 0, r0 ? NULL : next_seg(j, sg, e, ns, 1));
    }
}

static void item(const ag_job *j, int b, int kh, int qb, float *ws) {
    const be_attn *a = j->a;
    int hd = a->head_dim, grp = a->n_head / a->n_kv_head, nh = a->n_head;
    int i0 = qb * ATT_QB, i1 = i0 + ATT_QB < a->L ? i0 + ATT_QB : a->L;
    int live = a->len[b] < i1 ? a->len[b] : i1;     /* queries [i0, live) are real */
    size_t ld = (size_t)nh * hd;
    for (int i = live > i0 ? live : i0; i < i1; i++)   /* padding: zeros */
        memset(j->out + ((size_t)b * a->L + i) * ld + (size_t)kh * grp * hd, 0, sizeof(float) * grp * hd);
    if (live <= i0) return;
    int p0 = a->pos0[b] + i0, p1 = a->pos0[b] + live - 1, f[3], l[3];
    be_span(p0, a->window, a->keep, a->run0[b], &f[0], &f[1], &f[2]);
    be_span(p1, a->window, a->keep, a->run0[b], &l[0], &l[1], &l[2]);
    int rng[4] = {f[0], l[1], f[2], p1 + 1};
    if (rng[1] < rng[0]) rng[1] = rng[0];
    if (rng[2] > rng[3]) rng[2] = rng[3];   /* every query still among the sinks (p < keep): no run */
    int n1 = rng[1] - rng[0], T = n1 + rng[3] - rng[2];
    float *S = ws, *kf = ws + (size_t)ATT_QB * j->tmax, *vf = kf + (size_t)j->tmax * hd;
    seg *sg = (seg *)(vf + 2 * (size_t)j->tmax * hd);   /* (after vf: kt, many_queries' transposed keys) */
    const int32_t *pt = a->pt_host + (size_t)a->seq[b] * a->n_pt;
    int M = live - i0, vec = j->vec;
    int ns = segments(j, pt, kh, rng, M == 1 && vec ? NULL : kf, vf, sg);   /* one_query widens as it goes */
    if (M > 1 && vec) {
        many_queries(j, b, kh, i0, M, rng, n1, T, sg, ns, S, vf + (size_t)j->tmax * hd, vf, ws + j->ws_per - j->amx_f);
        return;
    }
    if (vec) {
        one_query(j, b, kh, i0, rng, n1, T, sg, ns, S, vf + (size_t)j->tmax * hd, kf, ws + j->ws_per - j->amx_f);
        return;
    }
    /* one query per row: the group's heads are adjacent rows of q with one mask */
    int rows = M == 1 ? grp : M, heads = M == 1 ? 1 : grp;
    int lda = M == 1 ? hd : (int)ld;
    for (int g = 0; g < heads; g++) {
        const float *Q = j->q + ((size_t)b * a->L + i0) * ld + (size_t)(kh * grp + g) * hd;
        float *O = j->out + ((size_t)b * a->L + i0) * ld + (size_t)(kh * grp + g) * hd;
        for (int e = 0; e < ns; e++)
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, rows, sg[e].n, hd, a->scale, Q, lda, sg[e].k, hd,
                        0.0f, S + sg[e].col, T);
        for (int r = 0; r < rows; r++) {
            int p = a->pos0[b] + i0 + (M == 1 ? 0 : r), s[3];
            be_span(p, a->window, a->keep, a->run0[b], &s[0], &s[1], &s[2]);
            int c0 = s[0] - rng[0], c1 = s[1] - rng[0];
            if (c1 < c0) c1 = c0;
            masked_softmax(S + (size_t)r * T, T, c0, c1, n1 + s[2] - rng[2], n1 + p + 1 - rng[2], a->softcap, vec);
        }
        for (int e = 0; e < ns; e++)
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, rows, hd, sg[e].n, 1.0f, S + sg[e].col, T,
                        sg[e].v, hd, e ? 1.0f : 0.0f, O, lda);
    }
}

static void ag_task(void *arg, int ith, int nth) {
    const ag_job *j = arg;
    const be_attn *a = j->a;
    int n_items = a->B * a->n_kv_head * j->nqb;
    float *ws = j->ws + (size_t)ith * j->ws_per;
    /* interleaved: the costly late query blocks spread over the threads */
    for (int w = ith; w < n_items; w += nth) {
        int qb = w % j->nqb, kh = w / j->nqb % a->n_kv_head, b = w / j->nqb / a->n_kv_head;
        item(j, b, kh, qb, ws);
    }
}

int cpu_attention_gemm(be_ctx *c, const be_attn *a, const float *q, const void *k, const void *v,
                       be_dtype kv_dt, float *out) {
    /* an item's keys: at most max_span for its first query plus one per later query */
    int tmax = (a->max_span > 0 ? a->max_span : 1) + (a->L < ATT_QB ? a->L : ATT_QB) + a->keep;
    int nth = cpu_pool_size(c->pool);
    size_t segs = (size_t)(tmax / a->page + a->keep + 8) * sizeof(seg) / sizeof(float) + 1;
    int amx = att_avx512_available() && a->L == 1 && att_amx_takes(a->n_head / a->n_kv_head, a->head_dim);
    int amx_pf = att_avx512_available() && a->L > 1 && att_amx_takes(1, a->head_dim);
    size_t amx_f = amx || amx_pf ? (att_amx_ws_bytes(a->head_dim) + 64 + (amx_pf ? att_amx_kt_bytes(tmax, a->head_dim) + att_amx_vt_bytes(tmax, a->head_dim) : 0) + 3) / 4
                                 : 0;
    size_t per = (size_t)ATT_QB * tmax + 3 * (size_t)tmax * a->head_dim + segs + amx_f;
    per = (per + 15) & ~(size_t)15;
    if (c->att_n < per * nth) {
        float *p = realloc(c->att, per * nth * sizeof(float));
        if (!p) return 1;
        c->att = p;
        c->att_n = per * nth;
    }
    ag_job j = { a, q, k, v, kv_dt, out, c->att, per, tmax, (a->L + ATT_QB - 1) / ATT_QB, att_avx512_available(), amx, amx_pf, amx_f };
    if (openblas_get_num_threads() != 1) openblas_set_num_threads(1);
    cpu_pool_run(c->pool, ag_task, &j);
    return 0;
}
