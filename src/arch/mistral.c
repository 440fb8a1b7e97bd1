/*
 * mistral.c — HF model_type "mistral": the llama block; config.json's
 * sliding_window (null in Mistral 7B v0.2+) restricts attention to the last
 * W keys when set. No biases.
 * Reference: transformers models/mistral/modeling_mistral.py.
 */
#include "arch/arch.h"

static void mistral_adjust(model_config *c) {
    c->attention_bias = 0;
    c->mlp_bias = 0;
}

const arch_def arch_mistral = {"mistral", .adjust = mistral_adjust};
