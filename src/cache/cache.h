/*
 * cache.h — the per-layer cache interface. Each layer of a context owns one
 * kv_cache; the kind (full now; rotating, quantized, recurrent later) is
 * chosen per layer by the architecture. A cache owns its keys and therefore
 * the attention mask: attend() applies the mask rule of its kind (causal,
 * causal within a window) over each row's own positions. Storage lives in
 * backend memory (host on the CPU, device on CUDA).
 */
#ifndef CINFER_CACHE_H
#define CINFER_CACHE_H
#include "backend/backend.h"
#include "cinfer.h"

typedef struct kv_cache kv_cache;

typedef struct kv_vtab {
    const char *kind;
    /* ropes q and k in place when a->inv_freq is set, stores k,v [B][L][n_kv][hd] at
     * each row's positions pos0[b]..pos0[b]+len[b]-1, then attends q [B][L][n_head][hd]
     * -> out, same shape */
    cinfer_status (*update_attend)(kv_cache *c, const be_attn *a, float *k, const float *v, float *q, float *out);
    int (*row_len)(const kv_cache *c, int row);   /* tokens held by a row */
    void (*trim)(kv_cache *c, int row, int n);    /* keep the first n tokens of a row (-1: all rows) */
    size_t (*bytes)(const kv_cache *c);
    void (*free)(kv_cache *c);
} kv_vtab;

struct kv_cache {
    const kv_vtab *vt;
};

/* A growing cache (steps of 256 slots, like mlx-lm's KVCache), f32 or f16. */
kv_cache *kv_full_new(const be_ops *be, be_ctx *bc, int n_kv_head, int head_dim, be_dtype dt, int window);
#endif
