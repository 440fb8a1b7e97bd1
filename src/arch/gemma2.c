/*
 * gemma2.c — HF model_type "gemma2" (Gemma 2): the sandwich block. Every
 * RMSNorm scales by (1 + w) in float32; norms before and after attention and
 * the MLP (input / post_attention / pre_feedforward / post_feedforward
 * _layernorm), the post-norms on each branch's output before its residual
 * add; GeGLU with transformers' tanh-approximated GELU; input embeddings
 * times sqrt(hidden) (a float32 constant, as transformers computes it in
 * float32 activations); attention scale query_pre_attn_scalar^-1/2; scores
 * softcapped (attn_logit_softcapping, default 50) before the mask; final
 * logits softcapped (final_logit_softcapping, default 30; ctx.c applies it).
 * Layers alternate sliding (even) and global (odd) unless layer_types says
 * otherwise; sliding layers keep only the window's pages (cache/pages.c).
 * The shared block (blocks.c) runs it: the sandwich norms are optional
 * tensors of every layer, and gemma3.c adds q/k norms and a local RoPE base
 * (per-layer tables the block picks up).
 * Reference: transformers models/gemma2/modeling_gemma2.py.
 */
#include <math.h>
#include "arch/arch.h"

/* not given in a config: transformers' Gemma2Config defaults */
static void gemma2_adjust(model_config *c) {
    c->norm_add = 1.0f;
    c->embed_scale = sqrtf((float)c->hidden);
    c->sandwich_norm = 1;
    if (c->tie_embeddings < 0) c->tie_embeddings = 1;   /* Gemma2Config's default */
    c->o_bias = c->attention_bias;   /* Gemma2Attention: attention_bias on q, k, v and o */
    c->mlp_bias = 0;
    if (!(c->attn_scalar > 0)) c->attn_scalar = 256.0f;
    if (c->attn_softcap < 0) c->attn_softcap = 50.0f;
    if (c->final_softcap < 0) c->final_softcap = 30.0f;
}

int gemma_layer_sliding(const model_config *c, int l, int def_pattern) {
    if (c->layer_types[0]) return c->layer_types[l] == 's';
    int p = c->sliding_pattern > 0 ? c->sliding_pattern : def_pattern;
    return (l + 1) % p != 0;
}

static int gemma2_layer_window(const model_config *c, int l) {
    return gemma_layer_sliding(c, l, 2) ? c->sliding_window : 0;
}

const arch_def arch_gemma2 = {"gemma2", .adjust = gemma2_adjust, .layer_window = gemma2_layer_window};
