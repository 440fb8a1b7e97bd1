/*
 * cpu.h — internals of the CPU backend shared by its files: the thread pool,
 * the backend context, and the matmul entry point (matmul.c) that ops.c's
 * table points at. Work is split as (ith, nth) over the pool; the calling
 * thread is worker 0.
 */
#ifndef CINFER_CPU_H
#define CINFER_CPU_H
#include "backend/backend.h"

typedef void (*cpu_task_fn)(void *arg, int ith, int nth);
typedef struct cpu_pool cpu_pool;

cpu_pool *cpu_pool_new(int n_threads);       /* NULL on failure */
void cpu_pool_free(cpu_pool *p);
int cpu_pool_size(const cpu_pool *p);
/* runs fn(arg, i, n) for i in [0, n) across the pool; returns when all are done */
void cpu_pool_run(cpu_pool *p, cpu_task_fn fn, void *arg);

struct be_ctx {
    cpu_pool *pool;
    int n_threads;
    float *scratch;        /* [scratch_n] per-call f32 workspace (weight conversion for GEMM) */
    size_t scratch_n;
    float *att;            /* [n_threads][att_n] attention score rows */
    size_t att_n;
    int batch_inv;         /* be_ops.batch_invariant: every row through the per-row paths (GEMV kernels,
                            * per-query attention, unsplit key ranges), bit for bit whatever the batch */
    int prefill_act;       /* be_ops.prefill_act: BE_ACT_AUTO, _F32 or _BF16 (matmul.c's bf16_act) */
};

/* y[n][m] = x[n][k] . w[m][k]^T (+ bias): GEMV kernels for small n (any n in batch-invariant mode),
 * OpenBLAS for large n */
void cpu_matmul(be_ctx *c, const float *x, int n, const be_mat *w, const be_mat *bias, float *y);
/* be_ops.matmul_multi: y[i] = x . w[i]^T (+ bias[i]); for few tokens one pool
 * run over the rows of all the matrices (same cols and dtype), else one
 * cpu_matmul each */
void cpu_matmul_multi(be_ctx *c, const float *x, int n, int count, const be_mat *const *w, const be_mat *const *bias,
                      float *const *y);
/* converts row r of w (any dtype) to f32 dst[cols] */
void cpu_mat_row_f32(const be_mat *w, int64_t r, float *dst);

/* be_ops.kvq_attention (attention-kvq.c): from the codes, GQA heads in one pass, within
 * float rounding of be_ref_kvq_attention (either kernel) */
void cpu_kvq_attention(be_ctx *c, const be_attn *a, const float *q, const be_kvq *k, const be_kvq *v, int kernel,
                       float *out);

/* scalar references (ref.c): the definitions the fast ops are tested against */
void be_ref_matmul(const float *x, int n, const be_mat *w, const be_mat *bias, float *y);
void be_ref_rmsnorm(const float *x, int n, int dim, const be_mat *w, float w_add, float eps, float *y);
void be_ref_rope(float *x, int n, int heads, int hd, int rot_dims, const int *pos,
                 const float *inv_freq, int neox);
void be_ref_glu(const float *gate, const float *up, float *out, size_t n, int act);
void be_ref_softcap(float *x, size_t n, float cap);
void be_ref_attention(const be_attn *a, const float *q, const void *k, const void *v,
                      be_dtype kv_dt, float *out);
void be_ref_kv_write(const be_attn *a, const float *src, void *pool, be_dtype kv_dt);
/* be_ops.kvq_write and kvq_attention (ref-kvq.c) */
void be_ref_kvq_write(const be_attn *a, const float *src, const be_kvq *pool);
void be_ref_kvq_attention(const be_attn *a, const float *q, const be_kvq *k, const be_kvq *v, int kernel, float *out);
/* one query (row b, query i, head h) of be_ref_kvq_attention -> out[hd]; s[max_span], qs[2*hd] scratch */
void be_ref_kvq_query(const be_attn *a, const float *q, const be_kvq *k, const be_kvq *v, int kernel, int b, int i,
                      int h, float *s, float *qs, float *out);
/* be_ops.score for one row (base row bi; codes: that row's code or NULL) and for n rows */
/* be_ops.sample for one row (the definition in backend.h) */
void be_ref_sample_row(float *z, int V, const be_sample_row *p, const be_logit_edit *edits, be_sample_out *out);
void be_ref_score_row(const float *z, int V, int tgt, const be_score_base *base, int bi, uint16_t *codes,
                      be_score_row *o);
void be_ref_score(const float *z, int n, int V, const int32_t *tgt, const be_score_base *base, uint16_t *codes,
                  size_t code_stride, be_score_row *out);
#endif
