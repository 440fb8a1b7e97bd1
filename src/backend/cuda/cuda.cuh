/*
 * cuda.cuh — internals of the CUDA backend shared by its .cu files: the
 * backend context, the op record every op is turned into, and the launchers.
 *
 * Every op builds a cu_rec (a launcher function plus its device pointers,
 * sizes and scalars; no host pointers) and hands it to cu_submit. Host
 * arrays an op needs (token ids, positions, lengths, RoPE frequencies) are
 * first copied into a pinned staging arena with cu_stage, which (eagerly)
 * issues the host-to-device copy on the context's stream; the record holds
 * the device address. That makes one forward a pure sequence of records,
 * which is what lets a decode step be captured as a CUDA graph once and
 * replayed: a graph starts with one copy of the arena's first CU_STEP_STAGE
 * bytes, and on replay the ops only rewrite the pinned arena and compare
 * their record with the captured one; the first difference
 * (a grown cache, a new shape) drops back to eager launches of the records
 * issued so far (see ctx.cu).
 *
 * Invariants: one stream per context, every launch on it; no globals; the
 * first CUDA error is kept in the context, reported and cleared by the
 * status op (a fault that poisons the device context stays: CUDA reports it
 * again at the next call).
 *
 * Paged KV: a kernel finds a key through the page table (cu_kv_row) and
 * decides what a query sees only through be_span (cu_span_of); no kernel
 * knows the window rule.
 */
#ifndef CINFER_CUDA_CUH
#define CINFER_CUDA_CUH
#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <cuda_fp16.h>
#include <cuda_bf16.h>
#include <stdint.h>
extern "C" {
#include "backend/backend.h"
}

struct cu_rec;
typedef void (*cu_launch_fn)(be_ctx *c, const struct cu_rec *r);

typedef struct cu_rec {
    cu_launch_fn fn;
    const void *p[16];  /* device pointers */
    int64_t i[16];      /* sizes, dtypes, flags */
    float f[3];
} cu_rec;

enum { CU_EAGER = 0, CU_CAPTURE = 1, CU_REPLAY = 2 };

#define CU_ARENA_BYTES ((size_t)8 << 20)
#define CU_STEP_STAGE ((size_t)128 << 10)   /* staged bytes a graph step may use */
#define CU_MAX_RECS 8192
#define CU_AM_MAX 256    /* rows of an argmax a copy brings back (pinned keys) */

/* a captured decode step: its graph and the records it was captured from */
#define CU_GRAPHS 8
typedef struct cu_graph {
    cudaGraphExec_t exec;
    struct cu_rec *recs;     /* [n] */
    int n;
    long used;
} cu_graph;

