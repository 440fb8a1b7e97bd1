/*
 * backend.h — the op table every backend implements (cpu/, cuda/).
 *
 * Model code calls these ops eagerly on activation buffers that the backend
 * allocated (host memory on the CPU, device memory on CUDA); it never touches
 * an activation buffer's bytes itself and never branches on the backend.
 * Activations are float32, row-major, outermost dim first. Weights are
 * be_mat: a [rows][cols] matrix in its stored dtype (f32/f16/bf16, or MLX
 * affine-quantized codes with per-group scales and biases), read in place
 * from the mmap on the CPU, uploaded once by mat_prepare on CUDA (which has
 * no affine kernels yet and refuses those).
 * Integer arrays (ids, positions, lengths) are always host arrays; a device
 * backend copies what it needs.
 *
 * Every op has a scalar reference in cpu/ref.c (be_ref_*) that tests compare
 * the fast versions against.
 */
#ifndef CINFER_BACKEND_H
#define CINFER_BACKEND_H

#include <math.h>
#include <stddef.h>
#include <stdint.h>

/* BE_Q2..BE_Q8: MLX affine-quantized weights of that many bits per code
 * (src/quant/affine.h), a scale and a bias per group in be_mat.sdt */
typedef enum be_dtype {
    BE_F32 = 0, BE_F16 = 1, BE_BF16 = 2,
    BE_Q2, BE_Q3, BE_Q4, BE_Q5, BE_Q6, BE_Q8,
    BE_N_DTYPES
} be_dtype;

/* Everything cinfer knows about a stored element type, one entry per type
 * (dtype.c): code that handles "any type" goes through this table, and a new
 * stored type (a packed quantized one) is one new entry plus its kernels in
 * the backends' per-type tables (indexed by be_dtype, BE_N_DTYPES long). */
typedef struct be_type_traits {
    const char *name;      /* "f32", "f16", "bf16" (also KV dtype names), "q2".."q8" */
    const char *st_name;   /* safetensors dtype: "F32", "F16", "BF16"; NULL for packed types */
    size_t size;           /* bytes per element; 0 for packed types (bits < 8 per element) */
    float (*get)(const void *p, size_t i);        /* element i as float (dense types) */
    void (*put)(void *p, size_t i, float x);      /* store, round to nearest even (dense types) */
    int bits;              /* bits per stored element (affine: per code, scales and biases extra) */
    int affine;            /* 1: packed affine codes, with be_mat.scales/biases/group/sdt */
} be_type_traits;

const be_type_traits *be_traits(be_dtype t);
/* the type a safetensors dtype names; 0 when none */
int be_dtype_from_st(const char *st_name, be_dtype *out);
/* the dense type a name ("f32", "f16", "bf16") names; 0 when none (packed types are no KV type) */
int be_dtype_from_name(const char *name, be_dtype *out);
size_t be_dtype_size(be_dtype t);
const char *be_dtype_name(be_dtype t);
/* the affine type of `bits` bits (2, 3, 4, 5, 6, 8); 0 when none */
int be_dtype_affine(int bits, be_dtype *out);

typedef struct be_mat {
    const void *data;   /* [rows][cols] host copy (mmap); always valid.
                           affine types: [rows][cols*bits/8] bytes of packed codes */
    void *dev;          /* backend copy (CUDA), NULL on the CPU */
    be_dtype dt;
    int64_t rows, cols; /* 1-D tensors (norms, biases) have rows == 1; cols = unpacked values */
    /* affine types only (traits.affine): value = scale*code + bias per group */
    const void *scales, *biases;  /* [rows][cols/group] in sdt (f32/f16/bf16) */
    be_dtype sdt;
    int group;
} be_mat;
/* bytes of the stored matrix (packed codes + scales + biases for affine types) */
size_t be_mat_bytes(const be_mat *m);

typedef struct be_ctx be_ctx;   /* backend-owned state: thread pool, handles, streams */

