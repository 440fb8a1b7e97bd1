/*
 * pages.c — kv_group: page ids, reference counts, per-sequence page tables,
 * the three-phase step (prepare / commit / abort) and the window policy.
 *
 * Invariants:
 *  - pt[s][pi] is -1 or a held id (ref > 0); a sequence holds the pages of
 *    [0, min(len, n_sink)) and [rs, len) (rs: first kept position after the
 *    sinks; 0 when nothing was dropped), possibly a few more slots of its
 *    last page;
 *  - ref[id] counts the table entries naming id (forks share);
 *  - between steps, the backend copy of the table equals the host copy
 *    except for rows marked dirty; prepare uploads them before any kernel
 *    reads the table, so a decode step touches the table only when it
 *    starts a new page.
 * Window policy (see be_attn): a windowed group's step at pos0 keeps the
 * run from run0 = max(keep, pos0 - W + 1 + keep); once committed, positions
 * before len - W + 1 + keep (sinks excepted) are never visible again and
 * their pages return to the free list. A step or trim that would need them
 * is refused.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "cache/cache.h"
#include "util.h"

typedef struct undo { int seq, pi, old_id, new_id; } undo;

struct kv_group {
    const be_ops *be;
    be_ctx *bc;
    kv_budget *budget;
    int n_seq, page, window, keep;
    kv_cache **layers;        /* [n_layers] */
    int n_layers;
    size_t page_bytes;        /* one id over all layers */
    /* page ids */
    int cap;
    int *ref;                 /* [cap] */
    int *free_ids, n_free;    /* [cap] stack of ids with ref 0 */
    /* tables */
    int n_pt;
    int32_t *pt;              /* [n_seq][n_pt] host */
    int32_t *pt_dev;          /* [n_seq][n_pt] backend memory */
    int *len, *rs;            /* [n_seq] */
    unsigned char *dirty;     /* [n_seq] */
    int dirty_all;
    /* the prepared step */
    int B, cap_rows, max_span;
    int *seq, *pos0, *n, *run0;  /* [cap_rows] */
    int *mark;                /* [n_seq] row+1 of the sequence in the step, 0 = absent */
    undo *undo;
    int n_undo, cap_undo;
};

kv_group *kv_group_new(const be_ops *be, be_ctx *bc, kv_budget *budget, int n_seq, int page, int window, int keep) {
    kv_group *g = calloc(1, sizeof *g);
    if (!g) return NULL;
    g->be = be;
    g->bc = bc;
    g->budget = budget;
    g->n_seq = n_seq;
    g->page = page;
    g->window = window;
    g->keep = window ? keep : 0;
    g->len = calloc((size_t)n_seq, sizeof *g->len);
    g->rs = calloc((size_t)n_seq, sizeof *g->rs);
    g->dirty = calloc((size_t)n_seq, 1);
    g->mark = calloc((size_t)n_seq, sizeof *g->mark);
    if (!g->len || !g->rs || !g->dirty || !g->mark) { kv_group_free(g); return NULL; }
    return g;
}

void kv_group_free(kv_group *g) {
    if (!g) return;
    for (int i = 0; i < g->n_layers; i++) g->layers[i]->vt->free(g->layers[i]);
    if (g->budget) g->budget->used -= (size_t)g->cap * g->page_bytes;
    free(g->layers);
    free(g->ref);
    free(g->free_ids);
    free(g->pt);
    if (g->pt_dev) g->be->free(g->bc, g->pt_dev);
    free(g->len);
    free(g->rs);
    free(g->dirty);
    free(g->mark);
    free(g->seq);
    free(g->pos0);
    free(g->n);
    free(g->run0);
    free(g->undo);
    free(g);
}

cinfer_status kv_group_add(kv_group *g, kv_cache *layer) {
    kv_cache **l = realloc(g->layers, sizeof *l * (size_t)(g->n_layers + 1));
    if (!l) { layer->vt->free(layer); return CINFER_ENOMEM; }
    g->layers = l;
    if (g->cap && layer->vt->resize(layer, 0, g->cap)) { layer->vt->free(layer); return CINFER_ENOMEM; }
    l[g->n_layers++] = layer;
    g->page_bytes += layer->vt->page_bytes(layer);
    if (g->budget) g->budget->used += (size_t)g->cap * layer->vt->page_bytes(layer);
    return CINFER_OK;
}

