/*
 * qwen3.c — HF model_type "qwen3": the llama block with RMSNorm over
 * head_dim on q and k after projection and before RoPE (q_norm, k_norm), an
 * explicit head_dim that need not equal hidden/heads, and no q/k/v bias
 * unless attention_bias says so.
 * Reference: transformers models/qwen3/modeling_qwen3.py.
 */
#include "arch/arch.h"

static void qwen3_adjust(model_config *c) {
    c->qk_norm = 1;
    c->o_bias = c->attention_bias;   /* Qwen3Attention: o_proj bias follows attention_bias */
    c->mlp_bias = 0;
}

const arch_def arch_qwen3 = {"qwen3", .adjust = qwen3_adjust};