/* Host/device qualifier for the few inline helpers both C and CUDA code call. */
#ifdef __CUDACC__
#define BE_HD __host__ __device__
#else
#define BE_HD
#endif

/* Attention over a paged KV cache: the one descriptor every kernel reads.
 *
 * Storage. A layer's K (and V) pool is [n_pages][n_kv][page][hd] in kv_dt;
 * the key of logical position j of sequence s lives in page
 * pt[s][j / page] at slot j % page. The page table pt [n_seq][n_pt] holds
 * page ids (-1: not held) in backend memory (device memory on CUDA);
 * pt_host is the same table in host memory. Row b of the batch extends
 * sequence seq[b].
 *
 * The mask (be_span, the one rule): a query of row b at position p sees
 * the keys j <= p that are held and inside the window. A windowed cache
 * keeps `keep` sink tokens (positions < keep) and a run of recent
 * positions starting at run0[b] (>= keep); a sink j counts as if it stood
 * at virtual position j + run0[b] - keep, right before the run, so the
 * window W (0 = none) reads:  visible iff v(j) > p - W  and  j <= p.
 * keep = 0, run0 = 0 is Mistral's / HF's sliding window (p - W < j <= p);
 * keep = 4, W = N is mlx-lm's RotatingKVCache(N, keep=4) for both its
 * concatenating (multi-token) and its ring (single-token) update. */
typedef struct be_attn {
    int B, L;            /* rows, padded query length */
    int n_head, n_kv_head, head_dim;
    const int *pos0;     /* [B] position of each row's first query (host) */
    const int *len;      /* [B] true query length of each row (host) */
    float scale;
    /* paged storage (see above) */
    int page;                /* slots per page, a power of two */
    int n_pt;                /* page-table entries per sequence (row stride of pt) */
    const int32_t *pt;       /* [n_seq][n_pt] page ids in backend memory */
    const int32_t *pt_host;  /* [n_seq][n_pt] the same in host memory */
    const int *seq;          /* [B] sequence of each row (host) */
    /* the mask */
    int window;              /* 0: causal; W: see above */
    int keep;                /* sink tokens kept by a windowed cache */
    const int *run0;         /* [B] first position of the kept run (host); >= keep */
    int max_span;            /* upper bound of the keys any query of the batch sees (sizing only) */
    /* RoPE the cache applies to q and k before use (inv_freq NULL: q and k arrive rotated) */
    const int *pos;          /* [B*L] position of each query token (host) */
    const float *inv_freq;   /* [rot_dims/2] */
    int rot_dims, neox;
    /* 0: none; else each score s (after the scale) becomes softcap * tanh(s / softcap)
     * before the mask and the softmax (Gemma 2's attn_logit_softcapping) */
    float softcap;
} be_attn;

/* A quantized KV pool (one of K or V of a layer): each slot (page id, kv
 * head, position) holds head_dim MLX affine codes packed as a little-endian
 * bit stream (src/quant/affine.h; aq_row_bytes(hd, bits) bytes) and hd/group
 * scales and biases in sdt, value = scale*code + bias. Slot s of the pool is
 * be_kv_off(pt_row, page, n_kv, 1, h, j, 1): codes at s*row_bytes, scales
 * and biases at s*(hd/group). */
typedef struct be_kvq {
    void *codes;         /* [cap][n_kv][page][hd*bits/8] */
    void *scales;        /* [cap][n_kv][page][hd/group] in sdt */
    void *biases;        /* [cap][n_kv][page][hd/group] in sdt */
    int bits, group;     /* 2, 3, 4, 5, 6, 8; 32, 64, 128 (hd % group == 0) */
    be_dtype sdt;        /* f32, f16 or bf16 */
} be_kvq;

/* the quantized attention kernels (be_ops.kvq_attention) */
enum {
    BE_KVQ_UNFUSED = 0,  /* mlx-lm's quantized SDPA: q*scale, every score, a precise softmax, p.V */
    BE_KVQ_TILED = 1     /* OptiQ's tiled port: online softmax over tiles of BE_KVQ_TILE keys */
};
#define BE_KVQ_TILE 512

