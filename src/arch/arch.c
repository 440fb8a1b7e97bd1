/*
 * arch.c — the architecture registry, the llama-family weight binder and the
 * RoPE frequency table. Tensor names follow Hugging Face's
 * model.layers.N.{self_attn,mlp}.*; every tensor is checked for presence,
 * dtype (F32/F16/BF16) and shape before the model is usable.
 * MLX-quantized modules (mlx-lm's loader rule: a module is quantized when
 * config.json's quantization block has an entry for its path, or when
 * "<path>.scales" exists) bind "<path>.weight" (packed uint32 codes),
 * "<path>.scales" and "<path>.biases" as one affine be_mat; a tied head then
 * uses the quantized embedding as its linear layer.
 * RoPE scaling follows transformers' modeling_rope_utils (default, linear,
 * llama3), computed in float32 as transformers does.
 */
#include <math.h>
#include <stdio.h>
#include <string.h>
#include "arch/arch.h"
#include "io/quant-config.h"
#include "quant/affine.h"
#include "util.h"

extern const arch_def arch_llama, arch_mistral, arch_qwen2, arch_qwen3, arch_gemma2, arch_gemma3;
static const arch_def *const registry[] = {&arch_llama, &arch_mistral, &arch_qwen2, &arch_qwen3, &arch_gemma2, &arch_gemma3};

const arch_def *arch_find(const char *model_type) {
    for (size_t i = 0; i < sizeof registry / sizeof *registry; i++)
        if (!strcmp(registry[i]->model_type, model_type)) return registry[i];
    return NULL;
}

const char *arch_supported(void) { return "llama, mistral, qwen2, qwen3, gemma2, gemma3_text"; }

typedef struct binder {
    const model_config *cfg;
    const st_set *st;
    const char *dir;
    char *err;
    size_t n;
    cinfer_status status;
    model_weights *w;     /* every bound matrix is listed in w->mats */
} binder;

static void shape_str(const st_tensor *t, char *got, size_t n) {
    got[0] = 0;
    for (int i = 0, k = 0; i < t->ndim && k < (int)n - 16; i++)
        k += snprintf(got + k, n - (size_t)k, "%s%lld", i ? ", " : "", (long long)t->shape[i]);
}

/* the scales or biases of an affine module: dtype F32/F16/BF16, shape [rows][cols/group] */
static const st_tensor *bind_side(binder *b, const char *wfile, const char *path, const char *what, int64_t rows, int64_t ng,
                                  be_dtype *dt) {
    char nm[200], got[96];
    snprintf(nm, sizeof nm, "%s.%s", path, what);
    const st_tensor *t = st_find(b->st, nm);
    if (!t) {
        b->status = cf_err(b->err, b->n, CINFER_EFORMAT, "%s: quantized module '%s' (packed '%s.weight' here) has no tensor '%s'",
                           wfile, path, path, nm);
        return NULL;
    }
    const char *file = b->st->paths[t->file];
    if (!be_dtype_from_st(t->dtype, dt)) {
        b->status = cf_err(b->err, b->n, CINFER_EUNSUPPORTED, "%s: tensor '%s' has dtype %s (supported: F32, F16, BF16)", file, nm, t->dtype);
        return NULL;
    }
    if (t->ndim != 2 || t->shape[0] != rows || t->shape[1] != ng) {
        shape_str(t, got, sizeof got);
        b->status = cf_err(b->err, b->n, CINFER_EFORMAT, "%s: tensor '%s' has shape [%s], expected [%lld, %lld] (one per group)", file,
                           nm, got, (long long)rows, (long long)ng);
        return NULL;
    }
    return t;
}

