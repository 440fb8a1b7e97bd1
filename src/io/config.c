/*
 * config.c — config.json and generation_config.json -> model_config.
 *
 * Accepts both RoPE spellings: transformers-4 `rope_theta` + `rope_scaling`
 * ({"type"|"rope_type": "linear"|"llama3"|...}) and transformers-5
 * `rope_parameters` ({"rope_theta", "rope_type", ...}, or one such object per
 * layer type), and Gemma's fields (layer_types or sliding_window_pattern,
 * softcaps, query_pre_attn_scalar, rope_local_base_freq), which the
 * architecture interprets (its adjust hook). Every required field
 * is checked for presence, type and range; a message names the file and field.
 * eos ids come from generation_config.json when present (int or list), else
 * from config.json.
 */
#include <jansson.h>
#include <math.h>
#include <string.h>
#include "io/config.h"
#include "util.h"

typedef struct cfgp {
    const char *path;
    json_t *root;
    char *err;
    size_t n;
    cinfer_status st;
} cfgp;

static int get_int(cfgp *p, const char *key, int def, int required, int lo, int *out) {
    json_t *v = json_object_get(p->root, key);
    if (!v || json_is_null(v)) {
        if (required) { p->st = cf_err(p->err, p->n, CINFER_EFORMAT, "%s: missing required field \"%s\"", p->path, key); return 0; }
        *out = def;
        return 1;
    }
    if (!json_is_integer(v) || json_integer_value(v) < lo || json_integer_value(v) > (1 << 30)) {
        p->st = cf_err(p->err, p->n, CINFER_EFORMAT, "%s: field \"%s\" must be an integer >= %d", p->path, key, lo);
        return 0;
    }
    *out = (int)json_integer_value(v);
    return 1;
}

static int get_num(cfgp *p, json_t *obj, const char *key, float def, float *out) {
    json_t *v = json_object_get(obj, key);
    if (!v || json_is_null(v)) { *out = def; return 1; }
    if (!json_is_number(v)) {
        p->st = cf_err(p->err, p->n, CINFER_EFORMAT, "%s: field \"%s\" must be a number", p->path, key);
        return 0;
    }
    *out = (float)json_number_value(v);
    return 1;
}

static int get_bool(json_t *obj, const char *key, int def) {
    json_t *v = json_object_get(obj, key);
    return json_is_boolean(v) ? json_is_true(v) : def;
}

static void read_eos(json_t *v, model_config *c) {
    if (json_is_integer(v)) {
        c->n_eos = 1;
        c->eos[0] = (int)json_integer_value(v);
    } else if (json_is_array(v)) {
        c->n_eos = 0;
        size_t i;
        json_t *e;
        json_array_foreach(v, i, e) if (json_is_integer(e) && c->n_eos < 8) c->eos[c->n_eos++] = (int)json_integer_value(e);
    }
}

/* rope_scaling (t4) or rope_parameters (t5) object; t5 writes one object per
 * layer type where they differ (Gemma 3): full_attention's is the model's
 * RoPE, sliding_attention's base the local one (unscaled, as transformers
 * builds it) */