/* the activation of a gated MLP (norm_matmul's glu, the glu op): y = act(gate) * up */
enum { BE_ACT_SILU = 1, BE_ACT_GELU_TANH = 2 };
/* silu(g) = g / (1 + e^-g); gelu_tanh(g) = g/2 (1 + tanh(sqrt(2/pi) (g + 0.044715 g^3))),
 * transformers' gelu_pytorch_tanh, in float32 as PyTorch computes it */
static inline BE_HD float be_act(int act, float g) {
    if (act == BE_ACT_GELU_TANH) return 0.5f * g * (1.0f + tanhf(0.7978845608028654f * (g + 0.044715f * g * g * g)));
    return g / (1.0f + expf(-g));
}
/* score or logit softcapping: cap * tanh(x / cap) (cap > 0), in transformers' order of operations */
static inline BE_HD float be_softcap(float x, float cap) { return tanhf(x / cap) * cap; }

/* The one mask rule: a query at position p of a row whose kept run starts at
 * run0 sees the sinks [*s_lo, *s_hi) and the run [*r_lo, p] (either may be
 * empty: lo >= hi, r_lo > p). Every attention kernel calls this. */
static inline BE_HD void be_span(int p, int window, int keep, int run0, int *s_lo, int *s_hi, int *r_lo) {
    int lo = window ? p - window + 1 : 0;          /* first visible virtual position */
    int shift = run0 - keep;                       /* sinks stand at j + shift */
    *r_lo = lo > run0 ? lo : run0;
    *s_lo = lo - shift > 0 ? lo - shift : 0;
    *s_hi = keep < p + 1 ? keep : p + 1;
    if (*s_lo > *s_hi) *s_lo = *s_hi;
    if (*r_lo < *s_hi) *r_lo = *s_hi;              /* run0 == keep: one contiguous range */
}

/* byte offset of slot (head h, position j) of a sequence inside a pool, or
 * -1 when its page is not held; el = element size */
static inline BE_HD int64_t be_kv_off(const int32_t *pt_row, int page, int n_kv, int hd, int h, int j, int el) {
    int32_t id = pt_row[j / page];
    if (id < 0) return -1;
    return ((((int64_t)id * n_kv + h) * page) + (j % page)) * hd * el;
}

/* Scoring: the per-position statistics of perplexity, KL and response
 * log-probs, reduced from a logits row z[V] (be_ops.score; the definition is
 * be_ref_score_row in cpu/ref.c, which the CPU backend runs):
 *   lse    = max + (float)log(sum_i expf(z_i - max)), the sum in double
 *   lp     = z[tgt] - lse (f32): the target's log-prob (nll = -lp)
 *   argmax = first index of the max
 *   kld    = with a base, sum over i with lb_i > -16 of exp(lb_i) (lb_i - (z_i - lse)) in double
 *            (lb_i, z_i - lse rounded to f32 first: a model against itself gives exactly 0)
 *   code_scale, code_min: the range of the row's own 16-bit log-prob code (llama.cpp's):
 *            mx = z[argmax] - lse, min = max(min_i z_i - lse, mx - 16), scale = (mx - min) / 65535,
 *            and with codes: q_i = lp_i > min && scale > 0 ? clamp(lroundf((1 / scale) (lp_i - min))) : 0. */
typedef struct be_score_row {
    float lse, lp;
    int32_t argmax;
    float code_scale, code_min;
    double kld;
} be_score_row;

/* The base log-probs lb of the rows a score op reduces, one of three kinds (in backend memory):
 *   z != NULL: base logits, lb_i = z[idx][i] - lse[idx] (f32), lse [rows of z] on the host;
 *   x != NULL (score_head only): the base's LM head folded in the same way, its logits
 *     zb = x[idx] . w^T never stored, lb_i = zb_i - lse[idx];
 *   rec != NULL: records of the base file (score-kl.c), rec_bytes apart, each f32 scale, f32 min,
 *     8 bytes, then u16 q[V]: lb_i = scale * q_i + min (f32 multiply, then add).
 * idx[n] (host): the base row / record of each scored row. */
