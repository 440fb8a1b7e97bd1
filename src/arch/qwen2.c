/*
 * qwen2.c — HF model_type "qwen2" (Qwen2, Qwen2.5): the llama block with
 * biases on the q/k/v projections (always present; o_proj has none).
 * sliding_window is used only when use_sliding_window is true.
 * Reference: transformers models/qwen2/modeling_qwen2.py.
 */
#include "arch/arch.h"

static void qwen2_adjust(model_config *c) {
    c->attention_bias = 1;
    c->mlp_bias = 0;
}

const arch_def arch_qwen2 = {"qwen2", qwen2_adjust};