static int parse_rope(cfgp *p, const char *key, json_t *rs, model_config *c) {
    if (!rs || json_is_null(rs)) return 1;
    if (!json_is_object(rs)) {   /* a string or number here is not a scaling cinfer can apply */
        p->st = cf_err(p->err, p->n, CINFER_EFORMAT, "%s: field \"%s\" must be an object ({\"rope_type\": ..., \"factor\": ...})", p->path, key);
        return 0;
    }
    json_t *full = json_object_get(rs, "full_attention"), *slide = json_object_get(rs, "sliding_attention");
    if (json_is_object(full) || json_is_object(slide)) {
        if (json_is_object(slide)) {
            json_t *t = json_object_get(slide, "rope_type");
            if (json_is_string(t) && strcmp(json_string_value(t), "default")) {
                p->st = cf_err(p->err, p->n, CINFER_EUNSUPPORTED, "%s: %s.sliding_attention: RoPE type \"%s\" is not supported for sliding layers (default)",
                               p->path, key, json_string_value(t));
                return 0;
            }
            if (!get_num(p, slide, "rope_theta", c->rope_local_theta, &c->rope_local_theta)) return 0;
            if (!(c->rope_local_theta > 0 && isfinite(c->rope_local_theta))) {
                p->st = cf_err(p->err, p->n, CINFER_EFORMAT, "%s: %s.sliding_attention.rope_theta must be a finite number > 0", p->path, key);
                return 0;
            }
        }
        return json_is_object(full) ? parse_rope(p, key, full, c) : 1;
    }
    json_t *t = json_object_get(rs, "rope_type");
    if (!json_is_string(t)) t = json_object_get(rs, "type");
    const char *ty = json_is_string(t) ? json_string_value(t) : "default";
    if (!get_num(p, rs, "rope_theta", c->rope_theta, &c->rope_theta)) return 0;
    if (!strcmp(ty, "default")) c->rope_type = ROPE_DEFAULT;
    else if (!strcmp(ty, "linear")) c->rope_type = ROPE_LINEAR;
    else if (!strcmp(ty, "llama3")) c->rope_type = ROPE_LLAMA3;
    else {
        p->st = cf_err(p->err, p->n, CINFER_EUNSUPPORTED, "%s: RoPE scaling type \"%s\" is not supported (default, linear, llama3)", p->path, ty);
        return 0;
    }
    if (!get_num(p, rs, "factor", 1.0f, &c->rope_factor) || !get_num(p, rs, "low_freq_factor", 1.0f, &c->rope_low_freq) ||
        !get_num(p, rs, "high_freq_factor", 4.0f, &c->rope_high_freq))
        return 0;
    json_t *om = json_object_get(rs, "original_max_position_embeddings");
    if (json_is_integer(om)) c->rope_orig_max_pos = (int)json_integer_value(om);
    if (c->rope_type != ROPE_DEFAULT && !(c->rope_factor > 0)) {
        p->st = cf_err(p->err, p->n, CINFER_EFORMAT, "%s: RoPE scaling factor must be > 0", p->path);
        return 0;
    }
    return 1;
}

/* values cinfer would run wrong rather than refuse: NaN/inf logits from
 * eps <= 0 or theta <= 0 (theta^(-2i/d)), a RoPE buffer overrun from
 * partial_rotary_factor > 1, an activation that is not the SiLU the blocks
 * implement. Checked after rope_parameters/rope_scaling, which may set theta. */
static int check_ranges(cfgp *p, model_config *c) {
    const char *bad = NULL;
    double v = 0;
    if (!(c->eps > 0 && isfinite(c->eps))) { bad = "rms_norm_eps must be a finite number > 0"; v = c->eps; }
    else if (!(c->rope_theta > 0 && isfinite(c->rope_theta))) { bad = "rope_theta must be a finite number > 0"; v = c->rope_theta; }
    else if (!(c->partial_rotary > 0 && c->partial_rotary <= 1)) { bad = "partial_rotary_factor must be in (0, 1]"; v = c->partial_rotary; }
    if (bad) { p->st = cf_err(p->err, p->n, CINFER_EFORMAT, "%s: %s (got %g)", p->path, bad, v); return 0; }
    /* transformers' Gemma configs name it hidden_activation; it wins over hidden_act */
    const char *keys[] = {"hidden_activation", "hidden_act"};
    c->act = ACT_SILU;
    for (int i = 0; i < 2; i++) {
        json_t *a = json_object_get(p->root, keys[i]);
        if (!a || json_is_null(a)) continue;
        const char *v = json_is_string(a) ? json_string_value(a) : "";
        if (!strcmp(v, "silu") || !strcmp(v, "swish")) c->act = ACT_SILU;
        else if (!strcmp(v, "gelu_pytorch_tanh")) c->act = ACT_GELU_TANH;
        else {
            p->st = cf_err(p->err, p->n, CINFER_EUNSUPPORTED, "%s: %s \"%s\" is not supported (gated MLPs with \"silu\" or \"gelu_pytorch_tanh\")",
                           p->path, keys[i], json_is_string(a) ? v : "(not a string)");
            return 0;
        }
        break;
    }
    return 1;
}

