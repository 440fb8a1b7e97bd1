/*
 * seq.c — the public sequence calls (length, trim, fork, free), context-wide
 * trim/reset/info, and snapshots: a sequence's state as named tensors
 * ("L.0" keys, "L.1" values, [1][n_kv][T][hd] over the positions the layer
 * holds) plus a JSON header, produced from and restored into each layer's
 * page format through its read/write codec. Every group of the context
 * sees the same sequence operations, so their lengths always agree.
 */
#include <jansson.h>
#include <string.h>
#include "engine/engine.h"
#include "quant/affine.h"
#include "util.h"

int cinfer_seq_len(const cinfer_ctx *c, int seq) { return kv_group_len(c->groups[0], seq); }

static int seq_ok(const cinfer_ctx *c, int seq) { return seq >= 0 && seq < c->n_seq; }

cinfer_status cinfer_seq_trim(cinfer_ctx *c, int seq, int n) {
    if (!seq_ok(c, seq)) return ctx_fail(c, CINFER_EINVAL, "trim: no sequence %d (0..%d)", seq, c->n_seq - 1);
    for (int g = 0; g < c->n_groups; g++)   /* all or none */
        if (n < cinfer_seq_len(c, seq) && n < kv_group_min_start(c->groups[g], seq))
            return ctx_fail(c, CINFER_EINVAL,
                            "trim: sequence %d cannot go back to %d tokens: its window has dropped keys that position "
                            "needs (it can continue only from %d)", seq, n, kv_group_min_start(c->groups[g], seq));
    for (int g = 0; g < c->n_groups; g++) kv_group_trim(c->groups[g], seq, n, NULL, 0);
    return CINFER_OK;
}

cinfer_status cinfer_seq_fork(cinfer_ctx *c, int src, int dst) {
    if (!seq_ok(c, src) || !seq_ok(c, dst) || src == dst)
        return ctx_fail(c, CINFER_EINVAL, "fork: sequences %d -> %d must be distinct ids in 0..%d", src, dst, c->n_seq - 1);
    for (int g = 0; g < c->n_groups; g++) kv_group_fork(c->groups[g], src, dst, NULL, 0);
    return CINFER_OK;
}

void cinfer_seq_free(cinfer_ctx *c, int seq) {
    for (int g = 0; g < c->n_groups; g++) kv_group_clear(c->groups[g], seq);
}

void cinfer_ctx_trim(cinfer_ctx *c, int n) {
    for (int s = 0; s < c->n_seq; s++)
        if (cinfer_seq_len(c, s) > n && cinfer_seq_trim(c, s, n < 0 ? 0 : n)) cinfer_seq_free(c, s);
    c->err[0] = 0;
}

void cinfer_ctx_reset(cinfer_ctx *c) {
    for (int s = 0; s < c->n_seq; s++) cinfer_seq_free(c, s);
}

int cinfer_ctx_pos(const cinfer_ctx *c) { return cinfer_seq_len(c, 0); }

size_t cinfer_ctx_cache_bytes(const cinfer_ctx *c) {
    size_t s = 0;
    for (int g = 0; g < c->n_groups; g++) s += kv_group_bytes(c->groups[g]);
    return s;
}

void cinfer_ctx_kv_info(const cinfer_ctx *c, cinfer_kv_info *info) {
    memset(info, 0, sizeof *info);
    for (int g = 0; g < c->n_groups; g++) info->bytes_pool += kv_group_pool_bytes(c->groups[g]);
    info->bytes_held = cinfer_ctx_cache_bytes(c);
    info->budget = c->budget.limit;
    info->page = c->kv_page;
    info->dtype = be_dtype_name(c->kv_dt);
    info->max_seqs = c->n_seq;
    info->max_kv_size = c->max_kv;
}

void cinfer_ctx_graph_stats(const cinfer_ctx *c, long *captures, long *replays) {
    *captures = *replays = 0;
    if (c->m->be->graph_stats) c->m->be->graph_stats(c->bc, captures, replays);
}

/* ------------------------------------------------------------ snapshots */

