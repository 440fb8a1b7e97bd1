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
    int32_t eos[8];
};

struct cinfer_ctx {
    cinfer_model *m;
    be_ctx *bc;
    kv_cache **caches;      /* [n_layer] */
    int B;                  /* rows the caches hold */
    /* backend buffers, grown on demand to the largest batch seen */
    size_t cap_tokens;      /* tokens the buffers below hold */
    float *x;               /* [cap_tokens][hidden] */
    float *scratch;         /* [block_scratch_floats(cap_tokens)] */
    size_t cap_out;         /* rows the logits buffers hold */
    float *xo;              /* [cap_out][hidden] gathered rows */
    float *lo;              /* [cap_out][n_vocab] backend logits */
    /* host arrays for one call */
    int *pos;               /* [cap_tokens] */
    int32_t *ids;           /* [cap_tokens] */
    int cap_rows;
    int *rows;              /* [2][cap_rows]: lengths, start positions */
    char err[512];
};

/* cinfer_eval of the last position reduced to its greedy token on the
 * device (backends with an argmax op): decode copies back a token, not a
 * vocabulary row. */
cinfer_status ctx_eval_greedy(cinfer_ctx *c, const int32_t *ids, int n, int32_t *tok);

#endif
