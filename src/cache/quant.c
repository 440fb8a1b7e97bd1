/*
 * quant.c — the quantized page format: keys and values as MLX affine codes
 * along head_dim with a scale and a bias per group (be_kvq), in three pools
 * each per K and V: codes [cap][n_kv][page][hd*bits/8], scales and biases
 * [cap][n_kv][page][hd/group] in the KV dtype. Every write is quantized
 * before any query reads it (mlx-lm's QuantizedKVCache); attention runs the
 * kernel set chosen at construction:
 *   unfused       every read through mlx-lm's quantized SDPA;
 *   tiled-causal  decode (one query per row) unfused; a window of queries
 *                 tiled while this step's mask is plain causal (equal rows,
 *                 no window cut), unfused otherwise;
 *   tiled         decode unfused, every window tiled.
 */
#include <stdlib.h>
#include <string.h>
#include "cache/cache.h"
#include "quant/affine.h"

typedef struct kv_quant {
    kv_cache base;
    const be_ops *be;
    be_ctx *bc;
    be_kvq k, v;
    int page;
    kv_kernels kernels;
    size_t row, srow;     /* bytes of one slot's codes, of its scales (or biases) */
} kv_quant;

static size_t quant_slots(const kv_quant *c) { return (size_t)c->base.n_kv * c->page; }
static size_t quant_page_bytes(const kv_cache *base) {
    const kv_quant *c = (const kv_quant *)base;
    return 2 * quant_slots(c) * (c->row + 2 * c->srow);
}

/* the three pools of K or V, and their slot sizes */
static void **pool_ptr(be_kvq *p, int part) { return part == 0 ? &p->codes : part == 1 ? &p->scales : &p->biases; }
static size_t part_row(const kv_quant *c, int part) { return part == 0 ? c->row : c->srow; }

static cinfer_status quant_resize(kv_cache *base, int old, int cap) {
    kv_quant *c = (kv_quant *)base;
    void *n[2][3] = {{0}};
    int ok = 1;
    for (int kv = 0; kv < 2; kv++)
        for (int p = 0; p < 3; p++) ok &= (n[kv][p] = c->be->alloc(c->bc, (size_t)cap * quant_slots(c) * part_row(c, p))) != NULL;
    for (int kv = 0; kv < 2; kv++)
        for (int p = 0; p < 3; p++) {
            void **cur = pool_ptr(kv ? &c->v : &c->k, p);
            if (!ok) { if (n[kv][p]) c->be->free(c->bc, n[kv][p]); continue; }
            if (old && *cur) c->be->copy(c->bc, n[kv][p], *cur, (size_t)old * quant_slots(c) * part_row(c, p));
            if (*cur) c->be->free(c->bc, *cur);
            *cur = n[kv][p];
        }
    return ok ? CINFER_OK : CINFER_ENOMEM;
}

static void quant_copy_page(kv_cache *base, int dst, int src) {
    kv_quant *c = (kv_quant *)base;
    for (int kv = 0; kv < 2; kv++)
        for (int p = 0; p < 3; p++) {
            char *pool = *pool_ptr(kv ? &c->v : &c->k, p);
            size_t b = quant_slots(c) * part_row(c, p);
            c->be->copy(c->bc, pool + (size_t)dst * b, pool + (size_t)src * b, b);
        }
}

/* plain causal: every row starts at the same position with all its queries,
 * and no window cuts any query's keys */
static int plain_causal(const be_attn *a) {
    for (int b = 0; b < a->B; b++) {
        if (a->len[b] != a->L || a->pos0[b] != a->pos0[0]) return 0;
        if (a->window && a->pos0[b] + a->len[b] > a->window) return 0;
    }
    return 1;
}

static int pick_kernel(const kv_quant *c, const be_attn *a) {
    if (a->L == 1 || c->kernels == KV_UNFUSED) return BE_KVQ_UNFUSED;
    if (c->kernels == KV_TILED) return BE_KVQ_TILED;
    return plain_causal(a) ? BE_KVQ_TILED : BE_KVQ_UNFUSED;
}

static void quant_update_attend(kv_cache *base, const be_attn *a, float *k, const float *v, float *q, float *out) {
    kv_quant *c = (kv_quant *)base;
    const be_ops *be = c->be;
    if (a->inv_freq && be->rope_kvq_write) {
        be->rope_kvq_write(c->bc, a, q, k, v, &c->k, &c->v);
    } else {
        if (a->inv_freq) {
            int T = a->B * a->L;
            be->rope(c->bc, q, T, a->n_head, a->head_dim, a->rot_dims, a->pos, a->inv_freq, a->neox);
            be->rope(c->bc, k, T, a->n_kv_head, a->head_dim, a->rot_dims, a->pos, a->inv_freq, a->neox);
        }
        be->kvq_write(c->bc, a, k, &c->k);
        be->kvq_write(c->bc, a, v, &c->v);
    }
    be->kvq_attention(c->bc, a, q, &c->k, &c->v, pick_kernel(c, a), out);
}

