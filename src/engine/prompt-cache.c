/*
 * prompt-cache.c — mlx-lm prompt-cache files (mlx_lm.models.cache
 * save_prompt_cache / load_prompt_cache; ../shared/specs/caches.md 2d) on top
 * of the snapshot codecs of seq.c. A file is one safetensors image:
 *   tensors  "L.0" keys, "L.1" values, [1][n_kv][T][head_dim], any float dtype;
 *   metadata "0.L" (KVCache: "") or "0.L.0".."0.L.3" (RotatingKVCache: keep,
 *            max_size, offset, _idx), "1.KEY" user metadata, "2.L" class name.
 * cinfer writes the snapshot's temporal order with _idx = T, which is what
 * mlx-lm's own ring holds after a prefill and continues from identically
 * (padded to max_size when the window has dropped tokens, see pad_ring); it
 * reads a wrapped ring back into temporal order as RotatingKVCache's
 * _temporal_order does. QuantizedKVCache layers (cinfer's quantized pages)
 * are the triples "L.i.0" packed uint32 codes [1][n_kv][T][hd*bits/32],
 * "L.i.1" scales and "L.i.2" biases [1][n_kv][T][hd/group], meta state
 * "0.L.0".."0.L.2" = offset, group_size, bits. Everything in a file is
 * checked before the sequence is touched.
 */
#include <jansson.h>
#include <string.h>
#include "engine/engine.h"
#include "io/safetensors.h"
#include "util.h"

static const char *st_name_of(const char *dt) {
    return !strcmp(dt, "f32") ? "F32" : !strcmp(dt, "f16") ? "F16" : !strcmp(dt, "bf16") ? "BF16" : !strcmp(dt, "u32") ? "U32" : NULL;
}
static const char *dt_of_st(const char *st) {
    return !strcmp(st, "F32") ? "f32" : !strcmp(st, "F16") ? "f16" : !strcmp(st, "BF16") ? "bf16" : !strcmp(st, "U32") ? "u32" : NULL;
}
/* the layer of a snapshot tensor "L.i" / "L.i.j" */
static int tensor_layer(const cinfer_tensor *t) { return atoi(t->name); }

static int set_str(json_t *o, const char *k, const char *v) { return json_object_set_new(o, k, json_string(v)); }

/* the "1.*" keys cinfer adds beside mlx-lm's */
static cinfer_status add_fingerprints(cinfer_ctx *c, json_t *meta, const int32_t *tokens, int n) {
    char fp[33];
    if (cinfer_model_fingerprint(c->m, fp) || set_str(meta, "1.cinfer_model", fp)) return CINFER_ENOMEM;
    if (cinfer_tokenizer_fingerprint(c->m, fp) || set_str(meta, "1.cinfer_tokenizer", fp)) return CINFER_ENOMEM;
    if (!tokens) return CINFER_OK;
    json_t *a = json_array();
    for (int i = 0; a && i < n; i++) json_array_append_new(a, json_integer(tokens[i]));
    char *s = a ? json_dumps(a, JSON_COMPACT) : NULL;
    json_decref(a);
    int bad = !s || set_str(meta, "1.cinfer_tokens", s);
    free(s);
    return bad ? CINFER_ENOMEM : CINFER_OK;
}

/* A window that has dropped tokens but holds fewer than max_size slots
 * (cinfer keeps max_size - 1 between steps) is padded to max_size with zero
 * slots right after the sinks, as the oldest ring entries: mlx-lm's ring
 * cannot grow once offset passes its length, and overwrites (single-token
 * step) or trims (multi-token step) exactly these slots before attending. */
