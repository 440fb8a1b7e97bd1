/*
 * score.h — internals shared by the scoring files: a plan that feeds padded
 * rows through the forward in position chunks (the cache carries the
 * earlier chunks) and asks for logits only at the positions scored; the
 * logits stay in the backend, where be_ops.score reduces them (ctx.c,
 * ctx_forward_score): one definition of every per-position statistic on
 * every backend (be_ref_score_row).
 *
 * Invariant: a chunk asks for at most B * W logit rows, all held at once in
 * the context's logits buffer; W is chosen from the backend's free memory
 * (a quarter of it, between SCORE_OUT_BYTES and SCORE_MAX_BYTES for the
 * chunk's logits, activations and base data).
 */
#ifndef CINFER_SCORE_H
#define CINFER_SCORE_H
#include "engine/engine.h"

#define SCORE_OUT_BYTES ((size_t)64 << 20)
#define SCORE_MAX_BYTES ((size_t)4 << 30)

typedef struct score_plan {
    int B, L;             /* rows and their padded width */
    const int32_t *ids;   /* [B][L] */
    const int *n_in;      /* [B] tokens fed per row (positions 0..n_in-1) */
    const int *lo;        /* [B] first position whose logits are wanted */
    const int *start;     /* [B] positions already in each row's sequence (NULL: none; the caller
                           * reset the context and restored them, e.g. from a prefix tier) */
    int W;                /* chunk width in positions */
    int s0;               /* the first chunk's start: the smallest start */
    int s, w, max_n;      /* current chunk [s, s+w); longest row */
    int32_t *ids_c;       /* [B][W] */
    int *lens_c, *pos0;   /* [B] */
    int *pairs;           /* [B*W][2] (row, position within the chunk) */
    int *out_b, *out_p;   /* [B*W] row and absolute position of each output */
    int32_t *tgt;         /* [B*W] the token each output is scored against (the next one) */
    int n_out;
    int materialize;      /* the chunks' logits go through c->lo (ctx_score_req.materialize) */
    int rows_only;        /* the forward stops at the rows (ctx_score_req.rows_only) */
} score_plan;

/* W for B rows from the backend's free memory, given the backend bytes each scored position
 * needs besides its logits row (extra: base logits, records, codes); cap: the whole row.
 * CINFER_SCORE_CHUNK=N in the environment forces W = N (tests of the multi-chunk path).
 * Also grows c's logits buffer to B * W rows. */
cinfer_status score_chunk_width(cinfer_ctx *c, int B, int cap, size_t extra, int *W, char *err, size_t en);
cinfer_status score_plan_init(score_plan *p, const int32_t *ids, int B, int L, const int *n_in, const int *lo, int W);
void score_plan_free(score_plan *p);
/* rows whose sequences already hold positions [0, start[b]) (start[b] <= lo[b]): those are not fed */
void score_plan_skip(score_plan *p, const int *start);
/* advances to the next chunk; 0 when the rows are done */
int score_plan_next(score_plan *p);
/* runs the current chunk (resetting the context at the first), its logits reduced on the
 * backend against p->tgt into out[n_out] (base, codes: ctx_score_req) */
cinfer_status score_plan_forward(cinfer_ctx *c, const score_plan *p, const be_score_base *base, uint16_t *codes,
                                 size_t code_stride, be_score_row *out, char *err, size_t en);
/* out[i] = the f[i] percentile of v[n] (n >= 1; nf <= KL_PCT_MAX) by llama.cpp's rule (linear between
 * the two ranks around f (n - 1) of the values in ascending order); v's contents are used up. Without a
 * sort: a histogram of the values' top 16 bits finds the buckets that hold the wanted ranks, and only
 * their values are gathered and sorted. (Two radix sorts of 262k values were 9% of a GPU kl run.) */
#define KL_PCT_MAX 32
void kl_percentiles(float *v, int64_t n, const double *f, int nf, double *out);
#endif
