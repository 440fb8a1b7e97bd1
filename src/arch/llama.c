/*
 * llama.c — HF model_type "llama" (Llama 2, Llama 3, TinyLlama, ...):
 * pre-norm decoder, RMSNorm, GQA attention with rotate-half RoPE (default,
 * linear or llama3 scaling), SwiGLU MLP. attention_bias (q/k/v/o) and
 * mlp_bias (gate/up/down) come from config.json. The forward itself is the shared decoder block (blocks.c).
 * Reference: transformers models/llama/modeling_llama.py.
 */
#include "arch/arch.h"

static void llama_adjust(model_config *c) {
    c->sliding_window = 0;         /* llama has no sliding window */
    c->o_bias = c->attention_bias; /* LlamaAttention puts the bias on all four projections */
}

const arch_def arch_llama = {"llama", .adjust = llama_adjust};