void cinfer_snapshot_free(cinfer_snapshot *s) {
    if (!s) return;
    for (int i = 0; i < s->n_tensors; i++) free(s->tensors[i].data);
    free(s->tensors);
    free(s->header);
    free(s);
}

/* the positions layer l's group holds for seq: ranges [0, n_sink), [run, len) as (start, count) pairs */
static int held_ranges(const kv_group *g, int seq, int r[4]) {
    int n_sink, run, len;
    kv_group_held(g, seq, &n_sink, &run, &len);   /* run 0: n_sink 0, all of [0, len) */
    r[0] = 0;
    r[1] = n_sink;
    r[2] = run;
    r[3] = len - run;
    return n_sink + len - run;
}

/* moves part `part` of a layer's positions between the pool and a tensor [n_kv][T][width] (to_host: pool -> tensor) */
static cinfer_status layer_xfer(kv_cache *kc, const kv_group *g, int seq, int part, void *k, void *v, int to_host) {
    kv_part pp[KV_MAX_PARTS];
    kc->vt->parts(kc, pp);
    int r[4], page, T = held_ranges(g, seq, r);
    size_t row = (size_t)pp[part].width * pp[part].el, col = 0;
    const int32_t *pt = kv_group_table(g, seq, &page);
    for (int i = 0; i < 4; i += 2) {
        int n = r[i + 1];
        if (!n) continue;
        size_t run = (size_t)kc->n_kv * n * row;
        char *tk = malloc(run), *tv = malloc(run);
        if (!tk || !tv) { free(tk); free(tv); return CINFER_ENOMEM; }
        for (int h = 0; !to_host && h < kc->n_kv; h++) {
            memcpy(tk + (size_t)h * n * row, (char *)k + ((size_t)h * T + col) * row, (size_t)n * row);
            memcpy(tv + (size_t)h * n * row, (char *)v + ((size_t)h * T + col) * row, (size_t)n * row);
        }
        if (to_host) kc->vt->read(kc, part, pt, page, r[i], n, tk, tv);
        else kc->vt->write(kc, part, pt, page, r[i], n, tk, tv);
        for (int h = 0; to_host && h < kc->n_kv; h++) {
            memcpy((char *)k + ((size_t)h * T + col) * row, tk + (size_t)h * n * row, (size_t)n * row);
            memcpy((char *)v + ((size_t)h * T + col) * row, tv + (size_t)h * n * row, (size_t)n * row);
        }
        free(tk);
        free(tv);
        col += n;
    }
    return CINFER_OK;
}

/* the tensor name of part p of K (kv 0) or V (kv 1) of layer l: "L.kv" for a
 * one-part format, "L.kv.p" for the quantized triple (mlx-lm's names) */
static void part_name(char *name, size_t n, int l, int kv, int p, int n_parts) {
    if (n_parts == 1) snprintf(name, n, "%d.%d", l, kv);
    else snprintf(name, n, "%d.%d.%d", l, kv, p);
}

static cinfer_status add_tensor(cinfer_snapshot *s, const char *name, const kv_part *p, int n_kv, int T) {
    cinfer_tensor *t = &s->tensors[s->n_tensors];
    memset(t, 0, sizeof *t);
    snprintf(t->name, sizeof t->name, "%s", name);
    t->dtype = p->dtype;
    t->ndim = 4;
    t->shape[0] = 1;
    t->shape[1] = n_kv;
    t->shape[2] = T;
    t->shape[3] = p->width;
    t->bytes = (size_t)n_kv * T * p->width * p->el;
    t->data = malloc(t->bytes ? t->bytes : 1);
    if (!t->data) return CINFER_ENOMEM;
    s->n_tensors++;
    return CINFER_OK;
}

