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
    if (a->inv_freq && be->rope_kv_attend) {
        be->rope_kv_attend(c->bc, a, q, k, v, c->k, c->v, c->dt, out);
        return;
    }
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

void kv_pool_xfer(const be_ops *be, be_ctx *bc, void *pk, void *pv, size_t row, int n_kv, const int32_t *pt, int page,
                  int p0, int n, void *k, void *v, int to_host) {
    for (int h = 0; h < n_kv; h++)
        for (int j = p0; j < p0 + n;) {
            int run = page - j % page;
            if (run > p0 + n - j) run = p0 + n - j;
            size_t off = (size_t)be_kv_off(pt, page, n_kv, 1, h, j, 1) * row;
            size_t host = ((size_t)h * n + (j - p0)) * row, bytes = (size_t)run * row;
            if (to_host) {
                be->to_host(bc, (char *)k + host, (char *)pk + off, bytes);
                be->to_host(bc, (char *)v + host, (char *)pv + off, bytes);
            } else {
                be->from_host(bc, (char *)pk + off, (const char *)k + host, bytes);
                be->from_host(bc, (char *)pv + off, (const char *)v + host, bytes);
            }
            j += run;
        }
}

static int dense_parts(const kv_cache *base, kv_part *out) {
    const kv_dense *c = (const kv_dense *)base;
    out[0] = (kv_part){be_dtype_name(c->dt), base->head_dim, be_dtype_size(c->dt)};
    return 1;
}

static void dense_read(kv_cache *base, int part, const int32_t *pt, int page, int p0, int n, void *k, void *v) {
    kv_dense *c = (kv_dense *)base;
    (void)part;
    kv_pool_xfer(c->be, c->bc, c->k, c->v, (size_t)base->head_dim * be_dtype_size(c->dt), base->n_kv, pt, page, p0, n, k,
                 v, 1);
}

static void dense_write(kv_cache *base, int part, const int32_t *pt, int page, int p0, int n, const void *k,
                        const void *v) {
    kv_dense *c = (kv_dense *)base;
    (void)part;
    kv_pool_xfer(c->be, c->bc, c->k, c->v, (size_t)base->head_dim * be_dtype_size(c->dt), base->n_kv, pt, page, p0, n,
                 (void *)k, (void *)v, 0);
}

/* one page id through the host, converted element by element */
static void dense_page_io(kv_dense *c, int id, float *k, float *v, int get) {
    size_t n = (size_t)c->base.n_kv * c->page * c->base.head_dim;
    char *hk = malloc(2 * c->pbytes), *hv = hk + c->pbytes;
    if (!hk) return;
    int32_t pt = id;
    if (!get)
        for (size_t i = 0; i < n; i++) be_kv_put(hk, c->dt, i, k[i]), be_kv_put(hv, c->dt, i, v[i]);
    /* the page as one sequence of `page` positions: host [n_kv][page][hd], the pool's own order */
    kv_pool_xfer(c->be, c->bc, c->k, c->v, (size_t)c->base.head_dim * be_dtype_size(c->dt), c->base.n_kv, &pt, c->page,
                 0, c->page, hk, hv, get);
    if (get)
        for (size_t i = 0; i < n; i++) k[i] = be_kv_get(hk, c->dt, i), v[i] = be_kv_get(hv, c->dt, i);
    free(hk);
}

static void dense_page_get(kv_cache *base, int id, float *k, float *v) { dense_page_io((kv_dense *)base, id, k, v, 1); }
static void dense_page_put(kv_cache *base, int id, const float *k, const float *v) {
    dense_page_io((kv_dense *)base, id, (float *)k, (float *)v, 0);
}

static void dense_free(kv_cache *base) {
    kv_dense *c = (kv_dense *)base;
    if (!c) return;
    if (c->k) c->be->free(c->bc, c->k);
    if (c->v) c->be->free(c->bc, c->v);
    free(c);
}

static const kv_vtab dense_vt = {.kind = "dense",
                                 .page_bytes = dense_page_bytes,
                                 .resize = dense_resize,
                                 .copy_page = dense_copy_page,
                                 .update_attend = dense_update_attend,
                                 .parts = dense_parts,
                                 .read = dense_read,
                                 .write = dense_write,
                                 .page_get = dense_page_get,
                                 .page_put = dense_page_put,
                                 .free = dense_free};

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
