/*
 * score.h — internals shared by the scoring files: a plan that feeds padded
 * rows through the forward in position chunks (the cache carries the
 * earlier chunks) and asks for logits only at the positions scored, and the
 * float32 log-softmax helpers.
 *
 * Invariant: a chunk asks for at most B * W logit rows, W chosen so that
 * buffer stays near SCORE_OUT_BYTES whatever the vocabulary.
 */
#ifndef CINFER_SCORE_H
#define CINFER_SCORE_H
#include "engine/engine.h"

#define SCORE_OUT_BYTES ((size_t)64 << 20)

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
    int n_out;
} score_plan;

/* W from the vocabulary and the batch; cap: the whole row. CINFER_SCORE_CHUNK=N in the
 * environment forces W = N (tests of the multi-chunk path). */
int score_chunk_width(int n_vocab, int B, int cap);
cinfer_status score_plan_init(score_plan *p, const int32_t *ids, int B, int L, const int *n_in, const int *lo, int W);
void score_plan_free(score_plan *p);
/* rows whose sequences already hold positions [0, start[b]) (start[b] <= lo[b]): those are not fed */
void score_plan_skip(score_plan *p, const int *start);
/* advances to the next chunk; 0 when the rows are done */
int score_plan_next(score_plan *p);
/* runs the current chunk (resetting the context at the first); logits [n_out][V] */
cinfer_status score_plan_forward(cinfer_ctx *c, const score_plan *p, float *logits, char *err, size_t en);

/* log(sum(exp(z))) in float32 with a double sum; *argmax = first max (may be NULL) */
float score_lse(const float *z, int V, int *argmax);
#endif