typedef struct be_score_base {
    const float *z;
    const float *lse;
    const unsigned char *rec;
    size_t rec_bytes;
    const int32_t *idx;
    const float *x;      /* [rows][w->cols] the base's normed hidden states */
    const be_mat *w;     /* the base's LM head */
    be_ctx *lse_of;      /* not NULL (with x; backends with score_take): lse[idx[i]] is instead row idx[i]'s lse in
                          * that context's last score_head results, kept with the backend and read there (the
                          * caller orders this op after that one: order_after) */
} be_score_base;

/* Sampling one token per row (be_ops.sample; the definition is be_ref_sample_row in cpu/ref-sample.c,
 * which the CPU backend runs). For each row of logits z[V]:
 *   1. the row's edits, in order: kind BE_EDIT_PENALTY z[t] = z[t] > 0 ? z[t] / v : z[t] * v, BE_EDIT_ADD
 *      z[t] += v (repetition / presence / frequency penalties, logit_bias); written back to z;
 *   2. NaN counts as -inf; order = logit descending, then id ascending (key = order-preserving bits);
 *      best = the first; n_top >= 0: lse = z[best] + (float)log(sum_i exp((double)z_i - z[best])),
 *      lp = z[tok] - lse, and the n_top first ids of the order with z - lse;
 *   3. inv_temp == 0: tok = best. Else each id's mass m_i = llrint(exp((double)(z_i * inv_temp) -
 *      (double)(z[best] * inv_temp)) * 2^40) (u64 fixed point; best = 2^40); the kept set is
 *      S (top_k in (0, V): the top_k first of the order; else all)
 *      ∩ P (top_p < 1: the shortest prefix of S in that order whose mass reaches ceil(top_p * mass(S)))
 *      ∩ M (min_p > 0: m_i >= min_p * 2^40, i.e. p_i >= min_p * p_max);
 *      r = floor(u * mass(kept)); tok = the first id (ascending) whose running mass over kept ids exceeds r.
 *      The draw walks ids in id order (not sorted order): the distribution is the filters', the map
 *      from u to a token is this definition's. Ids with m_i = 0 (p below ~2^-40 of p_max) are never drawn. */
enum { BE_EDIT_PENALTY = 0, BE_EDIT_ADD = 1, BE_SAMPLE_TOP = 20 };
typedef struct be_logit_edit {
    int32_t tok, kind;
    float v;
} be_logit_edit;
typedef struct be_sample_row {
    float inv_temp;            /* 0: greedy */
    int top_k;                 /* 0 or >= V: off */
    float top_p, min_p;        /* 1, 0: off */
    double u;                  /* uniform in [0, 1) from the request's generator */
    int edit0, n_edit;         /* this row's edits: edits[edit0 .. edit0 + n_edit) */
    int n_top;                 /* -1: no log-probs; else 0..BE_SAMPLE_TOP */
} be_sample_row;
typedef struct be_sample_out {
    int32_t tok;
    float lp;                  /* n_top >= 0: log-prob of tok; else NAN */
    float zmax;                /* the row's largest logit after the edits (NaN counted as -inf): not finite = bad logits */
    int32_t top_id[BE_SAMPLE_TOP];
    float top_lp[BE_SAMPLE_TOP];
} be_sample_out;
static inline BE_HD float be_apply_edit(float x, const be_logit_edit *e) {
    return e->kind == BE_EDIT_PENALTY ? (x > 0 ? x / e->v : x * e->v) : x + e->v;
}

enum { BE_ACT_AUTO = 0, BE_ACT_F32 = 1, BE_ACT_BF16 = 2 };   /* be_ops.prefill_act modes */