static void *pad_ring(const cinfer_tensor *t, int sinks, int max_size, size_t *bytes) {
    size_t T = (size_t)t->shape[2], row = t->bytes / ((size_t)t->shape[1] * (T ? T : 1)), pad = (size_t)max_size - T;
    char *out = calloc((size_t)t->shape[1] * max_size, row);
    if (!out) return NULL;
    for (int64_t h = 0; h < t->shape[1]; h++) {
        const char *src = (const char *)t->data + h * T * row;
        char *dst = out + h * (size_t)max_size * row;
        memcpy(dst, src, (size_t)sinks * row);
        memcpy(dst + ((size_t)sinks + pad) * row, src + (size_t)sinks * row, (T - (size_t)sinks) * row);
    }
    *bytes = (size_t)t->shape[1] * max_size * row;
    return out;
}

cinfer_status cinfer_prompt_cache_encode(cinfer_ctx *c, int seq, const char *user_meta_json, const int32_t *tokens,
                                         int n_tokens, void **buf, size_t *len) {
    *buf = NULL;
    *len = 0;
    if (tokens && n_tokens != cinfer_seq_len(c, seq))
        return ctx_fail(c, CINFER_EINVAL, "prompt cache: %d tokens given for a sequence of %d", n_tokens, cinfer_seq_len(c, seq));
    json_t *user = NULL;
    if (user_meta_json && *user_meta_json) {
        json_error_t je;
        user = json_loads(user_meta_json, 0, &je);
        if (!json_is_object(user)) { json_decref(user); return ctx_fail(c, CINFER_EINVAL, "prompt cache: user metadata is not a JSON object"); }
    }
    cinfer_snapshot *s = NULL;
    cinfer_status st = cinfer_seq_snapshot(c, seq, &s);
    if (st) { json_decref(user); return st; }
    int nl = c->m->cfg.n_layer;
    json_error_t je;
    json_t *hdr = json_loads(s->header, 0, &je), *layers = json_object_get(hdr, "layers"), *meta = json_object();
    st_wtensor *wt = calloc((size_t)s->n_tensors + 1, sizeof *wt);
    st = hdr && meta && wt && json_array_size(layers) == (size_t)nl ? CINFER_OK : CINFER_ENOMEM;
    char k[48], v[48];
    int *quant = st ? NULL : calloc((size_t)nl, sizeof *quant), *first = st ? NULL : calloc((size_t)nl, sizeof *first);
    if (!st && (!quant || !first)) st = CINFER_ENOMEM;
    for (int i = s->n_tensors - 1; !st && i >= 0; i--) first[tensor_layer(&s->tensors[i])] = i;
    for (int l = 0; !st && l < nl; l++) {   /* "0.*": meta states, in layer order */
        int window = 0, keep = 0, offset = 0, hd = c->m->cfg.head_dim;
        json_unpack(json_array_get(layers, l), "{s:i, s:i, s:i}", "window", &window, "keep", &keep, "offset", &offset);
        const cinfer_tensor *t0 = &s->tensors[first[l]];
        quant[l] = !strcmp(t0->dtype, "u32");
        if (quant[l] && window) {
            st = ctx_fail(c, CINFER_EUNSUPPORTED, "prompt cache: layer %d is a quantized window (--max-kv-size or a sliding "
                          "layer with --kv-bits); mlx-lm has no class for that cache, so it cannot be written as a prompt-cache file", l);
            break;
        }
        int T = (int)t0->shape[2], nv = quant[l] ? 3 : 4;
        /* QuantizedKVCache: offset, group_size, bits (from the codes' and scales' widths) */
        int vals[4] = {keep, window, offset, offset > T && T < window ? window : T};
        if (quant[l]) {   /* tensors K codes, V codes, K scales, ...: group from the scales, bits from the codes */
            vals[0] = offset;
            vals[1] = hd / (int)s->tensors[first[l] + 2].shape[3];
            vals[2] = (int)t0->shape[3] * 32 / hd;
        }
        if (!window && !quant[l]) { snprintf(k, sizeof k, "0.%d", l); st = set_str(meta, k, "") ? CINFER_ENOMEM : CINFER_OK; continue; }
        for (int j = 0; j < nv && !st; j++) {
            snprintf(k, sizeof k, "0.%d.%d", l, j);
            snprintf(v, sizeof v, "%d", vals[j]);
            if (set_str(meta, k, v)) st = CINFER_ENOMEM;
        }
    }
    const char *uk;
    json_t *uv;
    if (!st && user) json_object_foreach(user, uk, uv) {
        if (!json_is_string(uv)) { json_decref(user); user = NULL; st = CINFER_EINVAL; break; }
        char *key = malloc(strlen(uk) + 3);
        if (!key) { st = CINFER_ENOMEM; break; }
        sprintf(key, "1.%s", uk);
        if (set_str(meta, key, json_string_value(uv))) st = CINFER_ENOMEM;
        free(key);
    }
    if (!st) st = add_fingerprints(c, meta, tokens, n_tokens);
    for (int l = 0; !st && l < nl; l++) {
        snprintf(k, sizeof k, "2.%d", l);
        if (set_str(meta, k, quant[l] ? "QuantizedKVCache"
                             : json_integer_value(json_object_get(json_array_get(layers, l), "window")) ? "RotatingKVCache" : "KVCache"))
            st = CINFER_ENOMEM;
    }
    void **pads = st ? NULL : calloc((size_t)s->n_tensors + 1, sizeof *pads);
    int64_t(*shapes)[4] = st ? NULL : calloc((size_t)s->n_tensors + 1, sizeof *shapes);
    if (!st && (!pads || !shapes)) st = CINFER_ENOMEM;
    for (int i = 0; !st && i < s->n_tensors; i++) {
        cinfer_tensor *t = &s->tensors[i];
        memcpy(shapes[i], t->shape, sizeof shapes[i]);
        wt[i] = (st_wtensor){t->name, st_name_of(t->dtype), t->ndim, shapes[i], t->data, t->bytes};
        int window = 0, keep = 0, offset = 0, sinks = 0;
        json_unpack(json_array_get(layers, tensor_layer(t)), "{s:i, s:i, s:i, s:i}", "window", &window, "keep", &keep,
                    "offset", &offset, "sinks", &sinks);
        if (!window || offset <= t->shape[2] || t->shape[2] >= window) continue;
        if (!(pads[i] = pad_ring(t, sinks, window, &wt[i].nbytes))) st = CINFER_ENOMEM;
        shapes[i][2] = window;
        wt[i].data = pads[i];
    }
    char *mj = st ? NULL : json_dumps(meta, JSON_COMPACT | JSON_PRESERVE_ORDER), err[256];
    if (!st && !mj) st = CINFER_ENOMEM;
    if (!st && (st = st_write_mem(wt, s->n_tensors, mj, buf, len, err, sizeof err))) ctx_fail(c, st, "prompt cache: %s", err);
    else if (st == CINFER_EINVAL) ctx_fail(c, st, "prompt cache: user metadata values must be strings");
    else if (st == CINFER_ENOMEM) ctx_fail(c, st, "prompt cache: out of memory");
    free(mj);
    for (int i = 0; pads && i < s->n_tensors; i++) free(pads[i]);
    free(pads);
    free(shapes);
    free(wt);
    free(quant);
    free(first);
    json_decref(meta);
    json_decref(hdr);
    json_decref(user);
    cinfer_snapshot_free(s);
    return st;
}