cinfer_status cinfer_seq_snapshot(cinfer_ctx *c, int seq, cinfer_snapshot **out) {
    *out = NULL;
    if (!seq_ok(c, seq)) return ctx_fail(c, CINFER_EINVAL, "snapshot: no sequence %d (0..%d)", seq, c->n_seq - 1);
    int nl = c->m->cfg.n_layer;
    cinfer_snapshot *s = calloc(1, sizeof *s);
    json_t *root = json_object(), *layers = json_array();
    cinfer_status st = s && root && layers && (s->tensors = calloc((size_t)nl * 2 * KV_MAX_PARTS, sizeof *s->tensors))
                           ? CINFER_OK : CINFER_ENOMEM;
    for (int l = 0; !st && l < nl; l++) {
        kv_cache *kc = c->layer_cache[l];
        kv_group *g = c->layer_group[l];
        kv_part pp[KV_MAX_PARTS];
        int r[4], keep, T = held_ranges(g, seq, r), window = kv_group_window(g, &keep), np = kc->vt->parts(kc, pp);
        for (int p = 0; !st && p < np; p++) {
            char name[32];
            int at = s->n_tensors;
            part_name(name, sizeof name, l, 0, p, np);
            st = add_tensor(s, name, &pp[p], kc->n_kv, T);
            part_name(name, sizeof name, l, 1, p, np);
            if (!st) st = add_tensor(s, name, &pp[p], kc->n_kv, T);
            if (!st) st = layer_xfer(kc, g, seq, p, s->tensors[at].data, s->tensors[at + 1].data, 1);
        }
        json_t *o = json_pack("{s:i, s:s, s:s, s:i, s:i, s:i, s:i, s:i, s:i, s:i}", "layer", l, "kind", kc->vt->kind,
                              "dtype", pp[np - 1].dtype, "n_kv", kc->n_kv, "head_dim", kc->head_dim, "window", window,
                              "keep", keep, "sinks", r[1], "run", r[2], "offset", cinfer_seq_len(c, seq));
        if (!o || json_array_append_new(layers, o)) st = CINFER_ENOMEM;
    }
    if (!st && (json_object_set_new(root, "format", json_string("cinfer-kv")) ||
                json_object_set_new(root, "version", json_integer(1)) ||
                json_object_set_new(root, "tokens", json_integer(cinfer_seq_len(c, seq))) ||
                json_object_set(root, "layers", layers) || !(s->header = json_dumps(root, JSON_COMPACT))))
        st = CINFER_ENOMEM;
    json_decref(layers);
    json_decref(root);
    if (st) {
        cinfer_snapshot_free(s);
        return ctx_fail(c, st, "snapshot: out of memory");
    }
    *out = s;
    return CINFER_OK;
}

static const cinfer_tensor *find_tensor(const cinfer_snapshot *s, const char *name) {
    for (int i = 0; i < s->n_tensors; i++)
        if (!strcmp(s->tensors[i].name, name)) return &s->tensors[i];
    return NULL;
}

/* layer l's dense tensors "L.0" / "L.1" (any float dtype) quantized into the
 * layer's three parts (codes, scales, biases) in conv[p][i] */
static cinfer_status requantize(cinfer_ctx *c, const cinfer_snapshot *s, int l, int T, const kv_part *pp,
                                const void *kv[][2], void *conv[][2]) {
    kv_cache *kc = c->layer_cache[l];
    int hd = kc->head_dim, bits = pp[0].width * 32 / hd, group = hd / pp[1].width;
    be_dtype sdt = BE_F32, dt = BE_F32;
    be_dtype_from_name(pp[1].dtype, &sdt);
    size_t rows = (size_t)kc->n_kv * T;
    float *x = malloc(sizeof(float) * (size_t)hd);
    for (int i = 0; i < 2; i++) {
        char name[32];
        snprintf(name, sizeof name, "%d.%d", l, i);
        const cinfer_tensor *t = find_tensor(s, name);
        if (!t || !t->dtype || !be_dtype_from_name(t->dtype, &dt) || t->ndim != 4 || t->shape[1] != kc->n_kv ||
            t->shape[2] != T || t->shape[3] != hd || t->bytes != rows * hd * be_dtype_size(dt) || !t->data) {
            free(x);
            return ctx_fail(c, CINFER_EFORMAT, "restore: tensor %s is missing or not [1][%d][%d][%d] of f32/f16/bf16", name,
                            kc->n_kv, T, hd);
        }
        for (int p = 0; p < 3; p++)
            if (!(conv[p][i] = malloc(rows * pp[p].width * pp[p].el + 1))) { free(x); return ctx_fail(c, CINFER_ENOMEM, "restore: out of memory"); }
        for (size_t r = 0; r < rows; r++) {
            for (int d = 0; d < hd; d++) x[d] = be_kv_get(t->data, dt, r * hd + d);
            aq_quantize_row(x, hd, bits, group, AQ_ROUND_GPU, sdt, (uint8_t *)conv[0][i] + r * pp[0].width * pp[0].el,
                            (char *)conv[1][i] + r * pp[1].width * pp[1].el, (char *)conv[2][i] + r * pp[2].width * pp[2].el);
        }
        for (int p = 0; p < 3; p++) kv[p][i] = conv[p][i];
    }
    free(x);
    return CINFER_OK;
}

