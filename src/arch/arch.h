/*
 * arch.h — model configuration, weights and the per-architecture table.
 *
 * Each HF model_type has one file (llama.c, mistral.c, qwen2.c, qwen3.c,
 * gemma2.c, gemma3.c) that registers an arch_def: which options of the shared
 * decoder blocks it uses (blocks.c), its hooks, and how its tensors are named. The registry (arch.c) maps
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
    be_mat ffn_norm;          /* [1][hidden] (Gemma: pre_feedforward_layernorm) */
    be_mat post_attn_norm;    /* [1][hidden] Gemma's post_attention_layernorm (sandwich_norm), else data NULL */
    be_mat post_ffn_norm;     /* [1][hidden] Gemma's post_feedforward_layernorm (sandwich_norm), else data NULL */
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
    float *inv_freq_local;    /* [rot_dims/2] sliding layers' RoPE (Gemma 3's local base), NULL: inv_freq */
    unsigned char *local;     /* [n_layer] 1: the layer uses inv_freq_local; NULL: none does */
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

/* the hooks, with the llama family's defaults; arch_adjust also resolves the
 * config fields an arch left "not given" (softcaps) to "none" */
void arch_adjust(const arch_def *a, model_config *cfg);
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

/* The steps the blocks are composed of (blocks.c). Norms scale by (w + cfg->norm_add). */
typedef struct blk_bufs {    /* a forward's scratch (block_scratch_floats), carved by blk_carve */
    float *xn, *tmp;         /* [T][hidden] */
    float *q, *att;          /* [T][n_head*hd] */
    float *k, *v;            /* [T][n_kv*hd] */
    float *gate, *up;        /* [T][ffn] */
} blk_bufs;
blk_bufs blk_carve(const model_config *cfg, int n_tokens, float *scratch);
const be_mat *blk_opt(const be_mat *m);   /* m, or NULL when it has no data (an absent bias/norm) */
/* the attention descriptor of a batch: scale (query_pre_attn_scalar^-1/2 when
 * given, else hd^-1/2), softcap, RoPE; each layer's group fills paging and mask */
be_attn blk_attn(const model_config *cfg, const model_weights *w, const block_batch *bb);
/* s->att = attention over norm(x) of a layer: projections, q/k norms, the cache's RoPE, write, attend */
void blk_attend(const be_ops *be, be_ctx *bc, const model_config *cfg, const layer_weights *lw, kv_group *g, kv_cache *kc,
                be_attn *a, int n_tokens, const float *x, const blk_bufs *s);
/* s->gate = act(gate(norm(x))) * up(norm(x)) (cfg->act) */
void blk_mlp_in(const be_ops *be, be_ctx *bc, const model_config *cfg, const layer_weights *lw, int n_tokens, const float *x,
                const blk_bufs *s);
/* x += post(t . w^T + b): a branch's output projection and residual add, through a
 * post-norm (Gemma) when post is not NULL; tmp [T][w->rows] scratch */
void blk_branch_out(const be_ops *be, be_ctx *bc, const model_config *cfg, const float *t, int n_tokens, const be_mat *w,
                    const be_mat *b, const be_mat *post, float *x, float *tmp);
/* one decoder layer: attend, its output (+ post-norm), the MLP (+ post-norm); the
 * post-norms are the layer's when bound (Gemma's sandwich), a is the layer's descriptor */
void blk_layer(const be_ops *be, be_ctx *bc, const model_config *cfg, const layer_weights *lw, kv_group *g, kv_cache *kc,
               be_attn *a, int n_tokens, float *x, const blk_bufs *s);

/* the sliding layers of a Gemma config (gemma2.c): layer_types when given, else
 * every layer but each pattern-th (sliding_window_pattern, else def_pattern) */
int gemma_layer_sliding(const model_config *cfg, int l, int def_pattern);

/* RoPE inverse frequencies for cfg (default/linear/llama3 scaling); theta > 0
 * overrides cfg's base and drops its scaling (Gemma 3's local layers) */
float *rope_inv_freq(const model_config *cfg, float theta, int *rot_dims);
#endif
