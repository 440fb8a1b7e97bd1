/*
 * dense.c — the dense page format: keys and values stored as f32, f16 or
 * bf16 in two pools [cap][n_kv][page][hd] of backend memory, indexed by the
 * group's page ids. The group decides which pages a step writes and what
 * each query sees (be_attn); this file applies RoPE, writes and attends —
 * through the fused rope_kv_write op where the backend has it.
 */
#include <stdlib.h>
#include <string.h>
#include "cache/cache.h"

typedef struct kv_dense {
    kv_cache base;
    const be_ops *be;
    be_ctx *bc;
    be_dtype dt;
    int page;          /* slots per page, set by the first resize */
    size_t pbytes;     /* bytes of one page of K (or V) */
    void *k, *v;       /* [cap][n_kv][page][hd] */
} kv_dense;

static size_t dense_page_bytes(const kv_cache *base) { return 2 * ((const kv_dense *)base)->pbytes; }

static cinfer_status dense_resize(kv_cache *base, int old, int cap) {
    kv_dense *c = (kv_dense *)base;
    void *nk = c->be->alloc(c->bc, (size_t)cap * c->pbytes), *nv = c->be->alloc(c->bc, (size_t)cap * c->pbytes);
    if (!nk || !nv) {
        if (nk) c->be->free(c->bc, nk);
        if (nv) c->be->free(c->bc, nv);
        return CINFER_ENOMEM;
    }
    if (old && c->k) {
        c->be->copy(c->bc, nk, c->k, (size_t)old * c->pbytes);
        c->be->copy(c->bc, nv, c->v, (size_t)old * c->pbytes);
    }
    if (c->k) c->be->free(c->bc, c->k);
    if (c->v) c->be->free(c->bc, c->v);
    c->k = nk;
    c->v = nv;
    return CINFER_OK;
}

static void dense_copy_page(kv_cache *base, int dst, int src) {
    kv_dense *c = (kv_dense *)base;
    c->be->copy(c->bc, (char *)c->k + (size_t)dst * c->pbytes, (char *)c->k + (size_t)src * c->pbytes, c->pbytes);
    c->be->copy(c->bc, (char *)c->v + (size_t)dst * c->pbytes, (char *)c->v + (size_t)src * c->pbytes, c->pbytes);
}

static void dense_update_attend(kv_cache *base, const be_attn *a, float *k, const float *v, float *q, float *out) {
    kv_dense *c = (kv_dense *)base;
    const be_ops *be = c->be;
    int T = a->B * a->L;
    if (a->inv_freq && be->rope_kv_write) {
        be->rope_kv_write(c->bc, a, q, k, v, c->k, c->v, c->dt);
    } else {
        if (a->inv_freq) {
            be->rope(c->bc, q, T, a->n_head, a->head_dim, a->rot_dims, a->pos, a->inv_freq, a->neox);
            be->rope(c->bc, k, T, a->n_kv_head, a->head_dim, a->rot_dims, a->pos, a->inv_freq, a->neox);
        }
        be->kv_write(c->bc, a, k, c->k, c->dt);
        be->kv_write(c->bc, a, v, c->v, c->dt);
    }
    be->attention(c->bc, a, q, c->k, c->v, c->dt, out);
}

/* host <-> pool copies of positions [p0, p0+n) of one sequence, per (head, page run) */
static void dense_xfer(kv_dense *c, const int32_t *pt, int page, int p0, int n, void *k, void *v, int to_host) {
    int hd = c->base.head_dim, n_kv = c->base.n_kv;
    size_t el = be_dtype_size(c->dt);
    for (int h = 0; h < n_kv; h++)
        for (int j = p0; j < p0 + n;) {
            int run = page - j % page;
            if (run > p0 + n - j) run = p0 + n - j;
            size_t off = (size_t)be_kv_off(pt, page, n_kv, hd, h, j, (int)el);
            size_t host = ((size_t)h * n + (j - p0)) * hd * el, bytes = (size_t)run * hd * el;
            if (to_host) {
                c->be->to_host(c->bc, (char *)k + host, (char *)c->k + off, bytes);
                c->be->to_host(c->bc, (char *)v + host, (char *)c->v + off, bytes);
            } else {
                c->be->from_host(c->bc, (char *)c->k + off, (const char *)k + host, bytes);
                c->be->from_host(c->bc, (char *)c->v + off, (const char *)v + host, bytes);
            }
            j += run;
        }
}

static void dense_read(kv_cache *base, const int32_t *pt, int page, int p0, int n, void *k, void *v) {
    dense_xfer((kv_dense *)base, pt, page, p0, n, k, v, 1);
}

static void dense_write(kv_cache *base, const int32_t *pt, int page, int p0, int n, const void *k, const void *v) {
    dense_xfer((kv_dense *)base, pt, page, p0, n, (void *)k, (void *)v, 0);
}

static be_dtype dense_dtype(const kv_cache *base) { return ((const kv_dense *)base)->dt; }

static void dense_free(kv_cache *base) {
    kv_dense *c = (kv_dense *)base;
    if (!c) return;
    if (c->k) c->be->free(c->bc, c->k);
    if (c->v) c->be->free(c->bc, c->v);
    free(c);
}

static const kv_vtab dense_vt = {"dense",         dense_page_bytes, dense_resize, dense_copy_page, dense_update_attend,
                                 dense_read,      dense_write,      dense_dtype,  dense_free};

kv_cache *kv_dense_new(const be_ops *be, be_ctx *bc, int n_kv, int hd, be_dtype dt, int page) {
    kv_dense *c = calloc(1, sizeof *c);
    if (!c) return NULL;
    c->base.vt = &dense_vt;
    c->base.n_kv = n_kv;
    c->base.head_dim = hd;
    c->be = be;
    c->bc = bc;
    c->dt = dt;
    c->page = page;
    c->pbytes = (size_t)n_kv * page * hd * be_dtype_size(dt);
    return &c->base;
}
