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
/* the MLP's gate activation (the backend's BE_ACT_* values) */
enum { ACT_SILU = 1, ACT_GELU_TANH = 2 };
/* longest layer_types list read (a config with more layers and a list is refused) */
#define CFG_MAX_LAYER_TYPES 512

typedef struct model_config {
    char model_type[32];
    int hidden, n_layer, n_head, n_kv_head, head_dim, ffn, n_vocab, max_pos;
    float eps;
    float rope_theta;
    int rope_type;            /* ROPE_* */
    float rope_factor, rope_low_freq, rope_high_freq;
    int rope_orig_max_pos;
    float partial_rotary;     /* fraction of head_dim rotated (1.0) */
    int tie_embeddings;       /* -1 not given in config.json (arch_adjust resolves it) */
    int attention_bias;       /* q/k/v biases */
    int o_bias;               /* bias on o_proj (llama/mistral attention_bias) */
    int mlp_bias;             /* biases on gate/up/down */
    int qk_norm;              /* RMSNorm over head_dim on q and k before RoPE */
    int sliding_window;       /* 0 = none (mistral may set one) */
    int max_window_layers;    /* qwen2: layers from this index on use the window (-1: not given) */
    int act;                  /* ACT_*: hidden_activation, else hidden_act (silu when neither) */
    float attn_scalar;        /* query_pre_attn_scalar (0: not given): attention scale attn_scalar^-1/2 */
    float attn_softcap;       /* attn_logit_softcapping: -1 not given, 0 null, else the cap */
    float final_softcap;      /* final_logit_softcapping: the same */
    float rope_local_theta;   /* RoPE base of sliding layers (rope_local_base_freq or rope_parameters
                               * .sliding_attention.rope_theta); 0: not given */
    int sliding_pattern;      /* sliding_window_pattern (0: not given) */
    char layer_types[CFG_MAX_LAYER_TYPES + 1]; /* per layer 's' sliding_attention, 'f' full_attention; "" not given */
    /* set by the architecture (arch adjust), not read from the file */
    float norm_add;           /* every RMSNorm scales by (w + norm_add): 1 for Gemma's (1 + w) */
    float embed_scale;        /* input embeddings times this (0: none) */
    int sandwich_norm;        /* norms after attention and the MLP too (Gemma 2/3 naming) */
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