cinfer_status cinfer_prompt_cache_save(cinfer_ctx *c, int seq, const char *path, const char *user_meta_json,
                                       const int32_t *tokens, int n_tokens) {
    void *buf;
    size_t len;
    char err[512];
    cinfer_status st = cinfer_prompt_cache_encode(c, seq, user_meta_json, tokens, n_tokens, &buf, &len);
    if (!st && (st = cf_write_atomic(path, buf, len, err, sizeof err))) ctx_fail(c, st, "prompt cache: %s", err);
    free(buf);
    return st;
}

/* ------------------------------------------------------------- reading */

typedef struct pc_layer {
    int rotating, keep, max_size, offset, idx;
    int quant, group, bits;   /* QuantizedKVCache */
} pc_layer;

/* meta state "0.L.j" for j < n into vals (counts) */
static cinfer_status meta_counts(cinfer_ctx *c, json_t *meta, int l, int n, int *const *vals, const char *cls) {
    char k[48];
    for (int j = 0; j < n; j++) {
        snprintf(k, sizeof k, "0.%d.%d", l, j);
        const char *s = json_string_value(json_object_get(meta, k));
        char *end;
        long x = s ? strtol(s, &end, 10) : -1;
        if (!s || !*s || *end || x < 0 || x > (1L << 30))
            return ctx_fail(c, CINFER_EFORMAT, "prompt cache: %s layer %d: meta state \"%s\" is missing or not a count", cls, l, k);
        *vals[j] = (int)x;
    }
    return CINFER_OK;
}