struct be_ctx {
    int device;
    int n_sm;                /* multiprocessors */
    int l2_bytes;            /* the L2 cache */
    int smem_optin;          /* shared memory a block may opt in to */
    const void *pf_w[2];     /* prefetch_next's matrices (a prefix of each: pf_bytes), for the next GEMV launch to take */
    int64_t pf_bytes[2];
    int l2_next;             /* eighths of L2 prefetch_next may fill (CINFER_CUDA_L2_NEXT=0..8; default 4) */
    cudaStream_t stream;
    cublasHandle_t blas;
    void *blas_ws;           /* [32 MiB] cuBLAS workspace (fixed: graph capture needs it) */
    /* first error */
    int err;
    char msg[256];
    /* staging arena: pinned host mirror of a device buffer */
    unsigned char *arena_h;  /* [CU_ARENA_BYTES] pinned */
    unsigned char *arena_d;  /* [CU_ARENA_BYTES] device */
    size_t arena_off;
    /* workspaces, grown on demand (outside capture) */
    void *act16;             /* [act16_n] bytes: activations rounded to bf16/f16 for cuBLAS */
    size_t act16_n;
    const void *act16_src;   /* act16 holds this f32 buffer ([act16_len] elements, act16_dt) rounded; */
    size_t act16_len;        /* NULL when stale. Any op other than a matmul clears it. */
    int act16_dt;
    int batch_inv;           /* batch-invariant mode: matmuls keep f32 activations, rows never mix (be_ops.batch_invariant) */
    void *deq;               /* [deq_n] bytes: an affine matrix dequantized for cuBLAS (affine.cu, prefill) */
    size_t deq_n;
    float *part;             /* [part_n] bytes: split-K attention partials */
    size_t part_n;
    void *score_out;         /* [score_out_n] bytes: the score and sample ops' per-row results */
    size_t score_out_n;
    void *sh_ws;             /* [sh_ws_n] bytes: score_head's rounded rows and partials */
    be_score_row *sh_out_h;  /* [sh_out_n] pinned: score_head's results left for score_take, ready at sh_ev */
    int sh_out_n;
    cudaEvent_t sh_ev;
    cudaEvent_t ord_ev;      /* order_after: recorded on this stream for another context's stream to wait on */
    size_t sh_ws_n;
    int score_head_k;        /* score_head takes bf16 heads of hidden <= this (CINFER_CUDA_SCORE_HEAD) */
    void *samp_mass;         /* [samp_mass_n] bytes: the sample op's fixed-point masses [n][V] */
    size_t samp_mass_n;
    void *samp_edits;        /* [samp_edits_n] bytes: the sample op's logit edits */
    size_t samp_edits_n;
    int *cnt;                /* [cnt_n] bytes: split-K arrival counters, zero between launches */
    size_t cnt_n;
    /* graph state */
    int mode;                /* CU_EAGER / CU_CAPTURE / CU_REPLAY */
    int in_step;
    cu_rec *recs;            /* [CU_MAX_RECS] records of the step being captured (a replay compares graphs[].recs) */
    int n_recs, i_rec;       /* captured count, replay cursor */
    int step_ok;             /* current step stayed graph-compatible */
    cu_graph graphs[CU_GRAPHS];  /* captured steps (NULL exec: a free slot), least recently used replaced */
    unsigned live;           /* replay: the graphs whose records equal the step's so far (bit g: graphs[g]) */
    int last;                /* the graph launched last (-1: none) */
    long tick;               /* graph use clock (LRU) */
    long n_replays, n_captures;
    int pdl;                 /* launch with programmatic dependent launch (CINFER_CUDA_PDL=0: off) */
    int prefetch;            /* a GEMV after a light kernel prefetches its weights (CINFER_CUDA_PREFETCH=0: off) */
    int light_prev;          /* the last kernel launched moves little memory (decode attention) */
    int cluster;             /* decode attention merges its slices within a cluster (CINFER_CUDA_CLUSTER=0: off) */
    int dec_wide;            /* the CUDA-core decode attention with 8 warps a block (CINFER_CUDA_DEC_WIDE=0: 4) */
    int rope_fuse;           /* rope_kv_attend's rope and KV write inside that kernel (CINFER_CUDA_ROPE_FUSE=0: two launches) */
    int kvq_rope;            /* rope_kvq_write in one launch (CINFER_CUDA_KVQ_ROPE=0: four) */
    int dec_lazy;            /* the tensor-core decode kernels' lazy online softmax (dec_online; CINFER_CUDA_DEC_LAZY=1; else tau 0: the eager one) */
    int gemv_rows;           /* matmuls of up to this many rows take the GEMV (CINFER_CUDA_GEMV_ROWS=1..8; 0: default, 1) */
    int dec_blocks;          /* decode attention: blocks per SM that fill the GPU (CINFER_CUDA_DEC_BLOCKS; 0: always the span's slices) */
    int dec_many;            /* ... and then attn-many.cu's kernel (CINFER_CUDA_DEC_MANY=0: attn-decode.cu's, one slice) */
    int dec_tc;              /* decode attention on tensor cores: 0 never, 1 (default) 16-bit pools from DEC_TC_SPAN keys and
                                4-/8-bit pools always, 2 always (CINFER_CUDA_DEC_TC=0|1) */
    int slice_real;          /* tensor-core decode slices sized from the query's own span on the device, not the bucket
                                (cu_slice; not in batch-invariant mode; CINFER_CUDA_SLICE_REAL=0: off) */
    int kq_pack;             /* quantized decode on tensor cores, g <= 4: one mma a k-step, lo rows beside hi and mid
                                (CINFER_CUDA_KQ_PACK=0: two) */
    int batched;             /* gate/up through cuBLAS in one batched launch (CINFER_CUDA_BATCHED=0: one GEMM each) */
    int aff_gemv;            /* 4/8-bit affine decode through gemv-affine.cu (CINFER_CUDA_AFF_GEMV=0: affine.cu's GEMV, one matrix a launch) */
    int aff_tc;              /* one token's 4-bit rows through gemv-affine.cu's tensor-core form (CINFER_CUDA_AFF_TC=0: its CUDA-core kernel) */
    int aff_dp;              /* one token's 4-bit rows through gemv-affine.cu's integer form (default; CINFER_CUDA_AFF_DP=0 off) */
    int aff_ring;            /* the integer form streamed through per-warp cp.async rings (k_gemv_aff_ring; default; CINFER_CUDA_AFF_RING=0 off) */
    int afr_d;               /* its ring depth (CINFER_CUDA_AFR_D=2, 3, 6 or 8; else 4) */
    int afr_w;               /* its warps a block: 16 (default), one block an SM; CINFER_CUDA_AFR_W=8: GEMV_WARPS, two */
    int x_ahead;             /* the affine GEMV's copy of x with all its loads ahead of the stores (CINFER_CUDA_X_AHEAD=0: the loop) */
    int dec_short;           /* the CUDA-core decode attention over at most 256 keys in slices of at most 32 (CINFER_CUDA_DEC_SHORT=0: off) */
    /* argmax (elementwise.cu): three key slots of CU_AM_MAX rows on the device and their pinned copies; slots 0
     * and 1 alternate for kept results (chained greedy steps: a step's argmax stays on the device as the next
     * step's token and reaches the host through argmax_take), slot 2 serves the rest */
    int am_step;             /* a decode step's argmax issued with the step's graph (CINFER_CUDA_ARGMAX_STEP=0: after it, eagerly) */
    int chain;               /* kept results allowed (CINFER_CUDA_CHAIN=0: argmax_take refuses, the engine reads every step back) */
    unsigned long long *am_d;    /* [3][CU_AM_MAX] device */
    unsigned long long *am_h;    /* [3][CU_AM_MAX] pinned */
    unsigned long long *am_part; /* [CU_AM_MAX][2 n_sm] the blocks' partial keys */
    unsigned *am_cnt;        /* [CU_AM_MAX] blocks done a row (a row's last block reduces and resets it) */
    cudaEvent_t am_ev[2];    /* a kept result's copy done */
    int am_rows[2];          /* rows of the kept result in slot 0 / 1 */
    int am_fifo[2], am_kn;   /* kept results not taken yet, oldest first */
    int am_next, am_last;    /* slot of the next kept result; of the last one (-1: none), which embed(ids NULL) reads */
    int am_pend;             /* a kept result issued in the open step: its slot (-1: none), queued at step_end */
    int32_t *am_out;         /* an argmax issued in the open step: its host result, written by step_end (am_n rows) */
    int am_n;
    /* chained steps: a step that follows a kept result's step without a wait stages in the other half of the
     * arena's first 2 CU_STEP_STAGE bytes */
    size_t stage0;           /* the open step's staging base */
    int staged_out;          /* something was staged outside a step since the last step: the next step waits */
    int afr_blocks;          /* its blocks an SM at most (CINFER_CUDA_AFR_BLOCKS; 0: as many as fit) */
};

