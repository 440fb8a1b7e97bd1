/*
 * arch.h — model configuration, weights and the per-architecture table.
 *
 * Each HF model_type has one file (llama.c, mistral.c, qwen2.c, qwen3.c)
 * that registers an arch_def: which options of the shared decoder blocks it
 * uses (blocks.c) and how its tensors are named. The registry (arch.c) maps
 * config.json's model_type to a def; an unknown type is an error that names it.
 */
#ifndef CINFER_ARCH_H
#define CINFER_ARCH_H
#include "backend/backend.h"
#include "cache/cache.h"
#include "io/config.h"
#include "io/safetensors.h"

typedef struct layer_weights {
    be_mat attn_norm;         /* [1][hidden] */
    be_mat wq, wk, wv;        /* [n_head*hd][hidden], [n_kv*hd][hidden] x2 */
    be_mat bq, bk, bv;        /* [1][...] biases, data NULL when absent */
    be_mat wo;                /* [hidden][n_head*hd] */
    be_mat bo;                /* [1][hidden] o_proj bias (llama attention_bias), data NULL when absent */
    be_mat q_norm, k_norm;    /* [1][hd] when qk_norm */
    be_mat ffn_norm;          /* [1][hidden] */
    be_mat w_gate, w_up;      /* [ffn][hidden] */
    be_mat w_down;            /* [hidden][ffn] */
    be_mat b_gate, b_up, b_down; /* [1][ffn], [1][ffn], [1][hidden] when mlp_bias */
} layer_weights;

typedef struct model_weights {
    be_mat tok_embd;          /* [n_vocab][hidden] */
    be_mat out_norm;          /* [1][hidden] */
    be_mat lm_head;           /* [n_vocab][hidden]; aliases tok_embd when tied */
    layer_weights *layers;    /* [n_layer] */
    float *inv_freq;          /* [rot_dims/2] RoPE inverse frequencies after scaling */
    int rot_dims;
    be_mat **mats;            /* [n_mats] every bound matrix (what the backend prepares and releases) */
    int n_mats, cap_mats;
} model_weights;

/* a forward batch: B rows of padded length L */
typedef struct block_batch {
    int B, L;
    const int *pos0;          /* [B] */
    const int *len;           /* [B] */
    const int *pos;           /* [B*L] absolute position of every token */
} block_batch;

struct arch_def;
typedef struct arch_def {
    const char *model_type;
    /* fills config fields the generic parser cannot know (e.g. qk_norm) */
    void (*adjust)(model_config *cfg);
    /* the sliding window of layer l (0: full attention); NULL: cfg->sliding_window for every layer */
    int (*layer_window)(const model_config *cfg, int l);
    /* hooks an architecture with its own tensors or blocks sets (NULL: the llama
     * family's weights_bind, block_forward and block_scratch_floats) */
    cinfer_status (*bind)(const model_config *cfg, const st_set *st, const char *dir, model_weights *w, char *err,
                          size_t n);
    cinfer_status (*forward)(const be_ops *be, be_ctx *bc, const model_config *cfg, const model_weights *w,
                             kv_group *const *groups, kv_cache *const *caches, const block_batch *bb, float *x,
                             float *scratch);
    size_t (*scratch_floats)(const model_config *cfg, int n_tokens);
} arch_def;

/* the hooks, with the llama family's defaults */
int arch_layer_window(const arch_def *a, const model_config *cfg, int l);
cinfer_status arch_bind(const arch_def *a, const model_config *cfg, const st_set *st, const char *dir,
                        model_weights *w, char *err, size_t n);
cinfer_status arch_forward(const arch_def *a, const be_ops *be, be_ctx *bc, const model_config *cfg,
                           const model_weights *w, kv_group *const *groups, kv_cache *const *caches,
                           const block_batch *bb, float *x, float *scratch);
size_t arch_scratch_floats(const arch_def *a, const model_config *cfg, int n_tokens);

const arch_def *arch_find(const char *model_type);
int arch_known(const char *model_type);
/* comma-separated list of supported model types, for error messages */
const char *arch_supported(void);


/* binds every tensor of the llama-family layout, checking names, shapes, dtypes */
cinfer_status weights_bind(const model_config *cfg, const st_set *st, const char *dir,
                           model_weights *w, char *err, size_t n);
void weights_free(model_weights *w);

/* the decoder forward over a batch: hidden [B*L][hidden] in, out. Scratch is
 * owned by the caller (blocks.c sizes it via block_scratch_floats). */


size_t block_scratch_floats(const model_config *cfg, int n_tokens);
/* groups[l], caches[l]: layer l's cache group (which fills the paging and mask
 * fields of its attention) and storage; the step was prepared by the caller */
cinfer_status block_forward(const be_ops *be, be_ctx *bc, const model_config *cfg, const model_weights *w,
                            kv_group *const *groups, kv_cache *const *caches, const block_batch *bb, float *x,
                            float *scratch);

/* RoPE inverse frequencies for cfg (default/linear/llama3 scaling) */
float *rope_inv_freq(const model_config *cfg, int *rot_dims);
#endif