/* the class of layer l: 0 ok (kind filled), else a refusal. The seam for
 * QuantizedKVCache (issue 15: affine KV pages) is here. */
static cinfer_status class_kind(cinfer_ctx *c, json_t *meta, int l, pc_layer *pl) {
    char k[48];
    snprintf(k, sizeof k, "2.%d", l);
    const char *cls = json_string_value(json_object_get(meta, k));
    if (!cls) return ctx_fail(c, CINFER_EFORMAT, "prompt cache: no class name \"%s\" for layer %d", k, l);
    memset(pl, 0, sizeof *pl);
    if (!strcmp(cls, "KVCache")) return CINFER_OK;
    if (!strcmp(cls, "QuantizedKVCache")) {
        int *vals[3] = {&pl->offset, &pl->group, &pl->bits};
        cinfer_status st = meta_counts(c, meta, l, 3, vals, cls);
        if (st) return st;
        const int *kb = c->kvq_bits, *kg = c->kvq_group;
        if (!kb || kb[l] != pl->bits || kg[l] != pl->group) {
            char what[64] = "not quantized";
            if (kb && kb[l]) snprintf(what, sizeof what, "quantized to %d bits, group %d", kb[l], kg[l]);
            return ctx_fail(c, CINFER_EFORMAT, "prompt cache: layer %d is a QuantizedKVCache of %d bits, group %d; this context's "
                            "layer is %s: pass --kv-bits %d --kv-group-size %d", l, pl->bits, pl->group, what, pl->bits, pl->group);
        }
        pl->quant = 1;
        return CINFER_OK;
    }
    if (strcmp(cls, "RotatingKVCache"))
        return ctx_fail(c, CINFER_EUNSUPPORTED, "prompt cache: layer %d is a %s, which cinfer cannot load "
                        "(KVCache, RotatingKVCache and QuantizedKVCache only)", l, cls);
    int *vals[4] = {&pl->keep, &pl->max_size, &pl->offset, &pl->idx};
    cinfer_status st = meta_counts(c, meta, l, 4, vals, cls);
    pl->rotating = 1;
    return st;
}

/* checks cinfer's fingerprints when the file has them */
static cinfer_status check_fp(cinfer_ctx *c, json_t *meta, int *fingerprinted) {
    const char *fm = json_string_value(json_object_get(meta, "1.cinfer_model"));
    const char *ft = json_string_value(json_object_get(meta, "1.cinfer_tokenizer"));
    *fingerprinted = fm != NULL;
    char fp[33] = "";
    if (fm && (cinfer_model_fingerprint(c->m, fp) || strcmp(fp, fm)))
        return ctx_fail(c, CINFER_EFORMAT, "prompt cache: the file was written for another model (model fingerprint %.16s..., "
                        "this model's %.16s...)", fm, fp);
    if (ft && (cinfer_tokenizer_fingerprint(c->m, fp) || strcmp(fp, ft)))
        return ctx_fail(c, CINFER_EFORMAT, "prompt cache: the file was written with another tokenizer (fingerprint %.16s..., "
                        "this model's %.16s...)", ft, fp);
    return CINFER_OK;
}