/* error bookkeeping: records the first failure, returns 1 on failure */
int cu_check(be_ctx *c, cudaError_t e, const char *what);
int cu_check_blas(be_ctx *c, cublasStatus_t s, const char *what);
#define CU_LAUNCHED(c, what) cu_check((c), cudaGetLastError(), (what))
/* takes the error a failed call left in the runtime's last-error slot when it
 * is the one expected (the caller handles it); any other is recorded */
void cu_clear_expected(be_ctx *c, cudaError_t expected, const char *what);

/* copies host bytes into the staging arena; returns their device address */
const void *cu_stage(be_ctx *c, const void *host, size_t bytes);
/* the attention geometry every cache op records the same way:
 * i[0..9] = B, L, n_head, n_kv_head, head_dim, span (cu_span_bucket), log2(page), n_pt, window, keep;
 * p[slot..slot+4] = staged pos0, len, seq, run0, and the device page table.
 * Ops put their own fields in i[10..13]. */
enum { CU_A_B, CU_A_L, CU_A_H, CU_A_NKV, CU_A_HD, CU_A_SPAN, CU_A_PSH, CU_A_NPT, CU_A_WIN, CU_A_KEEP, CU_A_OP };
void cu_rec_attn(be_ctx *c, cu_rec *r, const be_attn *a, int slot);
/* max_span rounded up so that decode steps keep one geometry (and graph) for many
 * positions: to 256, then to 1/8 of its power of two */
