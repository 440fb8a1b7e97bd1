/*
 * kvquant.c — a context's quantized-KV scheme (cinfer_ctx_opts kv_bits,
 * kv_group_size, kv_config, quantized_kv_start, kv_kernels): which layers
 * quantize, with which bits and group, through which kernel set, and when
 * (mlx-lm's maybe_quantize_kv_cache: after the forward that brings a
 * sequence to quantized_kv_start tokens, every pending layer's held pages
 * are quantized in place of its dense ones; start -1: from the first write).
 */
#include <jansson.h>
#include <string.h>
#include "engine/engine.h"
#include "quant/affine.h"
#include "util.h"

static cinfer_status parse_config(cinfer_ctx *c, const char *json, char *err, size_t n) {
    int nl = c->m->cfg.n_layer;
    json_error_t je;
    const char *t = json + strspn(json, " \t\r\n");
    int file = *t != '[';
    json_t *root = file ? json_load_file(json, 0, &je) : json_loads(json, 0, &je);
    if (!root || !json_is_array(root)) {
        json_decref(root);
        return cf_err(err, n, CINFER_EINVAL, "kv_config%s%s: %s%s", file ? " file " : "", file ? json : "",
                      root ? "not a JSON list" : "not JSON: ", root ? "" : je.text);
    }
    for (size_t i = 0; i < json_array_size(root); i++) {
        json_t *e = json_array_get(root, i), *g = json_object_get(e, "group_size");
        json_int_t l = -1, bits = 0, group = 64;
        if (!json_is_object(e) || json_unpack(e, "{s:I, s:I}", "layer_idx", &l, "bits", &bits) ||
            (g && !json_is_integer(g))) {
            json_decref(root);
            return cf_err(err, n, CINFER_EINVAL, "kv_config: entry %zu is not {\"layer_idx\": int, \"bits\": int, "
                          "\"group_size\": int (optional)}", i);
        }
        if (g) group = json_integer_value(g);
        if (l < 0 || l >= nl || !aq_valid((int)bits, (int)group)) {
            json_decref(root);
            return cf_err(err, n, CINFER_EINVAL, "kv_config: entry %zu (layer_idx %lld, bits %lld, group_size %lld): the "
                          "layer must be in [0, %d), bits 2, 3, 4, 5, 6 or 8, group_size 32, 64 or 128", i,
                          (long long)l, (long long)bits, (long long)group, nl);
        }
        c->kvq_bits[l] = (int)bits;
        c->kvq_group[l] = (int)group;
    }
    json_decref(root);
    return CINFER_OK;
}

