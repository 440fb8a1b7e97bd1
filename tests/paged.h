/*
 * paged.h — random paged KV layouts for the kernel tests (test-backend-ops on
 * every backend, test-ops, test-cpu-kernels): B rows on sequences in shuffled
 * order, and only the pages some query of the batch can see (be_span) held,
 * with ids drawn in shuffled order from a pool 3 pages larger — so a kernel
 * that reads a page outside the mask reads poison or unowned memory.
 */
#ifndef CINFER_TEST_PAGED_H
#define CINFER_TEST_PAGED_H
#include <stdint.h>
#include <stdlib.h>
#include "backend/backend.h"

#define PAGED_BMAX 64   /* rows of a layout at most (two more sequences than rows are numbered) */
typedef struct paged_layout {
    int seq[PAGED_BMAX];  /* row -> sequence */
    int run0[PAGED_BMAX]; /* filled by paged_run0 */
    int n_pages;          /* pool size in pages */
    int32_t *pt, *pt_d;   /* [n_seq][n_pt] host; backend copy (== pt without a backend) */
    const be_ops *be;
    be_ctx *bc;
} paged_layout;

/* xorshift64; a draw in [0, n) */
static inline int paged_rand(uint64_t *s, int n) {
    *s ^= *s << 13; *s ^= *s >> 7; *s ^= *s << 17;
    return (int)((*s >> 33) % (uint64_t)n);
}

/* the window, sinks and each row's run0 as a windowed cache keeps them for a step at pos0 */
static inline void paged_run0(paged_layout *pl, be_attn *a, int window, int keep) {
    a->window = window;
    a->keep = window ? keep : 0;
    for (int b = 0; b < a->B; b++) {
        int r = a->pos0[b] - window + 1 + a->keep;
        pl->run0[b] = !window ? 0 : r > a->keep ? r : a->keep;
    }
    a->run0 = pl->run0;
}

static inline void paged_mark(char *need, int page, int lo, int hi) {   /* pages of positions [lo, hi) */
    for (int j = lo; j < hi; j += page - j % page) need[j / page] = 1;
}

/* fills the paging fields of a (B <= PAGED_BMAX, L, pos0, len, window, keep, run0 set). be NULL: the table
 * stays in host memory (pt_d == pt), for kernels called directly on the CPU */
static inline void paged_new(paged_layout *pl, be_attn *a, int page, uint64_t *rng, const be_ops *be, be_ctx *bc) {
    int B = a->B, n_seq = B + 2, end = 1, perm[PAGED_BMAX + 2];
    for (int s = 0; s < n_seq; s++) perm[s] = s;
    for (int s = n_seq - 1; s > 0; s--) { int r = paged_rand(rng, s + 1), t = perm[s]; perm[s] = perm[r]; perm[r] = t; }
    a->max_span = 1;
    for (int b = 0; b < B; b++) {
        pl->seq[b] = perm[b];
        int e = a->pos0[b] + a->len[b], span = a->window && e > a->window ? a->window : e;
        if (e > end) end = e;
        if (span > a->max_span) a->max_span = span;
    }
    int n_pt = (end + page - 1) / page + 1;
    char *need = calloc((size_t)n_seq * n_pt, 1);
    for (int b = 0; b < B; b++)
        for (int i = 0; i < a->len[b]; i++) {
            int p = a->pos0[b] + i, s_lo, s_hi, r_lo;
            char *row = need + (size_t)pl->seq[b] * n_pt;
            be_span(p, a->window, a->keep, a->run0[b], &s_lo, &s_hi, &r_lo);
            paged_mark(row, page, s_lo, s_hi);
            paged_mark(row, page, r_lo, p + 1);
        }
    int held = 0;
    for (int e = 0; e < n_seq * n_pt; e++) held += need[e];
    pl->n_pages = held + 3;
    int *ids = malloc(sizeof(int) * pl->n_pages);
    for (int e = 0; e < pl->n_pages; e++) ids[e] = e;
    for (int e = pl->n_pages - 1; e > 0; e--) { int r = paged_rand(rng, e + 1), t = ids[e]; ids[e] = ids[r]; ids[r] = t; }
    size_t bytes = sizeof(int32_t) * (size_t)n_seq * n_pt;
    pl->pt = malloc(bytes);
    for (int e = 0, k = 0; e < n_seq * n_pt; e++) pl->pt[e] = need[e] ? ids[k++] : -1;
    pl->be = be;
    pl->bc = bc;
    pl->pt_d = pl->pt;
    if (be) {
        pl->pt_d = be->alloc(bc, bytes);
        be->from_host(bc, pl->pt_d, pl->pt, bytes);
    }
    a->page = page;
    a->n_pt = n_pt;
    a->pt = pl->pt_d;
    a->pt_host = pl->pt;
    a->seq = pl->seq;
    free(ids);
    free(need);
}

/* elements of one pool (K or V) of the layout */
static inline size_t paged_pool_elems(const be_attn *a, const paged_layout *pl) {
    return (size_t)pl->n_pages * a->n_kv_head * a->page * a->head_dim;
}

static inline void paged_free(paged_layout *pl) {
    if (pl->be) pl->be->free(pl->bc, pl->pt_d);
    free(pl->pt);
}
#endif