int cu_span_bucket(int max_span);
/* runs or records one op */
void cu_submit(be_ctx *c, const cu_rec *r);
/* leaves capture/replay for the rest of the step (before an allocation, a sync) */
void cu_go_eager(be_ctx *c);
/* the open step (step_begin) ends here: its graph launched or replayed, or its records run eagerly */
void cu_step_launch(be_ctx *c);
/* grows a workspace (device bytes); 0 on failure */
int cu_ensure(be_ctx *c, void **buf, size_t *have, size_t need);

/* the split-K workspaces of an attention op: partials for B*L*n_head queries of nsplit slices of
 * head_dim + 2 floats (c->part) and their arrival counters (c->cnt, zeroed when grown); 0 on failure */
int cu_split_ws(be_ctx *c, const be_attn *a, int nsplit);
/* split-K: 1 in every thread of the block that arrives last of n at the counter *ctr, once the
 * block's writes are fenced (that block then reads the others' partials and resets *ctr) */
__device__ __forceinline__ int cu_arrive_last(int *ctr, int n) {
    __shared__ int last;
    __threadfence();
    __syncthreads();
    if (threadIdx.x == 0) last = atomicAdd(ctr, 1) == n - 1;
    __syncthreads();
    if (last) __threadfence();
    return last;
}

/* ops implemented in the kernel files */
void cu_matmul_launcher(be_ctx *c, const cu_rec *r);
void cu_op_embed(be_ctx *c, const be_mat *tab, const int32_t *ids, int n, float *out);
void cu_op_matmul(be_ctx *c, const float *x, int n, const be_mat *w, const be_mat *bias, float *y);
void cu_op_matmul_multi(be_ctx *c, const float *x, int n, int count, const be_mat *const *w, const be_mat *const *bias, float *const *y);
void cu_op_norm_matmul(be_ctx *c, const float *x, int n, const be_mat *norm, float w_add, float eps, float *xn, int count,
                       const be_mat *const *w, const be_mat *const *bias, float *const *y, int glu);
void cu_op_matmul_add(be_ctx *c, const float *x, int n, const be_mat *w, const be_mat *bias, float *y, float *tmp);
void cu_op_prefetch_next(be_ctx *c, int count, const be_mat *const *w);
void cu_op_rmsnorm(be_ctx *c, const float *x, int n, int dim, const be_mat *w, float w_add, float eps, float *y);
void cu_op_rope(be_ctx *c, float *x, int n, int heads, int hd, int rot, const int *pos, const float *inv_freq, int neox);
void cu_op_glu(be_ctx *c, const float *gate, const float *up, float *out, size_t n, int act);
void cu_op_scale(be_ctx *c, float *x, size_t n, float s);
void cu_op_softcap(be_ctx *c, float *x, size_t n, float cap);
void cu_op_add(be_ctx *c, float *y, const float *x, size_t n);
void cu_op_gather(be_ctx *c, const float *x, int dim, const int *rows, int n, float *y);
void cu_op_kv_write(be_ctx *c, const be_attn *a, const float *src, void *cache, be_dtype dt);
void cu_op_rope_kv_write(be_ctx *c, const be_attn *a, float *q, float *k, const float *v, void *kc, void *vc, be_dtype dt);
void cu_op_attention(be_ctx *c, const be_attn *a, const float *q, const void *k, const void *v, be_dtype dt, float *out);
void cu_op_rope_kv_attend(be_ctx *c, const be_attn *a, float *q, float *k, const float *v, void *kc, void *vc, be_dtype dt,
                          float *out);
/* the decode attention kernel (attn-decode.cu): whether it serves a shape (span: cu_span_bucket), its slices; its launch */
int cu_attn_decode_fits(const be_attn *a, be_dtype dt, int span, int target, int tc_sm, int real, int short32, int *chunk, int *nsplit);
int cu_attn_decode_tc(const be_ctx *c, int span);
/* the tensor-core decode kernels' slices: want, capped so that rows x slices blocks fit in one wave of
 * `slots` resident blocks (at least one slice) */