cinfer_status ctx_kvq_options(cinfer_ctx *c, const cinfer_ctx_opts *o, char *err, size_t n) {
    const model_config *cfg = &c->m->cfg;
    int bits = o ? o->kv_bits : 0, group = o && o->kv_group_size ? o->kv_group_size : 64;
    const char *conf = o ? o->kv_config : NULL, *kern = o ? o->kv_kernels : NULL;
    c->kvq_start = o ? o->quantized_kv_start : 0;
    if (!bits && !conf) {
        if (kern) return cf_err(err, n, CINFER_EINVAL, "kv_kernels '%s' without a quantized KV cache (kv_bits or kv_config)", kern);
        return CINFER_OK;
    }
    if (bits && conf) return cf_err(err, n, CINFER_EINVAL, "kv_bits and kv_config both given: a cache takes one scheme");
    if (c->kvq_start < -1)
        return cf_err(err, n, CINFER_EINVAL, "quantized_kv_start %d: must be >= 0, or -1 (quantized from the first write)",
                      c->kvq_start);
    if (!c->m->be->kvq_write || !c->m->be->kvq_attention)
        return cf_err(err, n, CINFER_EUNSUPPORTED, "the %s backend has no quantized KV kernels", c->m->be->name);
    c->kvq_bits = calloc((size_t)cfg->n_layer, sizeof *c->kvq_bits);
    c->kvq_group = calloc((size_t)cfg->n_layer, sizeof *c->kvq_group);
    if (!c->kvq_bits || !c->kvq_group) return cf_err(err, n, CINFER_ENOMEM, "out of memory");
    if (bits) {
        if (!aq_valid(bits, group))
            return cf_err(err, n, CINFER_EINVAL, "KV quantization of %d bits, group %d: bits must be 2, 3, 4, 5, 6 or 8 and "
                          "the group size 32, 64 or 128", bits, group);
        for (int l = 0; l < cfg->n_layer; l++) c->kvq_bits[l] = bits, c->kvq_group[l] = group;
    } else {
        cinfer_status st = parse_config(c, conf, err, n);
        if (st) return st;
    }
    if (!kern) c->kvq_kernels = bits ? KV_UNFUSED : KV_TILED_CAUSAL;
    else if (!strcmp(kern, "unfused")) c->kvq_kernels = KV_UNFUSED;
    else if (!strcmp(kern, "tiled-causal")) c->kvq_kernels = KV_TILED_CAUSAL;
    else if (!strcmp(kern, "tiled")) c->kvq_kernels = KV_TILED;
    else return cf_err(err, n, CINFER_EINVAL, "kv_kernels '%s' is not one of unfused, tiled-causal, tiled", kern);
    for (int l = 0; l < cfg->n_layer; l++) {
        if (!c->kvq_bits[l]) continue;
        if (c->kvq_kernels != KV_UNFUSED && c->kvq_bits[l] != 4 && c->kvq_bits[l] != 8)
            return cf_err(err, n, CINFER_EINVAL, "the tiled KV kernels take 4- and 8-bit caches with group 32, 64 or 128 "
                          "and f32, bf16 or f16 queries; layer %d asks for %d-bit (use kv_kernels unfused)", l,
                          c->kvq_bits[l]);
        if (c->kvq_kernels != KV_UNFUSED && cfg->attn_softcap > 0)
            return cf_err(err, n, CINFER_EINVAL, "the tiled KV kernels do not take softcapped attention (this model's "
                          "attn_logit_softcapping is %g); use kv_kernels unfused", (double)cfg->attn_softcap);
        if (cfg->head_dim % c->kvq_group[l])
            return cf_err(err, n, CINFER_EINVAL, "KV quantization of layer %d: head_dim %d is not divisible by the group "
                          "size %d", l, cfg->head_dim, c->kvq_group[l]);
        c->kvq_pending++;
    }
    return CINFER_OK;
}

kv_cache *ctx_kvq_layer(cinfer_ctx *c, int l) {
    const model_config *cfg = &c->m->cfg;
    if (c->kvq_bits && c->kvq_bits[l] && c->kvq_start < 0)
        return kv_quant_new(c->m->be, c->bc, cfg->n_kv_head, cfg->head_dim, c->kvq_bits[l], c->kvq_group[l], c->kv_dt,
                            c->kv_page, c->kvq_kernels);
    return kv_dense_new(c->m->be, c->bc, cfg->n_kv_head, cfg->head_dim, c->kv_dt, c->kv_page);
}


cinfer_status ctx_kvq_convert(cinfer_ctx *c, int now) {
    if (c->kvq_start < 0 || !c->kvq_pending) return CINFER_OK;
    const model_config *cfg = &c->m->cfg;
    int longest = 0;
    for (int g = 0; g < c->n_groups; g++) {
        int len = kv_group_max_len(c->groups[g]);
        longest = len > longest ? len : longest;
    }
    if (!now && (longest < c->kvq_start || longest == 0)) return CINFER_OK;
    for (int l = 0; l < cfg->n_layer; l++) {
        if (!c->kvq_bits[l] || strcmp(c->layer_cache[l]->vt->kind, "dense")) continue;
        kv_group *g = c->layer_group[l];
        int i = 0;
        while (kv_group_layer(g, i) != c->layer_cache[l]) i++;
        kv_cache *q = kv_quant_new(c->m->be, c->bc, cfg->n_kv_head, cfg->head_dim, c->kvq_bits[l], c->kvq_group[l],
                                   c->kv_dt, c->kv_page, c->kvq_kernels);
        if (!q || kv_group_convert(g, i, q))
            return ctx_fail(c, CINFER_ENOMEM, "out of memory converting layer %d's KV cache to %d-bit", l, c->kvq_bits[l]);
        c->layer_cache[l] = kv_group_layer(g, i);
        c->kvq_pending--;
    }
    return CINFER_OK;
}
