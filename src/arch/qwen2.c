/*
 * qwen2.c — HF model_type "qwen2" (Qwen2, Qwen2.5): the llama block with
 * biases on the q/k/v projections (always present; o_proj has none).
 * sliding_window is used only when use_sliding_window is true, and then only
 * by layers from max_window_layers on (transformers' default 28).
 * Reference: transformers models/qwen2/modeling_qwen2.py.
 */
#include "arch/arch.h"

static void qwen2_adjust(model_config *c) {
    c->attention_bias = 1;
    c->mlp_bias = 0;
}

static int qwen2_layer_window(const model_config *c, int l) {
    return l >= (c->max_window_layers >= 0 ? c->max_window_layers : 28) ? c->sliding_window : 0;
}

const arch_def arch_qwen2 = {"qwen2", .adjust = qwen2_adjust, .layer_window = qwen2_layer_window};