static inline int cu_one_wave(int want, int slots, long rows) {
    long fit = rows > 0 ? slots / rows : want;
    return want < fit ? want : fit > 1 ? (int)fit : 1;
}
/* the decode kernels' slices of a span bound (cu_span_bucket) over `want` blocks a query, in runs of CU_DEC_RUN keys
 * (attn-decode.cu's pieces; the tensor-core kernels' four warps' runs of 16): sized for the bound, or with real the same
 * blocks sized on the device from each query's own span (cu_slice: chunk -CU_DEC_RUN) */
#define CU_DEC_RUN 64
static inline void cu_dec_slices(int span, int want, int real, int *chunk, int *nsplit) {
    if (real) {
        *chunk = -CU_DEC_RUN;
        *nsplit = want;
        return;
    }
    int pieces = (span + CU_DEC_RUN - 1) / CU_DEC_RUN;
    *chunk = CU_DEC_RUN * ((pieces + want - 1) / want);
    *nsplit = (span + *chunk - 1) / *chunk;
}
void cu_attn_decode_launch(be_ctx *c, const cu_rec *r);
/* affine.cu: MLX affine-quantized weights (upload, matmul, embedding rows) */
int cu_affine_upload(be_ctx *c, be_mat *m);
void cu_affine_matmul(be_ctx *c, const float *x, int n, const be_mat *w, const be_mat *bias, float *y, int acc);
void cu_affine_embed(be_ctx *c, const be_mat *tab, const int32_t *ids, int n, float *out);
/* the codes, scales and biases of an uploaded affine matrix whose buffer starts at base */
void cu_affine_parts(const void *base, int64_t rows, int64_t cols, int bits, int group, int sdt, const void **codes,
                     const void **scales, const void **biases);
/* gemm.cu: y = x . w^T (+ bias), or y += with acc, any stored type */
void cu_matmul_op(be_ctx *c, const float *x, int n, const be_mat *w, const be_mat *bias, float *y, int acc);
int cu_attn_many_fits(const be_ctx *c, int rows, int n_kv, int g, int nsplit);
int cu_attn_decode_rope(const be_ctx *c, const be_attn *a, int nsplit);
void cu_attn_many_launch(be_ctx *c, const cu_rec *r);
/* quantized KV (kvquant.cu): be_ops.kvq_write and kvq_attention; prefill of the latter runs the flash
 * kernel with a dequantizing tile loader (attention.cu, record as kvquant.cu's) */
void cu_op_kvq_write(be_ctx *c, const be_attn *a, const float *src, const be_kvq *pool);
void cu_op_rope_kvq_write(be_ctx *c, const be_attn *a, float *q, float *k, const float *v, const be_kvq *kp, const be_kvq *vp);
void cu_op_kvq_attention(be_ctx *c, const be_attn *a, const float *q, const be_kvq *k, const be_kvq *v, int kernel, float *out);
void cu_kvq_flash_launch(be_ctx *c, const cu_rec *r);
void cu_op_argmax(be_ctx *c, const float *x, int n, int dim, int32_t *out);
/* an open step's argmax result (am_out), once the step's graph is launched: waited for and written */
void cu_argmax_settle(be_ctx *c);
int cu_op_argmax_take(be_ctx *c, int32_t *out);
/* the token of an argmax key (k_argmax: value bits << 32 | ~index; 0, a row of NaN: token 0) */
__host__ __device__ __forceinline__ int32_t cu_key_id(unsigned long long k) { return k ? (int32_t)~(unsigned)(k & 0xffffffffu) : 0; }
/* a token-id array for an embedding: the host ids staged (*keys = 0), or with ids NULL the last kept argmax's
 * keys on the device (*keys = 1, n its rows; NULL and an error otherwise) */
const void *cu_ids(be_ctx *c, const int32_t *ids, int n, int *keys);
__device__ __forceinline__ int32_t cu_id_at(const void *ids, int keys, int64_t t) {
    return keys ? cu_key_id(((const unsigned long long *)ids)[t]) : ((const int32_t *)ids)[t];
}
/* x[total / k][k] (rows idx[] of x when idx, device memory, is not NULL) rounded to dt (bf16 or f16) into
 * out, as the matmul feeds cuBLAS (gemm.cu); 1 on a launch failure */