/* a layer's tensor "L.i" (j < 0) or "L.i.j" checked against the model: dtype (codes: U32, else a
 * float), [1, kv_heads, T, width] */
static const st_tensor *layer_tensor(cinfer_ctx *c, const st_set *ss, int l, int i, int j, int width, cinfer_status *st) {
    char name[48];
    if (j < 0) snprintf(name, sizeof name, "%d.%d", l, i);
    else snprintf(name, sizeof name, "%d.%d.%d", l, i, j);
    const st_tensor *t = st_find(ss, name);
    kv_cache *kc = c->layer_cache[l];
    const char *d = t ? dt_of_st(t->dtype) : NULL;
    *st = CINFER_EFORMAT;
    if (!t) return ctx_fail(c, CINFER_EFORMAT, "prompt cache: tensor %s (layer %d's %s) is missing", name, l, i ? "values" : "keys"), NULL;
    if (!d || (j == 0) != !strcmp(d, "u32"))
        return ctx_fail(c, CINFER_EUNSUPPORTED, "prompt cache: tensor %s is %s; it must be %s", name, t->dtype,
                        j == 0 ? "U32 (packed codes)" : "F32, F16 or BF16"), NULL;
    if (t->ndim != 4 || t->shape[0] != 1)
        return ctx_fail(c, CINFER_EFORMAT, "prompt cache: tensor %s is not [1, kv_heads, tokens, %d]", name, width), NULL;
    if (t->shape[1] != kc->n_kv)
        return ctx_fail(c, CINFER_EFORMAT, "prompt cache: tensor %s has %lld KV heads, the model %d", name, (long long)t->shape[1], kc->n_kv), NULL;
    if (t->shape[3] != width)
        return ctx_fail(c, CINFER_EFORMAT, "prompt cache: tensor %s has %lld columns; the model's head_dim %d makes %d", name,
                        (long long)t->shape[3], kc->head_dim, width), NULL;
    *st = CINFER_OK;
    return t;
}

/* ring order -> temporal order (RotatingKVCache._temporal_order) into a malloc'd [n_kv][T][hd] */
static void *temporal(const st_tensor *t, const pc_layer *pl) {
    size_t el = st_dtype_size(t->dtype), T = (size_t)t->shape[2], hd = (size_t)t->shape[3], row = hd * el;
    char *out = malloc(t->nbytes + 1);
    if (!out) return NULL;
    for (int64_t h = 0; h < t->shape[1]; h++) {
        const char *src = (const char *)t->data + h * T * row;
        char *dst = out + h * T * row;
        size_t keep = (size_t)pl->keep, idx = (size_t)pl->idx;
        memcpy(dst, src, keep * row);
        memcpy(dst + keep * row, src + idx * row, (T - idx) * row);
        memcpy(dst + (keep + T - idx) * row, src + keep * row, (idx - keep) * row);
    }
    return out;
}