static int quant_parts(const kv_cache *base, kv_part *out) {
    const kv_quant *c = (const kv_quant *)base;
    const char *sn = be_dtype_name(c->k.sdt);
    size_t es = be_dtype_size(c->k.sdt);
    out[0] = (kv_part){"u32", (int)(c->row / 4), 4};
    out[1] = out[2] = (kv_part){sn, (int)(c->srow / es), es};
    return 3;
}

static void quant_xfer(kv_quant *c, int part, const int32_t *pt, int page, int p0, int n, void *k, void *v, int to_host) {
    kv_pool_xfer(c->be, c->bc, *pool_ptr(&c->k, part), *pool_ptr(&c->v, part), part_row(c, part), c->base.n_kv, pt, page,
                 p0, n, k, v, to_host);
}
static void quant_read(kv_cache *base, int part, const int32_t *pt, int page, int p0, int n, void *k, void *v) {
    quant_xfer((kv_quant *)base, part, pt, page, p0, n, k, v, 1);
}
static void quant_write(kv_cache *base, int part, const int32_t *pt, int page, int p0, int n, const void *k,
                        const void *v) {
    quant_xfer((kv_quant *)base, part, pt, page, p0, n, (void *)k, (void *)v, 0);
}

/* one page id through the host: [n_kv][page] slots of each part */
static void quant_page_io(kv_quant *c, int id, float *k, float *v, int get) {
    size_t ns = quant_slots(c), per = c->row + 2 * c->srow;
    int hd = c->base.head_dim;
    char *h = malloc(2 * ns * per);
    if (!h) return;
    int32_t pt = id;
    char *part[2][3];
    for (int kv = 0; kv < 2; kv++) {
        part[kv][0] = h + kv * ns * per;
        part[kv][1] = part[kv][0] + ns * c->row;
        part[kv][2] = part[kv][1] + ns * c->srow;
    }
    for (int kv = 0; kv < 2; kv++) {
        float *x = kv ? v : k;
        for (size_t s = 0; !get && s < ns; s++)
            aq_quantize_row(x + s * hd, hd, c->k.bits, c->k.group, AQ_ROUND_GPU, c->k.sdt, (uint8_t *)part[kv][0] + s * c->row,
                            part[kv][1] + s * c->srow, part[kv][2] + s * c->srow);
    }
    for (int p = 0; p < 3; p++) quant_xfer(c, p, &pt, c->page, 0, c->page, part[0][p], part[1][p], get);
    for (int kv = 0; kv < 2 && get; kv++) {
        float *x = kv ? v : k;
        for (size_t s = 0; s < ns; s++)
            aq_dequant_row((uint8_t *)part[kv][0] + s * c->row, part[kv][1] + s * c->srow, part[kv][2] + s * c->srow,
                           c->k.sdt, c->k.bits, c->k.group, 0, hd, x + s * hd);
    }
    free(h);
}

static void quant_page_get(kv_cache *base, int id, float *k, float *v) { quant_page_io((kv_quant *)base, id, k, v, 1); }
static void quant_page_put(kv_cache *base, int id, const float *k, const float *v) {
    quant_page_io((kv_quant *)base, id, (float *)k, (float *)v, 0);
}

static void quant_free(kv_cache *base) {
    kv_quant *c = (kv_quant *)base;
    if (!c) return;
    for (int kv = 0; kv < 2; kv++)
        for (int p = 0; p < 3; p++) {
            void *x = *pool_ptr(kv ? &c->v : &c->k, p);
            if (x) c->be->free(c->bc, x);
        }
    free(c);
}

static const kv_vtab quant_vt = {.kind = "quant",
                                 .page_bytes = quant_page_bytes,
                                 .resize = quant_resize,
                                 .copy_page = quant_copy_page,
                                 .update_attend = quant_update_attend,
                                 .parts = quant_parts,
                                 .read = quant_read,
                                 .write = quant_write,
                                 .page_get = quant_page_get,
                                 .page_put = quant_page_put,
                                 .free = quant_free};

kv_cache *kv_quant_new(const be_ops *be, be_ctx *bc, int n_kv, int hd, int bits, int group, be_dtype sdt, int page,
                       kv_kernels kernels) {
    kv_quant *c = calloc(1, sizeof *c);
    if (!c) return NULL;
    c->base.vt = &quant_vt;
    c->base.n_kv = n_kv;
    c->base.head_dim = hd;
    c->be = be;
    c->bc = bc;
    c->page = page;
    c->kernels = kernels;
    c->k = (be_kvq){NULL, NULL, NULL, bits, group, sdt};
    c->v = c->k;
    c->row = aq_row_bytes(hd, bits);
    c->srow = (size_t)(hd / group) * be_dtype_size(sdt);
    return &c->base;
}