/* a softcap: -1 absent, 0 null (none), else a finite number > 0 */
static int get_cap(cfgp *p, const char *key, float *out) {
    json_t *v = json_object_get(p->root, key);
    *out = !v ? -1.0f : 0.0f;
    if (!v || json_is_null(v)) return 1;
    if (!json_is_number(v) || !(json_number_value(v) > 0) || !isfinite(json_number_value(v))) {
        p->st = cf_err(p->err, p->n, CINFER_EFORMAT, "%s: field \"%s\" must be a number > 0 or null", p->path, key);
        return 0;
    }
    *out = (float)json_number_value(v);
    return 1;
}

/* layer_types: one "sliding_attention" / "full_attention" per layer */
static int get_layer_types(cfgp *p, model_config *c) {
    json_t *lt = json_object_get(p->root, "layer_types");
    if (!lt || json_is_null(lt)) return 1;
    if (!json_is_array(lt) || json_array_size(lt) != (size_t)c->n_layer || c->n_layer > CFG_MAX_LAYER_TYPES) {
        p->st = cf_err(p->err, p->n, CINFER_EFORMAT, "%s: field \"layer_types\" must list one type per layer (%d, at most %d)",
                       p->path, c->n_layer, CFG_MAX_LAYER_TYPES);
        return 0;
    }
    for (int i = 0; i < c->n_layer; i++) {
        const char *t = json_string_value(json_array_get(lt, (size_t)i));
        if (t && !strcmp(t, "sliding_attention")) c->layer_types[i] = 's';
        else if (t && !strcmp(t, "full_attention")) c->layer_types[i] = 'f';
        else {
            p->st = cf_err(p->err, p->n, CINFER_EUNSUPPORTED, "%s: layer_types[%d] is %s%s%s (supported: \"sliding_attention\", \"full_attention\")",
                           p->path, i, t ? "\"" : "", t ? t : "not a string", t ? "\"" : "");
            return 0;
        }
    }
    return 1;
}

