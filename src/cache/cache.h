/*
 * cache.h — the state layer: many sequences in paged KV memory.
 *
 * A context holds n_seq sequences (ids 0..n_seq-1; an unused one is simply
 * empty). Layers whose caches follow the same policy (window, sink tokens)
 * share a kv_group: one page table per sequence, page ids with reference
 * counts, a free list. Each layer of the group owns its storage (a kv_cache
 * of some page format: f32/f16/bf16 now) indexed by those page ids, so a
 * page id stands for the same positions in every layer of its group.
 *
 * Sequences forked from a common prefix share pages by reference count; a
 * write into a shared page, or over positions a sequence already holds,
 * first moves the page to a fresh copy (copy on write), so a failed step can
 * be undone and a fork never disturbs its parent.
 *
 * A forward is three phases, driven by ctx.c:
 *   kv_group_prepare  validates every row (sequence, start, window) and
 *                     reserves/copies every page the step writes — the only
 *                     phase that can fail, and it changes nothing visible;
 *   update_attend     per layer: RoPE, K/V writes, attention (be_attn);
 *   kv_group_commit   sets lengths, releases pages that fell out of the
 *                     window or past a trimmed end (kv_group_abort undoes
 *                     the prepare instead).
 * The group owns the mask: it fills the be_attn descriptor (page table,
 * run0, window, keep) that every attention kernel reads through be_span.
 */
#ifndef CINFER_CACHE_H
#define CINFER_CACHE_H
#include "backend/backend.h"
#include "cinfer.h"

typedef struct kv_cache kv_cache;
typedef struct kv_group kv_group;

/* the memory budget shared by a context's groups */
typedef struct kv_budget {
    size_t limit;   /* bytes the pools may hold */
    size_t used;    /* bytes they hold */
} kv_budget;

/* one stored part of a slot (kv head, position), as snapshots carry it:
 * dense formats have one (the values), quantized ones three (codes, scales, biases) */
typedef struct kv_part {
    const char *dtype;   /* "f32", "f16", "bf16", "u32" (packed codes) */
    int width;           /* elements per slot */
    size_t el;           /* bytes per element */
} kv_part;
#define KV_MAX_PARTS 3

/* a layer's storage: one page format */
typedef struct kv_vtab {
    const char *kind;
    size_t (*page_bytes)(const kv_cache *c);                 /* K and V of one page id */
    /* pools now hold cap page ids; ids [0, old) keep their contents */
    cinfer_status (*resize)(kv_cache *c, int old, int cap);
    void (*copy_page)(kv_cache *c, int dst, int src);
    /* a (filled by the group: pages, mask) — ropes q and k, writes k, v, attends q -> out */
    void (*update_attend)(kv_cache *c, const be_attn *a, float *k, const float *v, float *q, float *out);
    /* the parts of a slot (out[KV_MAX_PARTS]); returns how many */
    int (*parts)(const kv_cache *c, kv_part *out);
    /* host copies of one part of positions [p0, p0+n) of a sequence (table row pt):
     * k, v [n_kv][n][width] of that part */
    void (*read)(kv_cache *c, int part, const int32_t *pt, int page, int p0, int n, void *k, void *v);
    void (*write)(kv_cache *c, int part, const int32_t *pt, int page, int p0, int n, const void *k, const void *v);
    /* f32 values of page id: k, v [n_kv][page][hd] on the host (quantized formats dequantize) */
    void (*page_get)(kv_cache *c, int id, float *k, float *v);
    /* stores page id from f32 values (the format's own rounding or quantization) */
    void (*page_put)(kv_cache *c, int id, const float *k, const float *v);
    void (*free)(kv_cache *c);
} kv_vtab;

struct kv_cache {
    const kv_vtab *vt;
    int n_kv, head_dim;
};

/* A dense page format (f32, f16 or bf16 keys and values). */
kv_cache *kv_dense_new(const be_ops *be, be_ctx *bc, int n_kv_head, int head_dim, be_dtype dt, int page);

/* the quantized kernel sets (cinfer_ctx_opts.kv_kernels) */
typedef enum kv_kernels { KV_UNFUSED = 0, KV_TILED_CAUSAL = 1, KV_TILED = 2 } kv_kernels;
/* A quantized page format (be_kvq: MLX affine codes of `bits` bits, groups of
 * `group` along head_dim, scales and biases in sdt), attending through the
 * kernel set `kernels`. The caller has validated bits, group and head_dim. */
kv_cache *kv_quant_new(const be_ops *be, be_ctx *bc, int n_kv_head, int head_dim, int bits, int group, be_dtype sdt,
                       int page, kv_kernels kernels);

/* Pools laid out [cap][n_kv][page][row bytes] (every format's parts): host
 * copies [n_kv][n][row bytes] of positions [p0, p0+n) of one sequence. */
void kv_pool_xfer(const be_ops *be, be_ctx *bc, void *pk, void *pv, size_t row, int n_kv, const int32_t *pt, int page,
                  int p0, int n, void *k, void *v, int to_host);

/* ---------------------------------------------------------------- groups */

/* window 0: causal over everything; window W, keep K: see be_attn */
kv_group *kv_group_new(const be_ops *be, be_ctx *bc, kv_budget *budget, int n_seq, int page, int window, int keep);
void kv_group_free(kv_group *g);   /* frees its layers too; NULL is fine */
/* adds a layer's storage (the group takes ownership) */
cinfer_status kv_group_add(kv_group *g, kv_cache *layer);

int kv_group_len(const kv_group *g, int seq);          /* the sequence's next position */
/* the first position a step of seq may start at (windows drop older ones) */
int kv_group_min_start(const kv_group *g, int seq);
size_t kv_group_bytes(const kv_group *g);              /* bytes of the pages held */
size_t kv_group_pool_bytes(const kv_group *g);         /* bytes of the pools */

/* sequence operations; err gets a message on failure */
cinfer_status kv_group_trim(kv_group *g, int seq, int n, char *err, size_t n_err);
void kv_group_clear(kv_group *g, int seq);
cinfer_status kv_group_fork(kv_group *g, int src, int dst, char *err, size_t n_err);

/* one step over B rows: row b writes positions pos0[b]..pos0[b]+len[b]-1 of
 * sequence seq[b]. On failure nothing changed and err says why. */
cinfer_status kv_group_prepare(kv_group *g, int B, const int *seq, const int *pos0, const int *len, char *err,
                               size_t n_err);
/* fills the paging and mask fields of a for the prepared step */
void kv_group_describe(const kv_group *g, be_attn *a);
void kv_group_commit(kv_group *g);
void kv_group_abort(kv_group *g);

/* the positions a sequence holds: [0, n_sink) and [run, len) */
void kv_group_held(const kv_group *g, int seq, int *n_sink, int *run, int *len);
int kv_group_n_layers(const kv_group *g);
kv_cache *kv_group_layer(const kv_group *g, int i);
int kv_group_window(const kv_group *g, int *keep);
/* rebuilds seq (cleared first) holding [0, n_sink) and [run, len): pages
 * allocated; the layers' data is then written by the caller */
cinfer_status kv_group_restore(kv_group *g, int seq, int n_sink, int run, int len, char *err, size_t n_err);
const int32_t *kv_group_table(const kv_group *g, int seq, int *page);
/* replaces layer i's storage by nc (which the group then owns), every held
 * page carried over through f32 (page_get -> page_put); on failure nc is
 * freed and layer i is unchanged */
cinfer_status kv_group_convert(kv_group *g, int i, kv_cache *nc);
/* the longest sequence */
int kv_group_max_len(const kv_group *g);
#endif
