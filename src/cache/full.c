/*
 * full.c — the plain growing KV cache (mlx-lm's KVCache): per row, keys and
 * values at slots 0..len-1 = positions; storage [B][n_kv][cap][hd] in backend
 * memory, grown in steps of 256 slots by copying into a larger buffer.
 * Writing at pos0 < row length overwrites (and so trims) the row's tail;
 * pos0 beyond the row length would leave a hole and is refused. The mask is
 * causal (optionally within a sliding window): query at position p sees keys
 * at slots <= p of its own row, so right padding never becomes visible.
 */
#include <stdlib.h>
#include <string.h>
#include "cache/cache.h"

#define KV_STEP 256

typedef struct kv_full {
    kv_cache base;
    const be_ops *be;
    be_ctx *bc;
    int n_kv, hd, window;
    be_dtype dt;
    int B, cap;
    int *row_len;      /* [B] */
    void *k, *v;       /* [B][n_kv][cap][hd] */
} kv_full;

static size_t slot_bytes(const kv_full *c) { return (size_t)c->hd * be_dtype_size(c->dt); }

static cinfer_status grow(kv_full *c, int B, int need) {
    if (B != c->B) {
        for (int b = 0; b < c->B; b++)
            if (c->row_len[b]) return CINFER_EINVAL;   /* batch shape changed under live rows */
        c->be->free(c->bc, c->k);
        c->be->free(c->bc, c->v);
        free(c->row_len);
        c->k = c->v = NULL;
        c->cap = 0;
        c->B = B;
        c->row_len = calloc((size_t)B, sizeof *c->row_len);
        if (!c->row_len) { c->B = 0; return CINFER_ENOMEM; }
    }
    if (need <= c->cap) return CINFER_OK;
    int cap = (need + KV_STEP - 1) / KV_STEP * KV_STEP;
    size_t bytes = (size_t)B * c->n_kv * cap * slot_bytes(c);
    void *nk = c->be->alloc(c->bc, bytes), *nv = c->be->alloc(c->bc, bytes);
    if (!nk || !nv) {
        c->be->free(c->bc, nk);
        c->be->free(c->bc, nv);
        return CINFER_ENOMEM;
    }
    if (c->cap) {
        size_t old_row = (size_t)c->cap * slot_bytes(c), new_row = (size_t)cap * slot_bytes(c);
        for (int r = 0; r < B * c->n_kv; r++) {
            c->be->copy(c->bc, (char *)nk + r * new_row, (char *)c->k + r * old_row, old_row);
            c->be->copy(c->bc, (char *)nv + r * new_row, (char *)c->v + r * old_row, old_row);
        }
    }
    c->be->free(c->bc, c->k);
    c->be->free(c->bc, c->v);
    c->k = nk;
    c->v = nv;
    c->cap = cap;
    return CINFER_OK;
}

static cinfer_status full_update_attend(kv_cache *base, const be_attn *a, float *k, const float *v, float *q, float *out) {
    kv_full *c = (kv_full *)base;
    int need = 1;
    for (int b = 0; b < a->B; b++) {
        if (a->pos0[b] < 0 || a->len[b] < 0 || a->len[b] > a->L) return CINFER_EINVAL;
        if (a->pos0[b] + a->len[b] > need) need = a->pos0[b] + a->len[b];
    }
    cinfer_status st = grow(c, a->B, need);
    if (st) return st;
    for (int b = 0; b < a->B; b++)
        if (a->pos0[b] > c->row_len[b]) return CINFER_EINVAL;
    be_attn aa = *a;
    aa.cap = c->cap;
    aa.window = c->window;
    const be_ops *be = c->be;
    int T = a->B * a->L;
    if (a->inv_freq && be->rope_kv_write) {
        be->rope_kv_write(c->bc, &aa, q, k, v, c->k, c->v, c->dt);
    } else {
        if (a->inv_freq) {
            be->rope(c->bc, q, T, a->n_head, a->head_dim, a->rot_dims, a->pos, a->inv_freq, a->neox);
            be->rope(c->bc, k, T, a->n_kv_head, a->head_dim, a->rot_dims, a->pos, a->inv_freq, a->neox);
        }
        be->kv_write(c->bc, &aa, k, c->k, c->dt);
        be->kv_write(c->bc, &aa, v, c->v, c->dt);
    }
    for (int b = 0; b < a->B; b++) c->row_len[b] = a->pos0[b] + a->len[b];
    be->attention(c->bc, &aa, q, c->k, c->v, c->dt, out);
    return CINFER_OK;
}

static int full_row_len(const kv_cache *base, int row) {
    const kv_full *c = (const kv_full *)base;
    return row >= 0 && row < c->B ? c->row_len[row] : 0;
}

static void full_trim(kv_cache *base, int row, int n) {
    kv_full *c = (kv_full *)base;
    for (int b = 0; b < c->B; b++)
        if ((row < 0 || b == row) && c->row_len[b] > n) c->row_len[b] = n < 0 ? 0 : n;
}

static size_t full_bytes(const kv_cache *base) {
    const kv_full *c = (const kv_full *)base;
    return 2 * (size_t)c->B * c->n_kv * c->cap * slot_bytes(c);
}

static void full_free(kv_cache *base) {
    kv_full *c = (kv_full *)base;
    if (!c) return;
    c->be->free(c->bc, c->k);
    c->be->free(c->bc, c->v);
    free(c->row_len);
    free(c);
}

static const kv_vtab full_vt = {"full", full_update_attend, full_row_len, full_trim, full_bytes, full_free};

kv_cache *kv_full_new(const be_ops *be, be_ctx *bc, int n_kv, int hd, be_dtype dt, int window) {
    kv_full *c = calloc(1, sizeof *c);
    if (!c) return NULL;
    c->base.vt = &full_vt;
    c->be = be;
    c->bc = bc;
    c->n_kv = n_kv;
    c->hd = hd;
    c->dt = dt;
    c->window = window;
    return &c->base;
}