/* binds an MLX-quantized module: <path>.weight uint32 [rows][cols*bits/32] + scales + biases */
static void bind_affine(binder *b, be_mat *m, const char *name, const char *path, int64_t rows, int64_t cols, int bits,
                        int group) {
    const st_tensor *t = st_find(b->st, name), *s, *bs;
    char got[96];
    if (!t) { b->status = cf_err(b->err, b->n, CINFER_EFORMAT, "%s: missing tensor '%s'", b->dir, name); return; }
    const char *file = b->st->paths[t->file];
    if (strcmp(t->dtype, "U32")) {
        b->status = cf_err(b->err, b->n, CINFER_EFORMAT, "%s: tensor '%s' of quantized module '%s' has dtype %s, expected U32 (packed %d-bit codes)",
                           file, name, path, t->dtype, bits);
        return;
    }
    if (cols % group) {
        b->status = cf_err(b->err, b->n, CINFER_EFORMAT, "%s: tensor '%s': input dimension %lld is not divisible by group_size %d", file,
                           name, (long long)cols, group);
        return;
    }
    if (t->ndim != 2 || t->shape[0] != rows || t->shape[1] != cols * bits / 32) {
        shape_str(t, got, sizeof got);
        b->status = cf_err(b->err, b->n, CINFER_EFORMAT,
                           "%s: tensor '%s' has packed shape [%s], which disagrees with %d bits: expected [%lld, %lld] (%lld values x %d bits / 32)",
                           file, name, got, bits, (long long)rows, (long long)(cols * bits / 32), (long long)cols, bits);
        return;
    }
    be_dtype sdt, bdt;
    if (!(s = bind_side(b, file, path, "scales", rows, cols / group, &sdt)) ||
        !(bs = bind_side(b, file, path, "biases", rows, cols / group, &bdt)))
        return;
    if (sdt != bdt) {
        b->status = cf_err(b->err, b->n, CINFER_EFORMAT, "%s: '%s.scales' is %s but '%s.biases' is %s", file, path, s->dtype, path, bs->dtype);
        return;
    }
    be_dtype_affine(bits, &m->dt);
    m->data = t->data;
    m->rows = rows;
    m->cols = cols;
    m->scales = s->data;
    m->biases = bs->data;
    m->sdt = sdt;
    m->group = group;
    if (b->w->n_mats < b->w->cap_mats) b->w->mats[b->w->n_mats++] = m;
}

/* 1 when the 2-D weight `name` belongs to a quantized module (mlx-lm's rule), with its bits and group */
static int quantized(binder *b, const char *name, char *path, size_t pn, int *bits, int *group) {
    size_t l = strlen(name);
    if (l < 8 || strcmp(name + l - 7, ".weight") || l - 7 >= pn) return 0;
    memcpy(path, name, l - 7);
    path[l - 7] = 0;
    quant_config *q = b->cfg->quant;
    const qc_module *e = qc_find(q, path);
    if (e) {
        *bits = e->bits;
        *group = e->group;
        return !e->skip;
    }
    char sn[200];
    snprintf(sn, sizeof sn, "%s.scales", path);
    if (!st_find(b->st, sn)) return 0;
    if (!q) {
        b->status = cf_err(b->err, b->n, CINFER_EFORMAT, "%s: tensor '%s' exists but config.json has no \"quantization\" block (bits, group_size)",
                           b->dir, sn);
        return 0;
    }
    *bits = q->bits;
    *group = q->group;
    return 1;
}

/* rows == 0 means a 1-D tensor of `cols` elements */
static void bind(binder *b, be_mat *m, const char *name, int64_t rows, int64_t cols, int required) {
    memset(m, 0, sizeof *m);
    if (b->status) return;
    char path[160];
    int bits = 0, group = 0;
    if (rows && quantized(b, name, path, sizeof path, &bits, &group)) {
        bind_affine(b, m, name, path, rows, cols, bits, group);
        return;
    }
    if (b->status) return;
    const st_tensor *t = st_find(b->st, name);
    if (!t) {
        if (required) b->status = cf_err(b->err, b->n, CINFER_EFORMAT, "%s: missing tensor '%s'", b->dir, name);
        return;
    }
    const char *file = b->st->paths[t->file];
    if (!be_dtype_from_st(t->dtype, &m->dt)) {
        b->status = cf_err(b->err, b->n, CINFER_EUNSUPPORTED, "%s: tensor '%s' has dtype %s (supported: F32, F16, BF16)", file, name, t->dtype);
        return;
    }
    int ok = rows ? (t->ndim == 2 && t->shape[0] == rows && t->shape[1] == cols) : (t->ndim == 1 && t->shape[0] == cols);
    if (!ok) {
        char got[96] = "", exp[48];
        for (int i = 0, k = 0; i < t->ndim && k < 80; i++)
            k += snprintf(got + k, sizeof got - k, "%s%lld", i ? ", " : "", (long long)t->shape[i]);
        if (rows) snprintf(exp, sizeof exp, "[%lld, %lld]", (long long)rows, (long long)cols);
        else snprintf(exp, sizeof exp, "[%lld]", (long long)cols);
        b->status = cf_err(b->err, b->n, CINFER_EFORMAT, "%s: tensor '%s' has shape [%s], expected %s", file, name, got, exp);
        return;
    }
    m->data = t->data;
    m->rows = rows ? rows : 1;
    m->cols = cols;
    if (!b->status && b->w->n_mats < b->w->cap_mats) b->w->mats[b->w->n_mats++] = m;
}