cinfer_status config_load(const char *dir, int (*known)(const char *model_type), const char *supported,
                          model_config *c, char *err, size_t n) {
    memset(c, 0, sizeof *c);
    char *path = cf_path(dir, "config.json");
    if (!path) return cf_err(err, n, CINFER_ENOMEM, "out of memory");
    cfgp p = {path, NULL, err, n, CINFER_OK};
    char *txt = NULL;
    size_t len;
    p.st = cf_read_file(path, &txt, &len, err, n);
    if (p.st) goto out;
    json_error_t je;
    p.root = json_loadb(txt, len, 0, &je);
    if (!p.root || !json_is_object(p.root)) {
        p.st = p.root ? cf_err(err, n, CINFER_EFORMAT, "%s: not a JSON object", path)
                      : cf_err(err, n, CINFER_EFORMAT, "%s: malformed JSON at line %d: %s", path, je.line, je.text);
        goto out;
    }
    json_t *mt = json_object_get(p.root, "model_type");
    if (!json_is_string(mt)) { p.st = cf_err(err, n, CINFER_EFORMAT, "%s: missing \"model_type\"", path); goto out; }
    snprintf(c->model_type, sizeof c->model_type, "%s", json_string_value(mt));
    if (known && !known(c->model_type)) {
        p.st = cf_err(err, n, CINFER_EUNSUPPORTED, "%s: unknown model_type \"%s\" (supported: %s)", path,
                      json_string_value(mt), supported ? supported : "");
        goto out;
    }
    if (!get_int(&p, "hidden_size", 0, 1, 1, &c->hidden) || !get_int(&p, "num_hidden_layers", 0, 1, 1, &c->n_layer) ||
        !get_int(&p, "num_attention_heads", 0, 1, 1, &c->n_head) ||
        !get_int(&p, "num_key_value_heads", c->n_head, 0, 1, &c->n_kv_head) ||
        !get_int(&p, "intermediate_size", 0, 1, 1, &c->ffn) || !get_int(&p, "vocab_size", 0, 1, 1, &c->n_vocab) ||
        !get_int(&p, "max_position_embeddings", 2048, 0, 1, &c->max_pos) ||
        !get_int(&p, "head_dim", c->hidden / c->n_head, 0, 1, &c->head_dim) ||
        !get_int(&p, "sliding_window", 0, 0, 0, &c->sliding_window) || !get_int(&p, "bos_token_id", -1, 0, 0, &c->bos) ||
        !get_int(&p, "max_window_layers", -1, 0, 0, &c->max_window_layers) ||
        !get_int(&p, "sliding_window_pattern", 0, 0, 1, &c->sliding_pattern) || !get_layer_types(&p, c) ||
        !get_cap(&p, "attn_logit_softcapping", &c->attn_softcap) || !get_cap(&p, "final_logit_softcapping", &c->final_softcap))
        goto out;
    if (c->n_head % c->n_kv_head) {
        p.st = cf_err(err, n, CINFER_EFORMAT, "%s: num_attention_heads %d is not a multiple of num_key_value_heads %d", path, c->n_head, c->n_kv_head);
        goto out;
    }
    float eps;
    if (!get_num(&p, p.root, "rms_norm_eps", 1e-6f, &eps) || !get_num(&p, p.root, "rope_theta", 10000.0f, &c->rope_theta) ||
        !get_num(&p, p.root, "partial_rotary_factor", 1.0f, &c->partial_rotary) ||
        !get_num(&p, p.root, "query_pre_attn_scalar", 0.0f, &c->attn_scalar) ||
        !get_num(&p, p.root, "rope_local_base_freq", 0.0f, &c->rope_local_theta))
        goto out;
    if (c->attn_scalar < 0 || !isfinite(c->attn_scalar) || c->rope_local_theta < 0 || !isfinite(c->rope_local_theta)) {
        p.st = cf_err(err, n, CINFER_EFORMAT, "%s: query_pre_attn_scalar and rope_local_base_freq must be finite numbers > 0", path);
        goto out;
    }
    c->eps = eps;
    c->rope_factor = 1.0f;
    if (!parse_rope(&p, "rope_parameters", json_object_get(p.root, "rope_parameters"), c) ||
        !parse_rope(&p, "rope_scaling", json_object_get(p.root, "rope_scaling"), c) || !check_ranges(&p, c))
        goto out;
    c->tie_embeddings = get_bool(p.root, "tie_word_embeddings", -1);   /* -1: not given (the arch decides) */
    c->attention_bias = get_bool(p.root, "attention_bias", 0);
    c->mlp_bias = get_bool(p.root, "mlp_bias", 0);
    read_eos(json_object_get(p.root, "eos_token_id"), c);
    if (!get_bool(p.root, "use_sliding_window", 1)) c->sliding_window = 0;

    /* generation_config.json overrides bos/eos when present */
    char *gpath = cf_path(dir, "generation_config.json");
    if (gpath && cf_file_exists(gpath)) {
        json_t *g = json_load_file(gpath, 0, &je);
        if (!g) {
            p.st = cf_err(err, n, CINFER_EFORMAT, "%s: malformed JSON at line %d: %s", gpath, je.line, je.text);
        } else {
            read_eos(json_object_get(g, "eos_token_id"), c);
            json_t *b = json_object_get(g, "bos_token_id");
            if (json_is_integer(b)) c->bos = (int)json_integer_value(b);
            json_decref(g);
        }
    }
    free(gpath);
out:
    json_decref(p.root);
    free(txt);
    free(path);
    return p.st;
}
