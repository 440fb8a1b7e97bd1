/*
 * config.h — model_config, what config.json (+ generation_config.json) says
 * about a model, read by config.c. The reader knows no architecture: the
 * model layer looks model_type up in the arch registry and lets the arch
 * adjust the fields it alone understands.
 */
#ifndef CINFER_CONFIG_H
#define CINFER_CONFIG_H
#include <stddef.h>
#include "cinfer.h"

enum { ROPE_DEFAULT = 0, ROPE_LINEAR, ROPE_LLAMA3, ROPE_DYNAMIC };

typedef struct model_config {
    char model_type[32];
    int hidden, n_layer, n_head, n_kv_head, head_dim, ffn, n_vocab, max_pos;
    float eps;
    float rope_theta;
    int rope_type;            /* ROPE_* */
    float rope_factor, rope_low_freq, rope_high_freq;
    int rope_orig_max_pos;
    float partial_rotary;     /* fraction of head_dim rotated (1.0) */
    int tie_embeddings;
    int attention_bias;       /* q/k/v biases */
    int o_bias;               /* bias on o_proj (llama/mistral attention_bias) */
    int mlp_bias;             /* biases on gate/up/down */
    int qk_norm;              /* RMSNorm over head_dim on q and k before RoPE */
    int sliding_window;       /* 0 = none (mistral may set one) */
    int max_window_layers;    /* qwen2: layers from this index on use the window (-1: not given) */
    int bos;                  /* -1 unknown */
    struct quant_config *quant; /* config.json's quantization block (io/quant-config.h), NULL: none;
                                   owned by the model, set after config_load */
    int n_eos;
    int eos[8];
} model_config;

/* config.json (+ generation_config.json) -> cfg. known(model_type) (may be
 * NULL) says whether the caller handles the type; an unknown one is refused
 * first, naming the `supported` list, before any field is read. */
cinfer_status config_load(const char *dir, int (*known)(const char *model_type), const char *supported,
                          model_config *cfg, char *err, size_t n);
#endif