int kv_group_len(const kv_group *g, int s) { return s >= 0 && s < g->n_seq ? g->len[s] : 0; }
int kv_group_n_layers(const kv_group *g) { return g->n_layers; }
kv_cache *kv_group_layer(const kv_group *g, int i) { return g->layers[i]; }
size_t kv_group_bytes(const kv_group *g) { return (size_t)(g->cap - g->n_free) * g->page_bytes; }
size_t kv_group_pool_bytes(const kv_group *g) { return (size_t)g->cap * g->page_bytes; }

int kv_group_window(const kv_group *g, int *keep) {
    if (keep) *keep = g->keep;
    return g->window;
}

const int32_t *kv_group_table(const kv_group *g, int s, int *page) {
    *page = g->page;
    return g->pt ? g->pt + (size_t)s * g->n_pt : NULL;
}

/* run0 of a step of a windowed group at pos0 */
static int run_start(const kv_group *g, int pos0) {
    if (!g->window) return 0;
    int r = pos0 - g->window + 1 + g->keep;
    return r > g->keep ? r : g->keep;
}

int kv_group_min_start(const kv_group *g, int s) {
    if (!g->window || g->rs[s] <= g->keep) return 0;
    return g->rs[s] + g->window - 1 - g->keep;
}

void kv_group_held(const kv_group *g, int s, int *n_sink, int *run, int *len) {
    *len = g->len[s];
    if (g->rs[s] > g->keep) {
        *n_sink = g->keep < *len ? g->keep : *len;
        *run = g->rs[s];
    } else {
        *n_sink = 0;
        *run = 0;
    }
}

static void release(kv_group *g, int id) {
    if (id >= 0 && --g->ref[id] == 0) g->free_ids[g->n_free++] = id;
}

static int take(kv_group *g) {
    int id = g->free_ids[--g->n_free];
    g->ref[id] = 1;
    return id;
}

/* drops the table entries of s for pages pi in [p_lo, p_hi) */
static void drop_pages(kv_group *g, int s, int p_lo, int p_hi) {
    int32_t *row = g->pt + (size_t)s * g->n_pt;
    if (p_hi > g->n_pt) p_hi = g->n_pt;
    for (int pi = p_lo < 0 ? 0 : p_lo; pi < p_hi; pi++)
        if (row[pi] >= 0) {
            release(g, row[pi]);
            row[pi] = -1;
            g->dirty[s] = 1;
        }
}

/* table rows at least `need` entries wide */
static cinfer_status widen(kv_group *g, int need) {
    if (need <= g->n_pt) return CINFER_OK;
    int n_pt = g->n_pt ? g->n_pt : 16;
    while (n_pt < need) n_pt *= 2;
    int32_t *pt = malloc(sizeof *pt * (size_t)g->n_seq * n_pt);
    int32_t *dev = g->be->alloc(g->bc, sizeof *pt * (size_t)g->n_seq * n_pt);
    if (!pt || !dev) {
        free(pt);
        if (dev) g->be->free(g->bc, dev);
        return CINFER_ENOMEM;
    }
    for (int s = 0; s < g->n_seq; s++)
        for (int i = 0; i < n_pt; i++) pt[(size_t)s * n_pt + i] = i < g->n_pt ? g->pt[(size_t)s * g->n_pt + i] : -1;
    free(g->pt);
    if (g->pt_dev) g->be->free(g->bc, g->pt_dev);
    g->pt = pt;
    g->pt_dev = dev;
    g->n_pt = n_pt;
    g->dirty_all = 1;
    return CINFER_OK;
}