/* checks layer l's header entry and tensors against the context; kv[p][0..1]
 * get part p's K and V data, conv[p][0..1] a malloc'd copy when a float
 * part's dtype differs from the layer's (packed codes must match exactly) */
static cinfer_status check_layer(cinfer_ctx *c, const cinfer_snapshot *s, json_t *e, int l, int tokens, int *sinks,
                                 int *run, const void *kv[][2], void *conv[][2]) {
    kv_cache *kc = c->layer_cache[l];
    kv_part pp[KV_MAX_PARTS];
    int np = kc->vt->parts(kc, pp);
    int keep, window = kv_group_window(c->layer_group[l], &keep), lw = -1, lk = -1, nkv = -1, hd = -1, off = -1;
    const char *kind = NULL;
    *sinks = *run = -1;
    if (json_unpack(e, "{s:s, s:i, s:i, s:i, s:i, s:i, s:i, s:i}", "kind", &kind, "n_kv", &nkv, "head_dim", &hd, "window",
                    &lw, "keep", &lk, "sinks", sinks, "run", run, "offset", &off))
        return ctx_fail(c, CINFER_EFORMAT, "restore: layer %d: header entry lacks a field", l);
    /* a dense snapshot restores into quantized pages (quantized here, as a forward would write them) */
    int requant = !strcmp(kind, "dense") && np == 3;
    if ((strcmp(kind, kc->vt->kind) && !requant) || nkv != kc->n_kv || hd != kc->head_dim || lw != window || lk != keep ||
        off != tokens)
        return ctx_fail(c, CINFER_EFORMAT,
                        "restore: layer %d is %s n_kv %d head_dim %d window %d keep %d offset %d; this context's is %s "
                        "n_kv %d head_dim %d window %d keep %d offset %d", l, kind, nkv, hd, lw, lk, off, kc->vt->kind,
                        kc->n_kv, kc->head_dim, window, keep, tokens);
    int T = (*run ? *sinks : 0) + tokens - *run;
    if (requant) return requantize(c, s, l, T, pp, kv, conv);
    for (int p = 0; p < np; p++)
        for (int i = 0; i < 2; i++) {
            char name[32];
            part_name(name, sizeof name, l, i, p, np);
            const cinfer_tensor *t = find_tensor(s, name);
            be_dtype dt = BE_F32, want = BE_F32;
            /* a float part (values, scales, biases) takes any float dtype; packed codes their own exactly */
            int fl = be_dtype_from_name(pp[p].dtype, &want), okdt = t && t->dtype &&
                     (fl ? be_dtype_from_name(t->dtype, &dt) : !strcmp(t->dtype, pp[p].dtype));
            size_t el = fl ? be_dtype_size(dt) : pp[p].el;
            if (!okdt || t->ndim != 4 || t->shape[0] != 1 || t->shape[1] != nkv || t->shape[2] != T ||
                t->shape[3] != pp[p].width || t->bytes != (size_t)nkv * T * pp[p].width * el || !t->data)
                return ctx_fail(c, CINFER_EFORMAT, "restore: tensor %s is missing or not [1][%d][%d][%d] of %s", name, nkv, T,
                                pp[p].width, fl ? "f32/f16/bf16" : pp[p].dtype);
            kv[p][i] = t->data;
            if (!fl || dt == want) continue;
            size_t n = (size_t)nkv * T * pp[p].width;
            conv[p][i] = malloc(n * be_dtype_size(want) + 1);
            if (!conv[p][i]) return ctx_fail(c, CINFER_ENOMEM, "restore: out of memory");
            for (size_t j = 0; j < n; j++) be_kv_put(conv[p][i], want, j, be_kv_get(t->data, dt, j));
            kv[p][i] = conv[p][i];
        }
    return CINFER_OK;
}