static cinfer_status decode_layers(cinfer_ctx *c, int seq, const st_set *ss, json_t *meta) {
    int nl = c->m->cfg.n_layer, n_cls = 0, tokens = -1;
    const char *k;
    json_t *v;
    json_object_foreach(meta, k, v) n_cls += k[0] == '2' && k[1] == '.';
    if (n_cls != nl) return ctx_fail(c, CINFER_EFORMAT, "prompt cache: the file has %d cache layers, the model %d", n_cls, nl);
    pc_layer pl;
    cinfer_status st;
    cinfer_snapshot snap = {0};
    json_t *root = json_pack("{s:s, s:i, s:i}", "format", "cinfer-kv", "version", 1, "tokens", 0), *layers = json_array();
    snap.tensors = calloc((size_t)nl * 2 * KV_MAX_PARTS, sizeof *snap.tensors);
    void **owned = calloc((size_t)nl * 2, sizeof *owned);
    st = root && layers && snap.tensors && owned ? CINFER_OK : ctx_fail(c, CINFER_ENOMEM, "prompt cache: out of memory");
    for (int l = 0; !st && l < nl; l++) {
        int keep, window = kv_group_window(c->layer_group[l], &keep), hd = c->layer_cache[l]->head_dim, at = snap.n_tensors;
        if ((st = class_kind(c, meta, l, &pl))) break;
        int np = pl.quant ? 3 : 1;
        const st_tensor *t[2][KV_MAX_PARTS];
        for (int j = 0; j < np && !st; j++)
            for (int i = 0; i < 2 && !st; i++)
                t[i][j] = layer_tensor(c, ss, l, i, pl.quant ? j : -1, !pl.quant ? hd : j ? hd / pl.group : hd * pl.bits / 32, &st);
        if (st) break;
        int T = (int)t[0][0]->shape[2], same = 1;
        for (int j = 0; j < np; j++) same &= t[0][j]->shape[2] == T && t[1][j]->shape[2] == T && !strcmp(t[0][j]->dtype, t[1][j]->dtype);
        if (!same) {
            st = ctx_fail(c, CINFER_EFORMAT, "prompt cache: layer %d's keys and values differ in length or dtype", l);
            break;
        }
        if (pl.quant && (window || pl.offset != T)) {
            st = ctx_fail(c, CINFER_EFORMAT, "prompt cache: layer %d: a QuantizedKVCache of offset %d holds %d tokens%s", l,
                          pl.offset, T, window ? " and this context keeps a window (--max-kv-size): run without it" : "");
            break;
        }
        if (!pl.rotating && window) {
            st = ctx_fail(c, CINFER_EFORMAT, "prompt cache: the file holds full KVCache layers; this context keeps a window "
                          "(--max-kv-size %d): run without --max-kv-size", window);
            break;
        }
        if (pl.rotating && (!window || pl.keep != keep || pl.max_size != window)) {
            st = ctx_fail(c, CINFER_EFORMAT, "prompt cache: layer %d is a RotatingKVCache(max_size %d, keep %d); this context's "
                          "layer is %s%d, keep %d: pass --max-kv-size %d", l, pl.max_size, pl.keep,
                          window ? "a window of max_size " : "full (max_size ", window, keep, pl.max_size);
            break;
        }
        int offset = pl.rotating ? pl.offset : T, sinks = 0, run = 0;
        if (pl.rotating && (pl.idx > T || pl.keep > T || pl.idx < pl.keep || T > offset ||
                            (pl.idx < T && T != pl.max_size))) {
            st = ctx_fail(c, CINFER_EFORMAT, "prompt cache: layer %d: RotatingKVCache meta state (keep %d, max_size %d, "
                          "offset %d, _idx %d) does not fit its %d stored tokens", l, pl.keep, pl.max_size, pl.offset, pl.idx, T);
            break;
        }
        if (T < offset) sinks = pl.keep, run = offset - (T - pl.keep);
        if (run && run <= keep) { st = ctx_fail(c, CINFER_EFORMAT, "prompt cache: layer %d: inconsistent ring", l); break; }
        if (tokens >= 0 && offset != tokens) {
            st = ctx_fail(c, CINFER_EFORMAT, "prompt cache: layers disagree on the token count (%d vs %d)", offset, tokens);
            break;
        }
        tokens = offset;
        for (int j = 0; j < np; j++)
            for (int i = 0; i < 2; i++) {
                cinfer_tensor *o = &snap.tensors[snap.n_tensors++];
                char nm[48] = {0};   /* "L.i" or "L.i.j", at most 13 characters for the layer counts cinfer takes */
                if (pl.quant) snprintf(nm, sizeof nm, "%d.%d.%d", l, i, j);
                else snprintf(nm, sizeof nm, "%d.%d", l, i);
                memcpy(o->name, nm, sizeof o->name - 1);
                o->dtype = dt_of_st(t[i][j]->dtype);
                o->ndim = 4;
                memcpy(o->shape, t[i][j]->shape, sizeof o->shape);
                o->bytes = t[i][j]->nbytes;
                o->data = (void *)t[i][j]->data;
                if (pl.rotating && pl.idx < T && !(o->data = owned[2 * l + i] = temporal(t[i][j], &pl))) st = CINFER_ENOMEM;
            }
        json_t *e = json_pack("{s:i, s:s, s:s, s:i, s:i, s:i, s:i, s:i, s:i, s:i}", "layer", l, "kind", pl.quant ? "quant" : "dense",
                              "dtype", snap.tensors[at].dtype, "n_kv", c->layer_cache[l]->n_kv, "head_dim",
                              c->layer_cache[l]->head_dim, "window", window, "keep", keep, "sinks", sinks, "run", run,
                              "offset", offset);
        if (st || !e || json_array_append_new(layers, e)) st = ctx_fail(c, CINFER_ENOMEM, "prompt cache: out of memory");
    }
    if (!st && (json_object_set_new(root, "tokens", json_integer(tokens)) || json_object_set(root, "layers", layers) ||
                !(snap.header = json_dumps(root, JSON_COMPACT))))
        st = ctx_fail(c, CINFER_ENOMEM, "prompt cache: out of memory");
    if (!st) st = cinfer_seq_restore(c, seq, &snap);
    for (int i = 0; owned && i < 2 * nl; i++) free(owned[i]);
    free(owned);
    free(snap.tensors);
    free(snap.header);
    json_decref(layers);
    json_decref(root);
    return st;
}