cinfer_status weights_bind(const model_config *c, const st_set *st, const char *dir, model_weights *w, char *err, size_t n) {
    memset(w, 0, sizeof *w);
    binder b = {c, st, dir, err, n, CINFER_OK, w};
    w->cap_mats = 3 + (int)(sizeof(layer_weights) / sizeof(be_mat)) * c->n_layer;
    w->mats = calloc((size_t)w->cap_mats, sizeof *w->mats);
    if (!w->mats) return cf_err(err, n, CINFER_ENOMEM, "out of memory");
    int64_t H = c->hidden, hd = c->head_dim, qd = (int64_t)c->n_head * hd, kvd = (int64_t)c->n_kv_head * hd;
    bind(&b, &w->tok_embd, "model.embed_tokens.weight", c->n_vocab, H, 1);
    bind(&b, &w->out_norm, "model.norm.weight", 0, H, 1);
    if (c->tie_embeddings || !st_find(st, "lm_head.weight")) {
        if (!c->tie_embeddings && !b.status)
            b.status = cf_err(err, n, CINFER_EFORMAT, "%s: missing tensor 'lm_head.weight' (tie_word_embeddings is false)", dir);
        w->lm_head = w->tok_embd;   /* a copy of the handle: prepared with tok_embd, not listed twice */
    } else {
        bind(&b, &w->lm_head, "lm_head.weight", c->n_vocab, H, 1);
    }
    w->layers = calloc((size_t)c->n_layer, sizeof *w->layers);
    if (!w->layers) return cf_err(err, n, CINFER_ENOMEM, "out of memory");
    char name[160];
#define L(field, suffix, rows, cols, req)                                             \
    snprintf(name, sizeof name, "model.layers.%d.%s", i, suffix);                     \
    bind(&b, &lw->field, name, rows, cols, req)
    for (int i = 0; i < c->n_layer && !b.status; i++) {
        layer_weights *lw = &w->layers[i];
        L(attn_norm, "input_layernorm.weight", 0, H, 1);
        L(wq, "self_attn.q_proj.weight", qd, H, 1);
        L(wk, "self_attn.k_proj.weight", kvd, H, 1);
        L(wv, "self_attn.v_proj.weight", kvd, H, 1);
        L(wo, "self_attn.o_proj.weight", H, qd, 1);
        L(bo, "self_attn.o_proj.bias", 0, H, c->o_bias);
        L(bq, "self_attn.q_proj.bias", 0, qd, c->attention_bias);
        L(bk, "self_attn.k_proj.bias", 0, kvd, c->attention_bias);
        L(bv, "self_attn.v_proj.bias", 0, kvd, c->attention_bias);
        L(q_norm, "self_attn.q_norm.weight", 0, hd, c->qk_norm);
        L(k_norm, "self_attn.k_norm.weight", 0, hd, c->qk_norm);
        if (c->sandwich_norm) {
            L(post_attn_norm, "post_attention_layernorm.weight", 0, H, 1);
            L(ffn_norm, "pre_feedforward_layernorm.weight", 0, H, 1);
            L(post_ffn_norm, "post_feedforward_layernorm.weight", 0, H, 1);
        } else {
            L(ffn_norm, "post_attention_layernorm.weight", 0, H, 1);
        }
        L(w_gate, "mlp.gate_proj.weight", c->ffn, H, 1);
        L(w_up, "mlp.up_proj.weight", c->ffn, H, 1);
        L(w_down, "mlp.down_proj.weight", H, c->ffn, 1);
        L(b_gate, "mlp.gate_proj.bias", 0, c->ffn, c->mlp_bias);
        L(b_up, "mlp.up_proj.bias", 0, c->ffn, c->mlp_bias);
        L(b_down, "mlp.down_proj.bias", 0, H, c->mlp_bias);
    }
#undef L
    const qc_module *un = b.status ? NULL : qc_unused(c->quant);
    if (un)
        b.status = cf_err(err, n, CINFER_EFORMAT, "%s: %s has an entry for '%s', which names no module of this %s model", c->quant->file,
                          c->quant->key, un->path, c->model_type);
    if (!b.status) {
        w->inv_freq = rope_inv_freq(c, 0.0f, &w->rot_dims);
        if (!w->inv_freq) b.status = cf_err(err, n, CINFER_ENOMEM, "out of memory");
    }
    if (b.status) weights_free(w);
    return b.status;
}