int cu_round16(be_ctx *c, const float *x, const int32_t *idx, int k, void *out, int dt, size_t total);
/* each of n scored rows' base lse (base->lse[base->idx[i]]) staged to the device; NULL (error recorded) on failure */
const float *cu_stage_base_lse(be_ctx *c, const be_score_base *base, int n);
int cu_op_score_take(be_ctx *c, be_score_row *out, int n);
int cu_op_score_head(be_ctx *c, const float *x, int n, const be_mat *w, const int32_t *tgt, const be_score_base *base,
                     be_score_row *out);
void cu_op_score(be_ctx *c, const float *z, int n, int V, const int32_t *tgt, const be_score_base *base, uint16_t *codes,
                 size_t code_stride, be_score_row *out);
void cu_op_sample(be_ctx *c, float *z, int n, int V, const be_sample_row *p, const be_logit_edit *edits, int n_edits,
                  be_sample_out *out);

static inline unsigned cu_blocks(size_t n, unsigned t) { return (unsigned)((n + t - 1) / t); }

/* Programmatic dependent launch: every kernel of this backend is launched
 * with programmatic stream serialization, so it may be scheduled while the
 * kernel before it drains; it waits (griddepcontrol.wait) for that kernel's
 * results before touching memory, then lets its own successor be scheduled.
 * Hides most of the launch gap between the ~600 kernels of a decode step. */
#define PDL_WAIT() asm volatile("griddepcontrol.wait;" ::: "memory")
#define PDL_TRIGGER() asm volatile("griddepcontrol.launch_dependents;" ::: "memory")
#define PDL_ENTRY() do { PDL_WAIT(); PDL_TRIGGER(); } while (0)

/* A diagnostic timeline of kernels' blocks, compiled in only with -DCINFER_CUDA_TRACE (bench/gpu/trace.sh, bench-cuda
 * BENCH_TRACE=FILE): thread 0 of a block records (globaltimer, clock64 << 32 | tag) at its start (ev 0), after its wait
 * on the kernel before (1), after a prologue (2), at its end (3) and at a point of its own (4: the decode attention's
 * merge of slices begins); tag = ev | block << 3 | kind << 16. Each file has
 * its own buffer and counter (no separate compilation of device code): CU_TRACE_HOST(name) defines the host function
 * name(cap, host, n) that gives them a buffer of cap events (cap > 0) or copies at most *n of them out (cap 0). */
#ifdef CINFER_CUDA_TRACE
static __device__ unsigned long long *cu_tr;
static __device__ unsigned cu_trn, cu_trcap;
__device__ __forceinline__ void cu_trace(int ev, unsigned kind) {
    if (threadIdx.x | threadIdx.y | threadIdx.z) return;
    unsigned long long t, ck = clock64();
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    const unsigned blk = blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z), i = atomicAdd(&cu_trn, 1u);
    if (cu_tr && i < cu_trcap) cu_tr[2 * i] = t, cu_tr[2 * i + 1] = ck << 32 | (unsigned)(ev | (blk & 0x1fff) << 3 | kind << 16);   /* ev < 8 */
}
#define CU_TRACE(ev, kind) cu_trace(ev, kind)
#define CU_TRACE_HOST(name)                                                                                                  \
    extern "C" int name(unsigned cap, unsigned long long *host, unsigned *n) {                                               \
        static unsigned long long *buf;                                                                                      \
        unsigned zero = 0, got = 0;                                                                                          \
        if (cap) {                                                                                                           \
            if (!buf && cudaMalloc((void **)&buf, (size_t)cap * 16) != cudaSuccess) return 1;                                \
            return cudaMemcpyToSymbol(cu_tr, &buf, sizeof buf) != cudaSuccess ||                                             \
                   cudaMemcpyToSymbol(cu_trcap, &cap, sizeof cap) != cudaSuccess ||                                          \
                   cudaMemcpyToSymbol(cu_trn, &zero, sizeof zero) != cudaSuccess;                                            \
        }                                                                                                                    \
        if (cudaDeviceSynchronize() != cudaSuccess || cudaMemcpyFromSymbol(&got, cu_trn, sizeof got) != cudaSuccess) return 1; \
        *n = got < *n ? got : *n;                                                                                            \
        return cudaMemcpy(host, buf, (size_t)*n * 16, cudaMemcpyDeviceToHost) != cudaSuccess;                                \
    }