/* at least `need` free ids, within the budget */
static cinfer_status reserve_ids(kv_group *g, int need, char *err, size_t n_err) {
    if (need <= g->n_free) return CINFER_OK;
    int min_cap = g->cap + need - g->n_free;
    int cap = g->cap * 2 > min_cap ? g->cap * 2 : min_cap;
    if (cap < 16) cap = 16;
    size_t room = g->budget->limit > g->budget->used ? g->budget->limit - g->budget->used : 0;
    if ((size_t)(cap - g->cap) * g->page_bytes > room) cap = min_cap;
    if ((size_t)(cap - g->cap) * g->page_bytes > room)
        return cf_err(err, n_err, CINFER_ENOMEM,
                    "KV memory budget exhausted: the step needs %d more pages of %zu bytes, %zu bytes of the %zu-byte "
                    "budget are in use (raise --kv-memory, or use fewer or shorter sequences)",
                    min_cap - g->cap, g->page_bytes, g->budget->used, g->budget->limit);
    int *ref = realloc(g->ref, sizeof *ref * (size_t)cap);
    if (ref) g->ref = ref;
    int *fr = realloc(g->free_ids, sizeof *fr * (size_t)cap);
    if (fr) g->free_ids = fr;
    if (!ref || !fr) return cf_err(err, n_err, CINFER_ENOMEM, "out of memory for the KV page lists");
    for (int i = 0; i < g->n_layers; i++)
        if (g->layers[i]->vt->resize(g->layers[i], g->cap, cap))
            return cf_err(err, n_err, CINFER_ENOMEM, "out of %s memory for %d KV pages (%zu bytes)", g->be->name, cap,
                        (size_t)cap * g->page_bytes);
    for (int id = cap - 1; id >= g->cap; id--) {
        g->ref[id] = 0;
        g->free_ids[g->n_free++] = id;
    }
    g->budget->used += (size_t)(cap - g->cap) * g->page_bytes;
    g->cap = cap;
    return CINFER_OK;
}

static cinfer_status grow_rows(kv_group *g, int B) {
    if (B <= g->cap_rows) return CINFER_OK;
    int *p[4];
    for (int i = 0; i < 4; i++) p[i] = malloc(sizeof(int) * (size_t)B);
    if (!p[0] || !p[1] || !p[2] || !p[3]) {
        for (int i = 0; i < 4; i++) free(p[i]);
        return CINFER_ENOMEM;
    }
    free(g->seq); free(g->pos0); free(g->n); free(g->run0);
    g->seq = p[0]; g->pos0 = p[1]; g->n = p[2]; g->run0 = p[3];
    g->cap_rows = B;
    return CINFER_OK;
}

/* a page the step writes needs a fresh id: absent, shared, or holding live
 * positions the step overwrites (kept for undo) */
static int needs_fresh(const kv_group *g, int s, int pi, int pos0) {
    int id = g->pt[(size_t)s * g->n_pt + pi], lo = pi * g->page, hi = lo + g->page;
    if (id < 0 || g->ref[id] > 1) return 1;
    return pos0 < g->len[s] && hi > pos0 && lo < g->len[s];
}

static void upload(kv_group *g) {
    if (g->dirty_all) {
        g->be->from_host(g->bc, g->pt_dev, g->pt, sizeof *g->pt * (size_t)g->n_seq * g->n_pt);
        memset(g->dirty, 0, (size_t)g->n_seq);
        g->dirty_all = 0;
        return;
    }
    for (int s = 0; s < g->n_seq; s++)
        if (g->dirty[s]) {
            size_t off = (size_t)s * g->n_pt;
            g->be->from_host(g->bc, g->pt_dev + off, g->pt + off, sizeof *g->pt * (size_t)g->n_pt);
            g->dirty[s] = 0;
        }
}