void weights_free(model_weights *w) {
    if (!w) return;
    free(w->layers);
    free(w->mats);
    free(w->inv_freq);
    free(w->inv_freq_local);
    free(w->local);
    memset(w, 0, sizeof *w);
}

float *rope_inv_freq(const model_config *c, float theta, int *rot_dims) {
    int type = theta > 0 ? ROPE_DEFAULT : c->rope_type;
    if (!(theta > 0)) theta = c->rope_theta;
    int rd = (int)(c->head_dim * c->partial_rotary);
    rd -= rd % 2;
    *rot_dims = rd;
    float *f = malloc(sizeof(float) * (size_t)(rd / 2 > 0 ? rd / 2 : 1));
    if (!f) return NULL;
    for (int i = 0; i < rd / 2; i++) {
        float inv = 1.0f / powf(theta, (float)(2 * i) / (float)rd);
        if (type == ROPE_LINEAR) {
            inv /= c->rope_factor;
        } else if (type == ROPE_LLAMA3) {
            float old = (float)(c->rope_orig_max_pos ? c->rope_orig_max_pos : 8192);
            float low_wl = old / c->rope_low_freq, high_wl = old / c->rope_high_freq;
            float wl = 2.0f * (float)M_PI / inv;
            if (wl > low_wl) {
                inv /= c->rope_factor;
            } else if (wl >= high_wl) {
                float smooth = (old / wl - c->rope_low_freq) / (c->rope_high_freq - c->rope_low_freq);
                inv = (1.0f - smooth) * inv / c->rope_factor + smooth * inv;
            }
        }
        f[i] = inv;
    }
    return f;
}

int arch_layer_window(const arch_def *a, const model_config *cfg, int l) {
    return a->layer_window ? a->layer_window(cfg, l) : cfg->sliding_window;
}

int arch_known(const char *model_type) { return arch_find(model_type) != NULL; }

void arch_adjust(const arch_def *a, model_config *cfg) {
    if (a->adjust) a->adjust(cfg);
    if (cfg->tie_embeddings < 0) cfg->tie_embeddings = 0;
    if (cfg->attn_softcap < 0) cfg->attn_softcap = 0;
    if (cfg->final_softcap < 0) cfg->final_softcap = 0;
}

cinfer_status arch_bind(const arch_def *a, const model_config *cfg, const st_set *st, const char *dir,
                        model_weights *w, char *err, size_t n) {
    return (a->bind ? a->bind : weights_bind)(cfg, st, dir, w, err, n);
}

cinfer_status arch_forward(const arch_def *a, const be_ops *be, be_ctx *bc, const model_config *cfg,
                           const model_weights *w, kv_group *const *groups, kv_cache *const *caches,
                           const block_batch *bb, float *x, float *scratch) {
    return (a->forward ? a->forward : block_forward)(be, bc, cfg, w, groups, caches, bb, x, scratch);
}

size_t arch_scratch_floats(const arch_def *a, const model_config *cfg, int n_tokens) {
    return (a->scratch_floats ? a->scratch_floats : block_scratch_floats)(cfg, n_tokens);
}