typedef struct be_ops {
    const char *name;
    int (*ctx_new)(be_ctx **out, int n_threads);
    void (*ctx_free)(be_ctx *c);
    int (*n_threads)(const be_ctx *c);

    /* buffers (activations, caches) */
    void *(*alloc)(be_ctx *c, size_t bytes);           /* zeroed; NULL on failure */
    void (*free)(be_ctx *c, void *p);
    void (*to_host)(be_ctx *c, void *dst, const void *src, size_t bytes);
    void (*from_host)(be_ctx *c, void *dst, const void *src, size_t bytes);
    void (*copy)(be_ctx *c, void *dst, const void *src, size_t bytes);

    /* weights: make m usable by this backend (CUDA uploads to m->dev) */
    int (*mat_prepare)(be_ctx *c, be_mat *m);
    void (*mat_release)(be_ctx *c, be_mat *m);

    /* out[n][cols] = tab[ids[i]]; ids (host) NULL: the last kept argmax's rows (see argmax) */
    void (*embed)(be_ctx *c, const be_mat *tab, const int32_t *ids, int n, float *out);
    /* y[n][m] = x[n][k] . w[m][k]^T (+ bias[m]) */
    void (*matmul)(be_ctx *c, const float *x, int n, const be_mat *w, const be_mat *bias, float *y);
    /* y[n][dim] = x / rms(x) * (w + w_add); w may be NULL (weightless) */
    void (*rmsnorm)(be_ctx *c, const float *x, int n, int dim, const be_mat *w, float w_add,
                    float eps, float *y);
    /* rotary embedding in place on x[n][heads][hd] over the first rot_dims dims;
     * pos[n] positions; inv_freq[rot_dims/2]; neox=1 rotate-half pairs (i, i+rot/2),
     * neox=0 interleaved pairs (2i, 2i+1). Padded tokens may carry any position. */
    void (*rope)(be_ctx *c, float *x, int n, int heads, int hd, int rot_dims, const int *pos,
                 const float *inv_freq, int neox);
    /* out[i] = act(gate[i]) * up[i], act a BE_ACT_* (be_act) */
    void (*glu)(be_ctx *c, const float *gate, const float *up, float *out, size_t n, int act);
    /* x[i] = x[i] * s */
    void (*scale)(be_ctx *c, float *x, size_t n, float s);
    /* x[i] = be_softcap(x[i], cap) (final-logit softcapping) */
    void (*softcap)(be_ctx *c, float *x, size_t n, float cap);
    /* y[i] += x[i] */
    void (*add)(be_ctx *c, float *y, const float *x, size_t n);
    /* y[i][:] = x[rows[i]][:] for i < n (gather token rows before the LM head) */
    void (*gather)(be_ctx *c, const float *x, int dim, const int *rows, int n, float *y);

    /* KV: write src[B][L][n_kv][hd] into a pool (be_attn: pages of sequence
     * seq[b]) at positions pos0[b]+i for i < len[b]; pool dtype kv_dt
     * (f32, f16, bf16); every page written is held. */
    void (*kv_write)(be_ctx *c, const be_attn *a, const float *src, void *cache, be_dtype kv_dt);
    /* out[B][L][n_head][hd] = softmax(q k^T * scale + mask) v over the keys
     * of the pools k, v that be_span lets each query see; padded queries
     * (i >= len[b]) get zeros. */
    void (*attention)(be_ctx *c, const be_attn *a, const float *q, const void *k, const void *v,
                      be_dtype kv_dt, float *out);

    /* Optional (NULL: not provided). */
    /* 0 while every op so far succeeded; else non-zero and a message in msg[n]
     * (ops return void: a device backend records its first failure here) */
    int (*status)(be_ctx *c, char *msg, size_t n);
    /* bytes of memory this backend can still allocate (host MemAvailable, free device memory) */
    size_t (*mem_available)(be_ctx *c);
    /* on: every op computes each row of its output from that row's inputs alone,
     * in the same order whatever the batch (no bf16-rounded activations for
     * batched matmuls on CUDA), so a row's results do not depend on the other
     * rows; off (default): the fast paths */
    void (*batch_invariant)(be_ctx *c, int on);
    /* precision of the activations into many-token matmuls (prefill, scoring):
     * BE_ACT_AUTO (default), BE_ACT_F32 or BE_ACT_BF16; see cinfer_ctx_opts.prefill_act */
    void (*prefill_act)(be_ctx *c, int mode);
    /* bracket one forward; a backend may capture the ops between as a graph
     * and replay it when a later bracket issues the same ops (decode steps) */
    void (*step_begin)(be_ctx *c);
    void (*step_end)(be_ctx *c);
    /* steps captured as graphs and steps replayed so far */
    void (*graph_stats)(const be_ctx *c, long *captures, long *replays);
    /* out[i] = index of the largest of x[i][0..dim) (first on ties), host array; issued inside a step
     * bracket, a backend may write out only at step_end. Chained greedy steps (backends with argmax_take):
     * out NULL inside a step keeps the result on the device, where the next step's embed with ids NULL reads
     * it as its tokens, and step_end does not wait for it */
    void (*argmax)(be_ctx *c, const float *x, int n, int dim, int32_t *out);
    /* optional: the oldest kept argmax result not taken yet (at most two), once its step is done, into out
     * (its rows); out NULL asks whether this context keeps results (0: yes) */
    int (*argmax_take)(be_ctx *c, int32_t *out);
    /* matmul of one input by count (1..3) matrices of the same cols in one pass:
     * y[i] = x . w[i]^T (+ bias[i], which may be NULL) — q/k/v, gate/up */
    void (*matmul_multi)(be_ctx *c, const float *x, int n, int count, const be_mat *const *w, const be_mat *const *bias,
                         float *const *y);
    /* the rmsnorm op of x (weights norm, w_add, eps), then matmul_multi of the result by count
     * matrices; glu a BE_ACT_* (count 2): y[0] = act(xn . w[0]^T + b[0]) * (xn . w[1]^T + b[1]) and y[1]
     * is scratch; glu 0: plain products. xn[n][cols] is scratch the op may use. A backend may fold the norm into the
     * matmul and both matrices and the SwiGLU into one pass. */
    void (*norm_matmul)(be_ctx *c, const float *x, int n, const be_mat *norm, float w_add, float eps, float *xn, int count,
                        const be_mat *const *w, const be_mat *const *bias, float *const *y, int glu);
    /* y[n][m] += x . w^T (+ bias): the residual add folded into the matmul; tmp[n][m] scratch */
    void (*matmul_add)(be_ctx *c, const float *x, int n, const be_mat *w, const be_mat *bias, float *y, float *tmp);
    /* optional: a hint that count matrices w are read soon after the next matmul op (gate/up after o_proj): the
     * backend may start moving them toward the compute units while that op waits (CUDA: a prefix of each into L2,
     * issued by the next GEMV launch before its wait on the attention). Never changes a result. */
    void (*prefetch_next)(be_ctx *c, int count, const be_mat *const *w);
    /* the rope op on q[B][L][n_head][hd] and k[B][L][n_kv][hd] (in place, a->pos, a->inv_freq),
     * then kv_write of k and v: one pass */
    void (*rope_kv_write)(be_ctx *c, const be_attn *a, float *q, float *k, const float *v, void *k_cache, void *v_cache,
                          be_dtype kv_dt);
    /* optional: rope_kv_write, then the attention op over the pools into out — one pass where the backend can
     * (CUDA: a decode step's rope and KV write inside its attention kernel); q and k are scratch after it */
    void (*rope_kv_attend)(be_ctx *c, const be_attn *a, float *q, float *k, const float *v, void *k_cache, void *v_cache,
                           be_dtype kv_dt, float *out);
    /* out[n] (host) = the scoring statistics above of each row of z[n][V] (backend memory) against
     * tgt[n] (host); base NULL: kld = 0; codes (backend memory, may be NULL): row i's 16-bit code
     * written at codes + i * code_stride (u16 elements) */
    void (*score)(be_ctx *c, const float *z, int n, int V, const int32_t *tgt, const be_score_base *base,
                  uint16_t *codes, size_t code_stride, be_score_row *out);
    /* optional: the score op with the LM head folded in, its logits z = x . w^T (x[n][w->cols],
     * backend memory) reduced where they are computed, never stored (no codes). The definition is
     * matmul's then score's; the backend takes the products in its matmul's precision and its own
     * order, and may reassociate the exp sum and the KL sum (its source states how); code_scale and
     * code_min (only a code row needs them) are left 0. x NULL: only
     * asks whether this head (and a base's head) is taken, 1 or 0; a head not taken goes through
     * matmul and score. out NULL (backends with score_take): the results stay with the backend, the
     * op returns without waiting for them, and score_take(c, out, n) waits and writes them (the inputs
     * may change in between; the base's rows may be overwritten only after the take). */
    int (*score_head)(be_ctx *c, const float *x, int n, const be_mat *w, const int32_t *tgt, const be_score_base *base,
                      be_score_row *out);
    int (*score_take)(be_ctx *c, be_score_row *out, int n);   /* optional; nonzero on failure (status says) */
    /* optional (backends whose ops return before they are done): c's ops issued from now on start only after
     * every op issued so far on other (a context of the same backend) */
    void (*order_after)(be_ctx *c, be_ctx *other);

    /* sampling as defined above: rows of z[n][V] (backend memory; the edits are written into it),
     * params p[n], edits (host), out[n] (host) */
    void (*sample)(be_ctx *c, float *z, int n, int V, const be_sample_row *p, const be_logit_edit *edits, int n_edits,
                   be_sample_out *out);

    /* Quantized KV (be_kvq). kvq_write: kv_write into a quantized pool, each row
     * src[b][i][h][0..hd) quantized by aq_quantize_row with MLX's GPU rounding rule.
     * kvq_attention: the attention op over quantized pools, with kernel
     *   BE_KVQ_UNFUSED: qs = q * scale (f32); s_j = qs . deq(k_j) (f32 sums); softcap;
     *     m = max s_j; e_j = exp(s_j - m); p_j = e_j / sum e; out = sum_j p_j deq(v_j);
     *   BE_KVQ_TILED: the same scores, the visible keys (be_span's sinks, then the
     *     run) cut into tiles at every multiple of BE_KVQ_TILE positions and at
     *     range starts; per tile m' = max(m, max s), f = exp(m - m'), l = f l +
     *     sum exp(s - m'), o = f o + sum exp(s - m') deq(v); out = o / l.
     * Both: fused dequantization, no full-precision copy of the pool. */
    void (*kvq_write)(be_ctx *c, const be_attn *a, const float *src, const be_kvq *pool);
    /* optional: the rope op on q[B][L][n_head][hd] and k[B][L][n_kv][hd] (in place, a->pos, a->inv_freq), then
     * kvq_write of k into kp and of v into vp — one pass where the backend can (CUDA: one launch a step) */
    void (*rope_kvq_write)(be_ctx *c, const be_attn *a, float *q, float *k, const float *v, const be_kvq *kp,
                           const be_kvq *vp);
    void (*kvq_attention)(be_ctx *c, const be_attn *a, const float *q, const be_kvq *k, const be_kvq *v, int kernel,
                          float *out);
} be_ops;

const be_ops *be_cpu(void);
const be_ops *be_cuda(void);   /* NULL when built without CUDA */

/* float <-> half/bfloat16 (round to nearest even) */
float be_f16_to_f32(uint16_t h);
uint16_t be_f32_to_f16(float f);
static inline float be_bf16_to_f32(uint16_t b) {
    union { uint32_t u; float f; } v = { (uint32_t)b << 16 };
    return v.f;
}
uint16_t be_f32_to_bf16(float f);
/* element i of an array of dtype dt (f32/f16/bf16) as float, and its store (round to nearest even) */
float be_kv_get(const void *p, be_dtype dt, size_t i);
void be_kv_put(void *p, be_dtype dt, size_t i, float x);
/* element i of a weight row as float */
float be_mat_get(const be_mat *m, int64_t r, int64_t c);

#endif