cinfer_status cinfer_seq_restore(cinfer_ctx *c, int seq, const cinfer_snapshot *s) {
    if (!seq_ok(c, seq)) return ctx_fail(c, CINFER_EINVAL, "restore: no sequence %d (0..%d)", seq, c->n_seq - 1);
    if (!s || !s->header) return ctx_fail(c, CINFER_EINVAL, "restore: no snapshot");
    json_error_t je;
    json_t *root = json_loads(s->header, 0, &je), *layers = NULL;
    const char *fmt = NULL;
    int ver = 0, tokens = -1, nl = c->m->cfg.n_layer;
    if (!root || json_unpack(root, "{s:s, s:i, s:i, s:o}", "format", &fmt, "version", &ver, "tokens", &tokens, "layers",
                             &layers) || strcmp(fmt, "cinfer-kv") || ver != 1 || !json_is_array(layers) || tokens < 0) {
        json_decref(root);
        return ctx_fail(c, CINFER_EFORMAT, "restore: the header is not a cinfer-kv version 1 object with tokens and layers");
    }
    if ((int)json_array_size(layers) != nl) {
        json_decref(root);
        return ctx_fail(c, CINFER_EFORMAT, "restore: the snapshot has %d layers, the model %d", (int)json_array_size(layers), nl);
    }
    /* quantized layers restore into quantized pages: layers that would convert later convert now */
    for (size_t l = 0; l < json_array_size(layers); l++) {
        const char *kind = json_string_value(json_object_get(json_array_get(layers, l), "kind"));
        cinfer_status cs = kind && !strcmp(kind, "quant") ? ctx_kvq_convert(c, 1) : CINFER_OK;
        if (cs) { json_decref(root); return cs; }
    }
    /* check everything first: a refused snapshot leaves the sequence as it was */
    const void *(*kv)[KV_MAX_PARTS][2] = calloc((size_t)nl, sizeof *kv);
    void *(*conv)[KV_MAX_PARTS][2] = calloc((size_t)nl, sizeof *conv);
    int *sr = calloc((size_t)nl * 2, sizeof *sr);
    cinfer_status st = kv && conv && sr ? CINFER_OK : ctx_fail(c, CINFER_ENOMEM, "restore: out of memory");
    for (int l = 0; !st && l < nl; l++)
        st = check_layer(c, s, json_array_get(layers, l), l, tokens, &sr[2 * l], &sr[2 * l + 1], kv[l], conv[l]);
    for (int g = 0; !st && g < c->n_groups; g++) {
        int l = 0;
        while (c->layer_group[l] != c->groups[g]) l++;
        char msg[400];
        if ((st = kv_group_restore(c->groups[g], seq, sr[2 * l + 1] ? sr[2 * l] : 0, sr[2 * l + 1], tokens, msg, sizeof msg)))
            ctx_fail(c, st, "restore: %s", msg);
    }
    for (int l = 0; !st && l < nl; l++) {
        kv_part pp[KV_MAX_PARTS];
        int np = c->layer_cache[l]->vt->parts(c->layer_cache[l], pp);
        for (int p = 0; !st && p < np; p++)
            st = layer_xfer(c->layer_cache[l], c->layer_group[l], seq, p, (void *)kv[l][p][0], (void *)kv[l][p][1], 0);
    }
    if (st) cinfer_seq_free(c, seq);
    for (int l = 0; conv && l < nl; l++)
        for (int p = 0; p < KV_MAX_PARTS; p++) free(conv[l][p][0]), free(conv[l][p][1]);
    free(kv);
    free(conv);
    free(sr);
    json_decref(root);
    return st;
}
