/*
 * paged.h — random paged KV layouts for the attention/kv_write kernel tests
 * (CPU and CUDA): B rows on sequences in shuffled order, page ids drawn in a
 * shuffled order from a pool larger than needed, and, for windowed layouts,
 * the pages the window has dropped left out of the table (-1) so a kernel
 * that reads one fails under the sanitizer or gives a wrong answer.
 */
#ifndef CINFER_TEST_PAGED_H
#define CINFER_TEST_PAGED_H
#include <stdint.h>
#include <stdlib.h>
#include "backend/backend.h"

typedef struct paged_layout {
    int n_seq, n_pt, n_pages;
    int32_t *pt;      /* [n_seq][n_pt] */
    int seq[16];      /* row -> sequence */
    int run0[16];
} paged_layout;

static uint64_t paged_rng(uint64_t *s) {
    *s ^= *s << 13; *s ^= *s >> 7; *s ^= *s << 17;
    return *s;
}

/* fills the paging and mask fields of a (B, L, pos0, len already set; B <= 16)
 * for pages of `page` slots, window/keep as given. Rows hold positions
 * [0, pos0[b] + L). Returns the pool size in pages. */
static int paged_init(paged_layout *pl, be_attn *a, int page, int window, int keep, uint64_t seed) {
    int B = a->B, need = 0;
    pl->n_seq = B + 2;
    pl->n_pt = 1;
    for (int b = 0; b < B; b++) {
        int np = (a->pos0[b] + a->L + page - 1) / page;
        if (np > pl->n_pt) pl->n_pt = np;
        need += np;
    }
    pl->n_pages = need + 3;
    pl->pt = malloc(sizeof(int32_t) * (size_t)pl->n_seq * pl->n_pt);
    int *ids = malloc(sizeof(int) * (size_t)pl->n_pages);
    for (int i = 0; i < pl->n_pages; i++) ids[i] = i;
    for (int i = pl->n_pages - 1; i > 0; i--) {
        int j = (int)(paged_rng(&seed) % (uint64_t)(i + 1)), t = ids[i];
        ids[i] = ids[j];
        ids[j] = t;
    }
    for (int i = 0; i < pl->n_seq * pl->n_pt; i++) pl->pt[i] = -1;
    int next = 0, max_span = 1;
    for (int b = 0; b < B; b++) {
        pl->seq[b] = (b * 3 + 1) % pl->n_seq;          /* rows name sequences out of order */
        for (int c = 0; c < b; c++)
            if (pl->seq[c] == pl->seq[b]) pl->seq[b] = (pl->seq[b] + 1) % pl->n_seq, c = -1;
        int r = window ? a->pos0[b] - window + 1 + keep : 0;
        pl->run0[b] = window && r > keep ? r : (window ? keep : 0);
        int32_t *row = pl->pt + (size_t)pl->seq[b] * pl->n_pt;
        for (int pi = 0; pi * page < a->pos0[b] + a->L; pi++) {
            int lo = pi * page, hi = lo + page;
            /* pages wholly inside the dropped stretch [keep, run0) are not held */
            if (window && lo >= keep && hi <= pl->run0[b]) continue;
            row[pi] = ids[next++];
        }
        int span = a->pos0[b] + a->len[b];
        if (window && span > window) span = window;
        if (span > max_span) max_span = span;
    }
    free(ids);
    a->page = page;
    a->n_pt = pl->n_pt;
    a->pt = pl->pt;
    a->pt_host = pl->pt;
    a->seq = pl->seq;
    a->window = window;
    a->keep = window ? keep : 0;
    a->run0 = pl->run0;
    a->max_span = max_span;
    return pl->n_pages;
}

static void paged_free(paged_layout *pl) { free(pl->pt); }
#endif