cinfer_status cinfer_prompt_cache_decode(cinfer_ctx *c, int seq, const void *buf, size_t len, char **user_meta_json,
                                         int *fingerprinted) {
    if (user_meta_json) *user_meta_json = NULL;
    int fpd = 0;
    if (fingerprinted) *fingerprinted = 0;
    if (seq < 0 || seq >= c->n_seq) return ctx_fail(c, CINFER_EINVAL, "prompt cache: no sequence %d", seq);
    cinfer_seq_free(c, seq);
    st_set ss;
    memset(&ss, 0, sizeof ss);
    char err[400];
    cinfer_status st = st_open_mem("prompt cache", buf, len, &ss, err, sizeof err);
    if (st) { st_close(&ss); return ctx_fail(c, st, "%s", err); }
    json_error_t je;
    json_t *meta = ss.metadata ? json_loads(ss.metadata, 0, &je) : NULL;
    if (!meta) st = ctx_fail(c, CINFER_EFORMAT, "prompt cache: the file has no __metadata__ (not an mlx-lm prompt cache)");
    if (!st) st = check_fp(c, meta, &fpd);
    if (!st) st = decode_layers(c, seq, &ss, meta);
    if (!st && user_meta_json) {
        json_t *u = json_object();
        const char *k;
        json_t *v;
        json_object_foreach(meta, k, v) if (u && k[0] == '1' && k[1] == '.') json_object_set(u, k + 2, v);
        if (!u || !(*user_meta_json = json_dumps(u, JSON_COMPACT | JSON_PRESERVE_ORDER))) st = ctx_fail(c, CINFER_ENOMEM, "out of memory");
        json_decref(u);
    }
    if (st) cinfer_seq_free(c, seq);
    else if (fingerprinted) *fingerprinted = fpd;
    json_decref(meta);
    st_close(&ss);
    return st;
}

cinfer_status cinfer_prompt_cache_load(cinfer_ctx *c, int seq, const char *path, char **user_meta_json, int *fingerprinted) {
    char *buf = NULL, err[512];
    size_t len = 0;
    if (user_meta_json) *user_meta_json = NULL;
    cinfer_status st = cf_read_file(path, &buf, &len, err, sizeof err);
    if (st) return ctx_fail(c, st, "prompt cache: %s", err);
    st = cinfer_prompt_cache_decode(c, seq, buf, len, user_meta_json, fingerprinted);
    if (st) {
        char msg[sizeof c->err];
        snprintf(msg, sizeof msg, "%s", c->err);
        ctx_fail(c, st, "%s: %s", path, msg);
    }
    free(buf);
    return st;
}