#else
#define CU_TRACE(ev, kind) ((void)0)
#define CU_TRACE_HOST(name)
#endif
#define CU_TRACE_ROPE 0xfff0u   /* kinds of the traced kernels other than the ring GEMV's */
#define CU_TRACE_ATTN 0xfff1u
/* A kernel may instead trigger before it waits (its successor then starts
 * while this one waits) only when that successor reads, before its own wait,
 * nothing but staged inputs and memory written by earlier steps: it may run
 * while the kernel two back is still running. */

/* cluster_x > 0: thread block clusters of cluster_x blocks along x */
template <typename... K, typename... A>
static inline void cu_launch_cluster(be_ctx *c, unsigned cluster_x, void (*kernel)(K...), dim3 grid, dim3 block, size_t smem, A... args) {
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = grid;
    cfg.blockDim = block;
    cfg.dynamicSmemBytes = smem;
    cfg.stream = c->stream;
    cudaLaunchAttribute at[2];
    unsigned na = 0;
    if (c->pdl) {
        at[na].id = cudaLaunchAttributeProgrammaticStreamSerialization;
        at[na++].val.programmaticStreamSerializationAllowed = 1;
    }
    if (cluster_x) {
        at[na].id = cudaLaunchAttributeClusterDimension;
        at[na].val.clusterDim.x = cluster_x;
        at[na].val.clusterDim.y = 1;
        at[na++].val.clusterDim.z = 1;
    }
    cfg.attrs = at;
    cfg.numAttrs = na;
    cu_check(c, cudaLaunchKernelEx(&cfg, kernel, args...), "kernel launch");
    c->light_prev = 0;
}

template <typename... K, typename... A>
static inline void cu_launch(be_ctx *c, void (*kernel)(K...), dim3 grid, dim3 block, size_t smem, A... args) {
    cu_launch_cluster(c, 0, kernel, grid, block, smem, args...);
}

/* the row (head h, position j) of a sequence's keys in a pool [n_pages][n_kv][page][hd]:
 * be_kv_off(pt_row, page, n_kv, 1, h, j, 1) with page = 1 << sh; -1 when the page is not held */
__device__ __forceinline__ int64_t cu_kv_row(const int32_t *pt_row, int sh, int n_kv, int h, int j) {
    int32_t id = pt_row[j >> sh];
    return id < 0 ? -1 : ((((int64_t)id * n_kv + h) << sh) + (j & ((1 << sh) - 1)));
}

/* what a query at position p sees (be_span), numbered 0..n-1: index t < n_s is the
 * sink s_lo + t, the rest the run r_lo + (t - n_s) */
struct cu_span { int s_lo, n_s, r_lo, n; };
__device__ __forceinline__ cu_span cu_span_of(int p, int window, int keep, int run0) {
    cu_span s;
    int s_hi;
    be_span(p, window, keep, run0, &s.s_lo, &s_hi, &s.r_lo);
    s.n_s = s_hi - s.s_lo;
    s.n = s.n_s + (p + 1 > s.r_lo ? p + 1 - s.r_lo : 0);
    return s;
}
__device__ __forceinline__ int cu_span_key(const cu_span &s, int t) { return t < s.n_s ? s.s_lo + t : s.r_lo + (t - s.n_s); }
/* the key numbers [*j0, *j1) of slice s of a query's n keys: runs of chunk keys (chunk > 0: sized for the bucketed span
 * bound, cu_span_bucket), or, chunk <= 0, the n keys spread over the nsplit slices in as few rounds of -chunk keys each
 * as they take, the last slices left empty (sized on the device from the query's own span: a span just past a bucket
 * boundary would otherwise leave up to a fifth of the slices empty and make the others longer). The tensor-core kernels
 * take rounds of 64 keys (their four warps' runs of 16): H100, llama-3.1-8b, KV4 at 4,096 keys, rounds of 16 (more
 * slices non-empty, the same rounds a block) decoded at 0.984x the bucket's slices, at 32,768 at 1.038x. Either way the
 * geometry of the launch depends on the bucket only. */
__device__ __forceinline__ void cu_slice(int n, int s, int nsplit, int chunk, int *j0, int *j1) {
    if (chunk <= 0) {
        const int run = -chunk, per = (n + nsplit - 1) / nsplit;
        chunk = (per + run - 1) / run * run;
    }
    *j0 = s * chunk;
    *j1 = min(n, (s + 1) * chunk);
}