cinfer_status kv_group_prepare(kv_group *g, int B, const int *seq, const int *pos0, const int *len, char *err,
                               size_t n_err) {
    cinfer_status st = grow_rows(g, B);
    if (st) return cf_err(err, n_err, st, "out of memory");
    int need_pt = 1, fresh = 0;
    for (int b = 0; b < B; b++) g->mark[seq[b] >= 0 && seq[b] < g->n_seq ? seq[b] : 0] = 0;
    for (int b = 0; b < B; b++) {
        int s = seq[b];
        if (s < 0 || s >= g->n_seq)
            return cf_err(err, n_err, CINFER_EINVAL, "row %d names sequence %d; the context holds sequences 0..%d", b, s,
                        g->n_seq - 1);
        if (g->mark[s]) return cf_err(err, n_err, CINFER_EINVAL, "rows %d and %d both extend sequence %d", g->mark[s] - 1, b, s);
        g->mark[s] = b + 1;
        if (pos0[b] < 0 || pos0[b] > g->len[s])
            return cf_err(err, n_err, CINFER_EINVAL, "row %d starts sequence %d at position %d but it holds %d tokens", b, s,
                        pos0[b], g->len[s]);
        if (len[b] > 0 && pos0[b] < kv_group_min_start(g, s))
            return cf_err(err, n_err, CINFER_EINVAL,
                        "row %d starts sequence %d at position %d, but its window has dropped the keys that position "
                        "needs (it can continue only from %d)", b, s, pos0[b], kv_group_min_start(g, s));
        int end = pos0[b] + len[b];
        if ((end + g->page - 1) / g->page > need_pt) need_pt = (end + g->page - 1) / g->page;
    }
    if (widen(g, need_pt)) return cf_err(err, n_err, CINFER_ENOMEM, "out of memory for the KV page tables");
    for (int b = 0; b < B; b++)
        for (int pi = pos0[b] / g->page; len[b] > 0 && pi <= (pos0[b] + len[b] - 1) / g->page; pi++)
            fresh += needs_fresh(g, seq[b], pi, pos0[b]);
    if ((st = reserve_ids(g, fresh, err, n_err))) return st;
    if (fresh > g->cap_undo) {
        undo *u = realloc(g->undo, sizeof *u * (size_t)fresh);
        if (!u) return cf_err(err, n_err, CINFER_ENOMEM, "out of memory");
        g->undo = u;
        g->cap_undo = fresh;
    }
    /* nothing can fail from here on */
    g->n_undo = 0;
    g->B = B;
    g->max_span = 1;
    for (int b = 0; b < B; b++) {
        int s = seq[b];
        int32_t *row = g->pt + (size_t)s * g->n_pt;
        for (int pi = pos0[b] / g->page; len[b] > 0 && pi <= (pos0[b] + len[b] - 1) / g->page; pi++) {
            if (!needs_fresh(g, s, pi, pos0[b])) continue;
            int old = row[pi], id = take(g);
            if (old >= 0)
                for (int i = 0; i < g->n_layers; i++) g->layers[i]->vt->copy_page(g->layers[i], id, old);
            g->undo[g->n_undo++] = (undo){s, pi, old, id};
            row[pi] = id;
            g->dirty[s] = 1;
        }
        g->seq[b] = s;
        g->pos0[b] = pos0[b];
        g->n[b] = len[b];
        g->run0[b] = run_start(g, pos0[b]);
        int span = pos0[b] + len[b];
        if (g->window && span > g->window) span = g->window;
        if (span > g->max_span) g->max_span = span;
    }
    upload(g);
    return CINFER_OK;
}

void kv_group_describe(const kv_group *g, be_attn *a) {
    a->page = g->page;
    a->n_pt = g->n_pt;
    a->pt = g->pt_dev;
    a->pt_host = g->pt;
    a->seq = g->seq;
    a->window = g->window;
    a->keep = g->keep;
    a->run0 = g->run0;
    a->max_span = g->max_span;
}

/* a sequence's length becomes len: pages past it, and pages the window can
 * no longer reach, go back to the pool */
static void settle(kv_group *g, int s, int len) {
    g->len[s] = len;
    drop_pages(g, s, (len + g->page - 1) / g->page, g->n_pt);
    if (!g->window) return;
    int rs = len - g->window + 1 + g->keep;
    if (rs <= g->rs[s] || rs <= g->keep) return;
    g->rs[s] = rs;
    /* pages wholly inside [keep, rs) */
    drop_pages(g, s, (g->keep + g->page - 1) / g->page, rs / g->page);
}

void kv_group_commit(kv_group *g) {
    for (int i = 0; i < g->n_undo; i++) release(g, g->undo[i].old_id);
    g->n_undo = 0;
    for (int b = 0; b < g->B; b++) settle(g, g->seq[b], g->pos0[b] + g->n[b]);
    g->B = 0;
}

void kv_group_abort(kv_group *g) {
    for (int i = g->n_undo - 1; i >= 0; i--) {
        undo u = g->undo[i];
        g->pt[(size_t)u.seq * g->n_pt + u.pi] = u.old_id;
        release(g, u.new_id);
        g->dirty[u.seq] = 1;
    }
    g->n_undo = 0;
    g->B = 0;
}

