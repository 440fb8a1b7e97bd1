/*
 * gemma3.c — HF model_type "gemma3_text" (Gemma 3's text model): Gemma 2's
 * sandwich block (blocks.c, as gemma2.c) with RMSNorm (1 + w) over head_dim
 * on q and k after projection and before RoPE, no softcaps unless the config
 * gives them, and two RoPE tables: sliding layers use the local base
 * (rope_local_base_freq, or rope_parameters.sliding_attention, default 10000,
 * unscaled), global layers rope_theta with its scaling. Layer i is global iff
 * layer_types says "full_attention", or, without layer_types, iff
 * (i + 1) % sliding_window_pattern == 0 (default 6).
 * Reference: transformers models/gemma3/modeling_gemma3.py (Gemma3TextModel).
 */
#include <math.h>
#include <stdlib.h>
#include "arch/arch.h"
#include "util.h"

static void gemma3_adjust(model_config *c) {
    c->norm_add = 1.0f;
    c->embed_scale = sqrtf((float)c->hidden);
    c->sandwich_norm = 1;
    c->qk_norm = 1;
    if (c->tie_embeddings < 0) c->tie_embeddings = 1;   /* Gemma3TextConfig's default */
    c->o_bias = c->attention_bias;
    c->mlp_bias = 0;
    if (!(c->attn_scalar > 0)) c->attn_scalar = 256.0f;
    if (!(c->rope_local_theta > 0)) c->rope_local_theta = 10000.0f;
}

static int gemma3_layer_window(const model_config *c, int l) {
    return gemma_layer_sliding(c, l, 6) ? c->sliding_window : 0;
}

/* the llama-layout binder (sandwich norms, q/k norms), then the local RoPE table */
static cinfer_status gemma3_bind(const model_config *c, const st_set *st, const char *dir, model_weights *w, char *err, size_t n) {
    cinfer_status s = weights_bind(c, st, dir, w, err, n);
    if (s) return s;
    int rd;
    w->inv_freq_local = rope_inv_freq(c, c->rope_local_theta, &rd);
    w->local = calloc((size_t)c->n_layer, 1);
    if (!w->inv_freq_local || !w->local) {
        weights_free(w);
        return cf_err(err, n, CINFER_ENOMEM, "out of memory");
    }
    for (int l = 0; l < c->n_layer; l++) w->local[l] = (unsigned char)gemma_layer_sliding(c, l, 6);
    return CINFER_OK;
}

const arch_def arch_gemma3 = {"gemma3_text", .adjust = gemma3_adjust, .layer_window = gemma3_layer_window,
                              .bind = gemma3_bind};