/* a score op's result row, stored whole (its padding zeroed: the copy to the host reads initialized bytes) */
static_assert(sizeof(be_score_row) == 32, "be_score_row is two 16-byte words");
__device__ __forceinline__ void cu_store_score_row(be_score_row *dst, const be_score_row &o) {
    union { be_score_row r; uint4 v[2]; } u;
    u.v[0] = u.v[1] = make_uint4(0u, 0u, 0u, 0u);
    u.r.lse = o.lse; u.r.lp = o.lp; u.r.argmax = o.argmax;
    u.r.code_scale = o.code_scale; u.r.code_min = o.code_min; u.r.kld = o.kld;
    ((uint4 *)dst)[0] = u.v[0];
    ((uint4 *)dst)[1] = u.v[1];
}

/* weight element as float */
template <typename T> __device__ __forceinline__ float cu_f(T v);
template <> __device__ __forceinline__ float cu_f<float>(float v) { return v; }
template <> __device__ __forceinline__ float cu_f<__half>(__half v) { return __half2float(v); }
template <> __device__ __forceinline__ float cu_f<__nv_bfloat16>(__nv_bfloat16 v) { return __bfloat162float(v); }

template <typename T> __device__ __forceinline__ T cu_from_f(float v);
template <> __device__ __forceinline__ float cu_from_f<float>(float v) { return v; }
template <> __device__ __forceinline__ __half cu_from_f<__half>(float v) { return __float2half_rn(v); }
template <> __device__ __forceinline__ __nv_bfloat16 cu_from_f<__nv_bfloat16>(float v) { return __float2bfloat16_rn(v); }

/* RoPE, the one rotation of k_rope, k_rope_kv and the decode attention's own (attn-decode.cu): pair j of a head is
 * its dims (*i0, *i1) (neox: j and j + rot / 2; else 2j and 2j + 1), turned by the angle whose cosine and sine are
 * cs, sn: (a0, a1) -> (a0 cs - a1 sn, a1 cs + a0 sn) */
__device__ __forceinline__ void cu_rope_dims(int j, int rot, int neox, int *i0, int *i1) {
    *i0 = neox ? j : 2 * j;
    *i1 = neox ? j + rot / 2 : 2 * j + 1;
}
__device__ __forceinline__ float2 cu_rope_pair(float a0, float a1, float cs, float sn) {
    return make_float2(a0 * cs - a1 * sn, a1 * cs + a0 * sn);
}
/* rotation pair w of a (token, kv head) block of k_rope_kv / k_rope_kvq: pair w % half of head hh = w / half — q head
 * h g + hh (q: the token's q row at that kv head's first head) while hh < g, else the k row kr — rotated in place at
 * (cs, sn), the angles the block computed for its first round before waiting, or this pair's own past the block's
 * threads. Returns hh; the pair's dims and rotated values in i0, i1, r */
__device__ __forceinline__ int cu_rope_kv_pair(int w, float *q, float *kr, int hd, int half, int rot, int neox, int g, float pos,
                                               const float *inv_freq, float cs, float sn, int *i0, int *i1, float2 *r) {
    const int hh = w / half, j = w % half;
    if (w >= (int)blockDim.x) {
        const float ang = pos * inv_freq[j];
        cs = cosf(ang);
        sn = sinf(ang);
    }
    float *vec = hh < g ? q + (size_t)hh * hd : kr;
    cu_rope_dims(j, rot, neox, i0, i1);
    *r = cu_rope_pair(vec[*i0], vec[*i1], cs, sn);
    vec[*i0] = r->x;
    vec[*i1] = r->y;
    return hh;
}

/* stores x as element i of a pool of dtype dt (f32/f16/bf16), rounding to nearest even */
__device__ __forceinline__ void cu_kv_put(void *p, int dt, size_t i, float x) {
    if (dt == BE_F16) ((__half *)p)[i] = __float2half_rn(x);
    else if (dt == BE_BF16) ((__nv_bfloat16 *)p)[i] = __float2bfloat16_rn(x);
    else ((float *)p)[i] = x;
}

__device__ __forceinline__ float cu_mat_get(const void *p, int dt, size_t i) {
    return dt == BE_F32 ? ((const float *)p)[i] : dt == BE_F16 ? __half2float(((const __half *)p)[i])
                                                               : __bfloat162float(((const __nv_bfloat16 *)p)[i]);
}
#endif