cinfer_status kv_group_trim(kv_group *g, int s, int n, char *err, size_t n_err) {
    if (s < 0 || s >= g->n_seq) return cf_err(err, n_err, CINFER_EINVAL, "no sequence %d (0..%d)", s, g->n_seq - 1);
    if (n < 0) n = 0;
    if (n >= g->len[s]) return CINFER_OK;
    if (n < kv_group_min_start(g, s))
        return cf_err(err, n_err, CINFER_EINVAL,
                    "cannot trim sequence %d to %d tokens: its window has dropped the keys before position %d", s, n,
                    g->rs[s]);
    settle(g, s, n);
    return CINFER_OK;
}

void kv_group_clear(kv_group *g, int s) {
    if (s < 0 || s >= g->n_seq) return;
    drop_pages(g, s, 0, g->n_pt);
    g->len[s] = 0;
    g->rs[s] = 0;
}

cinfer_status kv_group_fork(kv_group *g, int src, int dst, char *err, size_t n_err) {
    if (src < 0 || src >= g->n_seq || dst < 0 || dst >= g->n_seq || src == dst)
        return cf_err(err, n_err, CINFER_EINVAL, "cannot fork sequence %d into %d (sequences 0..%d, distinct)", src, dst,
                    g->n_seq - 1);
    kv_group_clear(g, dst);
    for (int pi = 0; pi < g->n_pt; pi++) {
        int id = g->pt[(size_t)src * g->n_pt + pi];
        if (id >= 0) g->ref[id]++;
        g->pt[(size_t)dst * g->n_pt + pi] = id;
    }
    g->len[dst] = g->len[src];
    g->rs[dst] = g->rs[src];
    g->dirty[dst] = 1;
    return CINFER_OK;
}

cinfer_status kv_group_restore(kv_group *g, int s, int n_sink, int run, int len, char *err, size_t n_err) {
    if (s < 0 || s >= g->n_seq) return cf_err(err, n_err, CINFER_EINVAL, "no sequence %d (0..%d)", s, g->n_seq - 1);
    int ok = len >= run && (run == 0 ? n_sink == 0 : g->window && run > g->keep && n_sink == (g->keep < len ? g->keep : len));
    if (!ok)
        return cf_err(err, n_err, CINFER_EFORMAT, "snapshot holds positions [0, %d) and [%d, %d), which this cache (window %d, keep %d) cannot hold",
                    n_sink, run, len, g->window, g->keep);
    kv_group_clear(g, s);
    if (widen(g, (len + g->page - 1) / g->page)) return cf_err(err, n_err, CINFER_ENOMEM, "out of memory for the KV page tables");
    int32_t *row = g->pt + (size_t)s * g->n_pt, need = 0;
    for (int pi = 0; pi * g->page < len; pi++)
        need += pi * g->page < n_sink || (pi + 1) * g->page > run;
    cinfer_status st = reserve_ids(g, need, err, n_err);
    if (st) return st;
    row = g->pt + (size_t)s * g->n_pt;
    for (int pi = 0; pi * g->page < len; pi++)
        if (pi * g->page < n_sink || (pi + 1) * g->page > run) row[pi] = take(g);
    g->len[s] = len;
    g->rs[s] = run;
    g->dirty[s] = 1;
    return CINFER_OK;
}

int kv_group_max_len(const kv_group *g) {
    int m = 0;
    for (int s = 0; s < g->n_seq; s++) m = g->len[s] > m ? g->len[s] : m;
    return m;
}

cinfer_status kv_group_convert(kv_group *g, int i, kv_cache *nc) {
    kv_cache *old = g->layers[i];
    size_t n = (size_t)old->n_kv * g->page * old->head_dim;
    float *k = g->cap ? malloc(2 * n * sizeof(float)) : NULL;
    if ((g->cap && !k) || (g->cap && nc->vt->resize(nc, 0, g->cap))) {
        free(k);
        nc->vt->free(nc);
        return CINFER_ENOMEM;
    }
    for (int id = 0; id < g->cap; id++)
        if (g->ref[id] > 0) {
            old->vt->page_get(old, id, k, k + n);
            nc->vt->page_put(nc, id, k, k + n);
        }
    free(k);
    size_t ob = old->vt->page_bytes(old), nb = nc->vt->page_bytes(nc);
    if (g->budget) g->budget->used = g->budget->used - (size_t)g->cap * ob + (size_t)g->cap * nb;
    g->page_bytes = g->page_bytes - ob + nb;
    old->vt->free(old);
    g->layers[i] = nc;
    return CINFER_OK;
}
