/*
 * engine.h — the internals behind the public handles: a model (config,
 * mapped weights, backend, tokenizer) and a context (backend context,
 * per-layer caches, scratch). Shared by model.c, ctx.c, generate.c and the
 * scoring code.
 */
#ifndef CINFER_ENGINE_H
#define CINFER_ENGINE_H
#include "arch/arch.h"
#include "cinfer.h"

struct cinfer_model {
    char *dir;
    model_config cfg;
    const arch_def *arch;
    st_set st;
    model_weights w;
    const be_ops *be;
    be_ctx *bc;             /* owns device copies of the weights (CUDA) */
    int n_threads;
    cinfer_tokenizer *tok;  /* NULL when the dir has none */
    char dtype_name[8];
    char weight_types[96];  /* cinfer_model_info.weight_types */
    int64_t n_params;
    int32_t eos[8];
};

struct cinfer_ctx {
    cinfer_model *m;
    be_ctx *bc;
    /* the state layer: groups of layers with one cache policy, each sharing
     * one page table per sequence (src/cache/cache.h) */
    kv_budget budget;
    int n_seq;                /* sequences 0..n_seq-1 */
    int n_groups;
    kv_group **groups;        /* [n_groups] */
    kv_group **layer_group;   /* [n_layer] the group of each layer */
    kv_cache **layer_cache;   /* [n_layer] each layer's storage (owned by its group) */
    be_dtype kv_dt;
    int kv_page, max_kv;
    int prefill_step;         /* cinfer_generate's prompt step (mlx-lm's prefill_step_size) */
    /* quantized KV (kvquant.c): each layer's scheme, NULL / bits 0 = stays dense */
    int *kvq_bits, *kvq_group;   /* [n_layer] */
    int kvq_start;               /* quantized_kv_start: -1 = quantized from the first write */
    int kvq_pending;             /* layers still dense that will convert */
    kv_kernels kvq_kernels;
    /* backend buffers, grown on demand to the largest batch seen */
    size_t cap_tokens;      /* tokens the buffers below hold */
    float *x;               /* [cap_tokens][hidden] */
    float *scratch;         /* [block_scratch_floats(cap_tokens)] */
    size_t cap_out;         /* rows the logits buffers hold (OUT_CHUNK, or more: ctx_reserve_out) */
    float *xo;              /* [cap_out][hidden] gathered rows */
    float *lo;              /* [cap_out][n_vocab] backend logits */
    int head_folded;        /* the last scoring forward folded the LM head into the score op
                             * (be_ops.score_head): xo holds its rows, lo nothing */
    int *out_idx;           /* [cap_out] hidden-state row of each logits row (host) */
    /* host arrays for one call */
    int *pos;               /* [cap_tokens] */
    int32_t *ids;           /* [cap_tokens] */
    int cap_rows;
    int *rows;              /* [3][cap_rows]: lengths, start positions, sequences */
    char err[512];
};

/* the quantized-KV scheme of opts (kvquant.c): parse and validate */
cinfer_status ctx_kvq_options(cinfer_ctx *c, const cinfer_ctx_opts *o, char *err, size_t n);
/* layer l's storage at creation: quantized (start -1) or dense */
kv_cache *ctx_kvq_layer(cinfer_ctx *c, int l);
/* after a forward: converts the pending layers once a sequence reaches the start
 * (now: at once, e.g. before a quantized cache file is restored) */
cinfer_status ctx_kvq_convert(cinfer_ctx *c, int now);

/* sets the context's message (printf-style) and returns s */
cinfer_status ctx_fail(cinfer_ctx *c, cinfer_status s, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

/* cinfer_eval of the last position reduced to its greedy token on the
 * device (backends with an argmax op): decode copies back a token, not a
 * vocabulary row. */
cinfer_status ctx_eval_greedy(cinfer_ctx *c, const int32_t *ids, int n, int32_t *tok);
/* greedy decoding of sequence 0 from tok: up to n steps, each step's token passed to on_token (non-zero
 * stops). Where the backend keeps argmax results on the device (argmax_take) and the cache can drop a
 * position, each step is issued before the token of the one before is read back (the device feeds it), so
 * the host's work hides behind the device's; a step issued past the stop is dropped. */
cinfer_status ctx_greedy_run(cinfer_ctx *c, int32_t tok, long n, int (*on_token)(void *user, int32_t tok), void *user);
/* one decode step of B rows (one token each, extending sequences seqs[b] at their ends);
 * tok[b] = each row's greedy next token, computed on the backend (argmax op) */
cinfer_status ctx_decode_greedy(cinfer_ctx *c, const int32_t *ids, int B, const int *seqs, int32_t *tok);

/* A scoring forward: the LM head's logits stay in the backend and each chunk of
 * them is reduced there by be_ops.score; only per-position results cross. */
typedef struct ctx_score_req {
    const int32_t *tgt;          /* [n_out] target token of each output row */
    const be_score_base *base;   /* NULL, or the base of the outputs (idx[n_out], relative to this call) */
    uint16_t *codes;             /* NULL, or backend memory: output row i's 16-bit code at codes + i * code_stride */
    size_t code_stride;
    be_score_row *out;           /* [n_out] host results */
    int materialize;             /* 1: the logits go to c->lo and be_ops.score, never be_ops.score_head */
    int rows_only;               /* 1: the forward stops at the output rows' normed hidden states in c->xo and
                                  * nothing is scored or waited for (a folding head, n_out within the logits
                                  * buffers): ctx_score_again scores them, after another context's forward
                                  * has run beside this one */
} ctx_score_req;

/* whether c's scoring forwards fold its LM head into the score op (be_ops.score_head) for a
 * request against base (NULL: none; a base head: its x may be any non-NULL placeholder) */
int ctx_head_folds(const cinfer_ctx *c, const be_score_base *base);

/* grows the logits buffers to hold `rows` output rows at once (a scoring forward of at most
 * that many outputs runs its LM head in one chunk and leaves every row's logits in c->lo) */
cinfer_status ctx_reserve_out(cinfer_ctx *c, size_t rows);
/* cinfer_forward with the logits reduced on the backend (sr->out), or, sr NULL, computed
 * and left in c->lo (the benchmark's "forward with logits at every position") */
cinfer_status ctx_forward_score(cinfer_ctx *c, const int32_t *ids, int B, int L, const int *lens, const int *pos0,
                                const int *out_rows, int n_out, const ctx_score_req *sr);
/* be_ops.score once more over the logits the last scoring forward left in c->lo, or
 * be_ops.score_head over its rows in c->xo when it folded the head (n_out rows; KL of a
 * context against itself reads them as the base too) */
cinfer_status ctx_score_again(cinfer_ctx *c, int n_out, const ctx_score_req *sr);
/* sr->out NULL above (a folded head, a backend with score_take): the op is issued and its results
 * stay with the backend; this waits for them and writes out[n_out] */
cinfer_status ctx_score_take(cinfer_ctx *c, int n_out, be_score_row *out);

#endif
