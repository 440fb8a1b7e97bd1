/*
 * ctx.cu — the CUDA backend's context, buffers, weight upload, error
 * bookkeeping, decode-step graphs, and its op table (be_cuda()).
 *
 * A context owns one non-blocking stream, a cuBLAS handle with a fixed
 * workspace, a pinned staging arena (host arrays -> device, see cuda.cuh)
 * and grown workspaces. Weights are uploaded once by mat_prepare into
 * m->dev in their stored dtype. Activations and caches are device memory.
 *
 * Graphs: ctx.c brackets small forwards (decode) with step_begin/step_end.
 * A step is captured (cudaStreamBeginCapture, relaxed) and launched at
 * step_end; the context keeps up to CU_GRAPHS of them (one per batch size a
 * server runs, say), each with the op records it was captured from. A later
 * step replays the graph whose records it issues byte for byte: while it
 * runs, the graphs that still match are followed together; when none does,
 * the step is captured from there (the matched records re-issued under
 * capture) as a new graph, replacing the least recently used. Anything that
 * cannot be captured (an allocation, a free, a copy to the host, a grown
 * workspace) leaves the graph: the records issued so far are launched
 * eagerly after one bulk copy of the staging arena; a grown workspace (new
 * addresses) drops every graph.
 *
 * Errors: the first failing CUDA/cuBLAS call is kept in the context (code and
 * message); ops after it do nothing; the status op reports it (ctx.c turns it
 * into CINFER_EBACKEND and undoes the forward's cache changes) and clears it:
 * any open capture is closed, the graph dropped, the stream drained and the
 * split-K counters zeroed, so the next forward starts clean. The runtime's
 * last-error slot is per thread and shared by every context of the thread,
 * so it is read only where a call of this context just failed or launched,
 * and an error that is not the one expected there is recorded, never dropped.
 */
#include <stdio.h>
#include <stdlib.h>
#include <limits.h>
#include <string.h>
#include "backend/cuda/cuda.cuh"
#include "backend/cuda/cuda-api.h"
#include "util.h"

#define BLAS_WS_BYTES ((size_t)32 << 20)

int cu_check(be_ctx *c, cudaError_t e, const char *what) {
    if (e == cudaSuccess) return 0;
    if (!c->err) {
        c->err = (int)e;
        snprintf(c->msg, sizeof c->msg, "%s: %s (%s)", what, cudaGetErrorString(e), cudaGetErrorName(e));
    }
    return 1;
}

int cu_check_blas(be_ctx *c, cublasStatus_t s, const char *what) {
    if (s == CUBLAS_STATUS_SUCCESS) return 0;
    if (!c->err) {
        c->err = 1000 + (int)s;
        snprintf(c->msg, sizeof c->msg, "%s: cuBLAS status %d", what, (int)s);
    }
    return 1;
}

void cu_clear_expected(be_ctx *c, cudaError_t expected, const char *what) {
    cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess && e != expected) cu_check(c, e, what);
}

/* a call's own failure e that the caller handles (expected): the runtime's slot is taken, any other error kept */
static void take(be_ctx *c, cudaError_t e, cudaError_t expected, const char *what) {
    if (e == cudaSuccess) return;
    if (e != expected) cu_check(c, e, what);
    cu_clear_expected(c, e, what);
}

static void free_graph(cu_graph *g) {
    if (g->exec) cudaGraphExecDestroy(g->exec);
    free(g->recs);
    memset(g, 0, sizeof *g);
}

static void drop_graph(be_ctx *c) {
    for (int g = 0; g < CU_GRAPHS; g++) free_graph(&c->graphs[g]);
    c->live = 0;
    c->last = -1;
}

static int first_live(const be_ctx *c) {
    for (int g = 0; g < CU_GRAPHS; g++)
        if (c->live >> g & 1) return g;
    return -1;
}

/* replay found no graph for this step: its records so far (a prefix of any graph still live) go to c->recs */
static int take_prefix(be_ctx *c) {
    int g = first_live(c);
    if (g >= 0 && c->i_rec) memcpy(c->recs, c->graphs[g].recs, sizeof *c->recs * (size_t)c->i_rec);
    return g >= 0 ? c->i_rec : 0;
}

/* launches records [0, n) eagerly after copying the staged bytes they read */
static void catch_up(be_ctx *c, int n) {
    if (c->arena_off > c->stage0)
        cu_check(c, cudaMemcpyAsync(c->arena_d + c->stage0, c->arena_h + c->stage0, c->arena_off - c->stage0, cudaMemcpyHostToDevice,
                                    c->stream), "staging copy");
    for (int i = 0; i < n && !c->err; i++) c->recs[i].fn(c, &c->recs[i]);
}

void cu_go_eager(be_ctx *c) {
    if (c->mode == CU_CAPTURE) {
        cudaGraph_t g = NULL;
        /* an op that could not be captured invalidates the capture: expected, the records run eagerly */
        take(c, cudaStreamEndCapture(c->stream, &g), cudaErrorStreamCaptureInvalidated, "end capture");
        if (g) cudaGraphDestroy(g);
        c->mode = CU_EAGER;
        catch_up(c, c->n_recs);
    } else if (c->mode == CU_REPLAY) {
        c->mode = CU_EAGER;
        catch_up(c, take_prefix(c));
    }
    c->mode = CU_EAGER;
    c->step_ok = 0;
}

/* in a replay that no graph matches any more: capture the step from its start, re-issuing the records
 * that matched (their staged bytes are in the arena, which the graph's first node copies) */
static void recapture(be_ctx *c) {
    int n = take_prefix(c);
    c->mode = CU_EAGER;
    if (cu_check(c, cudaStreamBeginCapture(c->stream, cudaStreamCaptureModeRelaxed), "begin capture")) return;
    c->mode = CU_CAPTURE;
    c->n_recs = n;
    cu_check(c, cudaMemcpyAsync(c->arena_d + c->stage0, c->arena_h + c->stage0, CU_STEP_STAGE, cudaMemcpyHostToDevice, c->stream),
             "step staging copy");
    for (int i = 0; i < n && !c->err; i++) c->recs[i].fn(c, &c->recs[i]);
}

static void sync(be_ctx *c, const char *what) {
    cu_go_eager(c);
    cu_check(c, cudaStreamSynchronize(c->stream), what);
    c->arena_off = c->stage0 = 0;
}

/* stages n host arrays back to back with one copy; returns the device address of the first */
static const unsigned char *stage_parts(be_ctx *c, const void *const *host, const size_t *len, int n) {
    size_t bytes = 0;
    for (int i = 0; i < n; i++) bytes += len[i];
    size_t al = (bytes + 15) & ~(size_t)15;
    if (al > CU_ARENA_BYTES) {
        cu_check(c, cudaErrorInvalidValue, "staging: host array larger than the arena");
        return c->arena_d;
    }
    /* a graph step copies its first CU_STEP_STAGE bytes in one node at its start */
    if (c->mode != CU_EAGER && c->arena_off + al > c->stage0 + CU_STEP_STAGE) cu_go_eager(c);
    /* past the open step's half while a chained step may run: that step's staged bytes may not be copied yet */
    if (c->arena_off + al > CU_ARENA_BYTES || (c->am_kn && (!c->in_step || c->arena_off + al > c->stage0 + CU_STEP_STAGE)))
        sync(c, "staging arena wrap");
    if (!c->in_step) c->staged_out = 1;
    size_t off = c->arena_off, at = off;
    c->arena_off += al;
    for (int i = 0; i < n; i++) {
        if (len[i]) memcpy(c->arena_h + at, host[i], len[i]);
        at += len[i];
    }
    if (c->mode == CU_EAGER && bytes)
        cu_check(c, cudaMemcpyAsync(c->arena_d + off, c->arena_h + off, bytes, cudaMemcpyHostToDevice, c->stream), "staging copy");
    return c->arena_d + off;
}

const void *cu_stage(be_ctx *c, const void *host, size_t bytes) { return stage_parts(c, &host, &bytes, 1); }

int cu_span_bucket(int max_span) {
    int s = max_span > 256 ? max_span : 256, p2 = 256;
    while (p2 < s) p2 *= 2;
    int q = p2 >= 2048 ? p2 / 8 : 256;
    return (s + q - 1) / q * q;
}

void cu_rec_attn(be_ctx *c, cu_rec *r, const be_attn *a, int slot) {
    size_t nb = sizeof(int) * (size_t)a->B;   /* the four row arrays in one copy (eager prefill issues one per op) */
    const void *parts[4] = {a->pos0, a->len, a->seq, a->run0};
    size_t lens[4] = {nb, nb, nb, nb};
    const unsigned char *d = stage_parts(c, parts, lens, 4);
    for (int i = 0; i < 4; i++) r->p[slot + i] = d + i * nb;
    r->p[slot + 4] = a->pt;   /* device memory the cache uploads before the step: not staged */
    int sh = 0;
    while ((1 << sh) < a->page) sh++;
    r->i[CU_A_B] = a->B;
    r->i[CU_A_L] = a->L;
    r->i[CU_A_H] = a->n_head;
    r->i[CU_A_NKV] = a->n_kv_head;
    r->i[CU_A_HD] = a->head_dim;
    r->i[CU_A_SPAN] = cu_span_bucket(a->max_span);
    r->i[CU_A_PSH] = sh;
    r->i[CU_A_NPT] = a->n_pt;
    r->i[CU_A_WIN] = a->window;
    r->i[CU_A_KEEP] = a->keep;
}

void cu_submit(be_ctx *c, const cu_rec *r) {
    c->pf_bytes[0] = c->pf_bytes[1] = 0;   /* a prefetch_next hint goes with the next record only (submit_multi's) */
    if (c->err) return;
    if (r->fn != cu_matmul_launcher) c->act16_src = NULL;   /* the rounded copy may be stale now */
    if (c->mode == CU_REPLAY) {
        unsigned live = 0;
        for (int g = 0; g < CU_GRAPHS; g++)
            if ((c->live >> g & 1) && c->i_rec < c->graphs[g].n && !memcmp(r, &c->graphs[g].recs[c->i_rec], sizeof *r))
                live |= 1u << g;
        if (live) {
            c->live = live;
            c->i_rec++;
            return;
        }
        recapture(c);
    }
    if (c->mode == CU_CAPTURE) {
        if (c->n_recs < CU_MAX_RECS) c->recs[c->n_recs++] = *r;
        else cu_go_eager(c);
    }
    r->fn(c, r);
}

int cu_ensure(be_ctx *c, void **buf, size_t *have, size_t need) {
    if (need <= *have) return 1;
    sync(c, "workspace growth");
    drop_graph(c);
    if (buf == &c->act16) c->act16_src = NULL;
    cudaFree(*buf);
    *buf = NULL;
    *have = 0;
    size_t n = need + need / 4;
    cudaError_t e = cudaMalloc(buf, n);
    if (e != cudaSuccess) {
        take(c, e, cudaSuccess, "workspace allocation");
        *buf = NULL;
        return 0;
    }
    *have = n;
    return 1;
}

int cu_split_ws(be_ctx *c, const be_attn *a, int nsplit) {
    size_t need = (size_t)a->B * a->L * a->n_head * nsplit * (a->head_dim + 2) * sizeof(float);
    if (!cu_ensure(c, (void **)&c->part, &c->part_n, need)) return 0;
    size_t ncnt = (size_t)a->B * a->L * a->n_head * sizeof(int), had = c->cnt_n;
    if (!cu_ensure(c, (void **)&c->cnt, &c->cnt_n, ncnt)) return 0;
    if (c->cnt_n != had) cu_check(c, cudaMemsetAsync(c->cnt, 0, c->cnt_n, c->stream), "counter reset");
    return 1;
}

/* ------------------------------------------------------------ the table */

static void cuda_ctx_free(be_ctx *c) {
    if (!c) return;
    if (c->mode == CU_CAPTURE) cu_go_eager(c);
    if (c->stream) cudaStreamSynchronize(c->stream);
    drop_graph(c);
    if (c->blas) cublasDestroy(c->blas);
    cudaFree(c->blas_ws);
    cudaFree(c->act16);
    cudaFree(c->deq);
    cudaFree(c->part);
    cudaFree(c->cnt);
    cudaFree(c->score_out);
    cudaFree(c->sh_ws);
    if (c->sh_out_h) cudaFreeHost(c->sh_out_h);
    if (c->sh_ev) cudaEventDestroy(c->sh_ev);
    if (c->ord_ev) cudaEventDestroy(c->ord_ev);
    cudaFree(c->samp_mass);
    cudaFree(c->samp_edits);
    cudaFree(c->arena_d);
    if (c->arena_h) cudaFreeHost(c->arena_h);
    if (c->am_h) cudaFreeHost(c->am_h);
    cudaFree(c->am_d);
    cudaFree(c->am_part);
    cudaFree(c->am_cnt);
    for (int q = 0; q < 2; q++)
        if (c->am_ev[q]) cudaEventDestroy(c->am_ev[q]);
    if (c->stream) cudaStreamDestroy(c->stream);
    free(c->recs);
    free(c);
}

/* c's later ops after every op issued so far on other: an event recorded on other's stream, waited on by c's
 * (both eager first: their recorded ops issued, no capture open across the wait) */
static void cu_op_order_after(be_ctx *c, be_ctx *other) {
    if (c->err || other->err) return;
    cu_go_eager(c);
    cu_go_eager(other);
    if (!other->ord_ev && cu_check(c, cudaEventCreateWithFlags(&other->ord_ev, cudaEventDisableTiming), "order event")) return;
    if (!cu_check(c, cudaEventRecord(other->ord_ev, other->stream), "order event"))
        cu_check(c, cudaStreamWaitEvent(c->stream, other->ord_ev, 0), "order wait");
}

static int cuda_ctx_new(be_ctx **out, int n_threads) {
    (void)n_threads;
    *out = NULL;
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess || n < 1) {   /* no context to report to: the status is the answer; take only this error */
        if (e != cudaSuccess && cudaPeekAtLastError() == e) (void)cudaGetLastError();
        return 1;
    }
    be_ctx *c = (be_ctx *)calloc(1, sizeof *c);
    if (!c) return 1;
    c->recs = (cu_rec *)calloc(CU_MAX_RECS, sizeof *c->recs);
    c->last = -1;
    c->pdl = cf_knob_on("CINFER_CUDA_PDL");
    c->prefetch = cf_knob_on("CINFER_CUDA_PREFETCH");
    c->cluster = cf_knob_on("CINFER_CUDA_CLUSTER");
    c->dec_wide = cf_knob_on("CINFER_CUDA_DEC_WIDE");
    c->rope_fuse = cf_knob_on("CINFER_CUDA_ROPE_FUSE");
    c->kvq_rope = cf_knob_on("CINFER_CUDA_KVQ_ROPE");
    const char *lz = getenv("CINFER_CUDA_DEC_LAZY");   /* opt-in until a GPU has run it (session 50's device time ran out) */
    c->dec_lazy = lz && !strcmp(lz, "1");
    const char *gr = getenv("CINFER_CUDA_GEMV_ROWS");
    c->gemv_rows = gr ? atoi(gr) : 0;   /* 0: the default (gemm.cu) */
    const char *db = getenv("CINFER_CUDA_DEC_BLOCKS");
    c->dec_blocks = db ? atoi(db) : 1;
    c->dec_many = cf_knob_on("CINFER_CUDA_DEC_MANY");
    const char *tc = getenv("CINFER_CUDA_DEC_TC");   /* 0: never; 1: always; unset: see cuda.cuh */
    c->dec_tc = tc && !strcmp(tc, "0") ? 0 : tc && !strcmp(tc, "1") ? 2 : 1;
    c->batched = cf_knob_on("CINFER_CUDA_BATCHED");
    c->kq_pack = cf_knob_on("CINFER_CUDA_KQ_PACK");
    c->slice_real = cf_knob_on("CINFER_CUDA_SLICE_REAL");
    c->aff_gemv = cf_knob_on("CINFER_CUDA_AFF_GEMV");
    c->aff_tc = cf_knob_on("CINFER_CUDA_AFF_TC");
    c->aff_dp = cf_knob_on("CINFER_CUDA_AFF_DP");   /* 0: one token's 4-bit rows in f32 (tensor-core or CUDA-core form) */
    c->aff_ring = cf_knob_on("CINFER_CUDA_AFF_RING");
    c->am_step = cf_knob_on("CINFER_CUDA_ARGMAX_STEP");
    c->chain = cf_knob_on("CINFER_CUDA_CHAIN");
    c->am_last = c->am_pend = -1;
    const char *ad = getenv("CINFER_CUDA_AFR_D");
    c->afr_d = ad ? atoi(ad) : 0;
    const char *aw = getenv("CINFER_CUDA_AFR_W");
    c->afr_w = aw ? atoi(aw) : 16;
    c->x_ahead = cf_knob_on("CINFER_CUDA_X_AHEAD");
    c->dec_short = cf_knob_on("CINFER_CUDA_DEC_SHORT");
    const char *ab = getenv("CINFER_CUDA_AFR_BLOCKS");
    c->afr_blocks = ab ? atoi(ab) : 0;
    const char *l2n = getenv("CINFER_CUDA_L2_NEXT");
    c->l2_next = l2n && atoi(l2n) >= 0 && atoi(l2n) <= 8 ? atoi(l2n) : 4;
    c->score_head_k = cf_knob_on("CINFER_CUDA_SCORE_HEAD") ? 256 : 0;   /* 0: never; else bf16 heads of hidden <= 256 */
    int bad = !c->recs;
    bad = bad || cu_check(c, cudaGetDevice(&c->device), "cudaGetDevice");
    bad = bad || cu_check(c, cudaDeviceGetAttribute(&c->n_sm, cudaDevAttrMultiProcessorCount, c->device), "device attributes");
    bad = bad || cu_check(c, cudaDeviceGetAttribute(&c->l2_bytes, cudaDevAttrL2CacheSize, c->device), "device attributes");
    bad = bad || cu_check(c, cudaDeviceGetAttribute(&c->smem_optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, c->device), "device attributes");
    bad = bad || cu_check(c, cudaStreamCreateWithFlags(&c->stream, cudaStreamNonBlocking), "stream");
    bad = bad || cu_check_blas(c, cublasCreate(&c->blas), "cublasCreate");
    bad = bad || cu_check(c, cudaMalloc(&c->blas_ws, BLAS_WS_BYTES), "cuBLAS workspace");
    bad = bad || cu_check_blas(c, cublasSetStream(c->blas, c->stream), "cublasSetStream");
    bad = bad || cu_check_blas(c, cublasSetWorkspace(c->blas, c->blas_ws, BLAS_WS_BYTES), "cublasSetWorkspace");
    bad = bad || cu_check(c, cudaMallocHost((void **)&c->arena_h, CU_ARENA_BYTES), "pinned arena");
    bad = bad || cu_check(c, cudaMalloc((void **)&c->arena_d, CU_ARENA_BYTES), "device arena");
    bad = bad || cu_check(c, cudaMallocHost((void **)&c->am_h, sizeof *c->am_h * 3 * CU_AM_MAX), "pinned argmax keys");
    bad = bad || cu_check(c, cudaMalloc((void **)&c->am_d, sizeof *c->am_d * 3 * CU_AM_MAX), "argmax keys");
    bad = bad || cu_check(c, cudaMalloc((void **)&c->am_part, sizeof *c->am_part * CU_AM_MAX * 2 * (size_t)c->n_sm), "argmax partials");
    bad = bad || cu_check(c, cudaMalloc((void **)&c->am_cnt, sizeof *c->am_cnt * CU_AM_MAX), "argmax counters");
    bad = bad || cu_check(c, cudaMemset(c->am_cnt, 0, sizeof *c->am_cnt * CU_AM_MAX), "argmax counters");
    for (int q = 0; q < 2; q++)
        bad = bad || cu_check(c, cudaEventCreateWithFlags(&c->am_ev[q], cudaEventDisableTiming), "argmax event");
    if (bad) { cuda_ctx_free(c); return 1; }
    *out = c;
    return 0;
}

static int cuda_n_threads(const be_ctx *c) { (void)c; return 1; }

static void *cuda_alloc(be_ctx *c, size_t bytes) {
    cu_go_eager(c);
    void *p = NULL;
    cudaError_t e = cudaMalloc(&p, bytes ? bytes : 1);
    if (e != cudaSuccess) {   /* out of memory is the caller's to report (NULL); anything else is recorded */
        take(c, e, cudaErrorMemoryAllocation, "cudaMalloc");
        return NULL;
    }
    if (cu_check(c, cudaMemsetAsync(p, 0, bytes, c->stream), "alloc memset")) { cudaFree(p); return NULL; }
    return p;
}

static void cuda_free(be_ctx *c, void *p) {
    if (!p) return;
    c->act16_src = NULL;
    sync(c, "free");
    cu_check(c, cudaFree(p), "cudaFree");
}

static void cuda_to_host(be_ctx *c, void *dst, const void *src, size_t bytes) {
    cu_go_eager(c);
    cu_check(c, cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, c->stream), "copy to host");
    sync(c, "copy to host");
}

static void cuda_from_host(be_ctx *c, void *dst, const void *src, size_t bytes) {
    cu_go_eager(c);
    c->act16_src = NULL;
    cu_check(c, cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, c->stream), "copy from host");
    sync(c, "copy from host");
}

static void cuda_copy(be_ctx *c, void *dst, const void *src, size_t bytes) {
    cu_go_eager(c);
    c->act16_src = NULL;
    cu_check(c, cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, c->stream), "device copy");
}

static int cuda_mat_prepare(be_ctx *c, be_mat *m) {
    if (m->dev) return 0;
    if (be_traits(m->dt)->affine) return cu_affine_upload(c, m);   /* affine.cu */
    size_t bytes = (size_t)m->rows * (size_t)m->cols * be_dtype_size(m->dt);
    void *p = NULL;
    if (cu_check(c, cudaMalloc(&p, bytes ? bytes : 1), "weight allocation")) return 1;
    if (cu_check(c, cudaMemcpy(p, m->data, bytes, cudaMemcpyHostToDevice), "weight upload")) { cudaFree(p); return 1; }
    m->dev = p;
    return 0;
}

static void cuda_mat_release(be_ctx *c, be_mat *m) {
    (void)c;
    if (m->dev) cudaFree(m->dev);
    m->dev = NULL;
}

/* reports the first error and clears it so the next forward can run: closes a
 * capture left open, drops the graph, drains the stream, zeroes the split-K
 * counters (a launch that failed or was dropped may have left them part
 * counted). A fault that poisoned the device context fails the drain and is
 * reported again by the next call: CUDA cannot recover those in-process. */
static int cuda_status(be_ctx *c, char *msg, size_t n) {
    cu_clear_expected(c, cudaSuccess, "asynchronous error");
    if (msg && n) msg[0] = 0;
    if (!c->err) return 0;
    int err = c->err;
    if (msg && n) snprintf(msg, n, "%s", c->msg);
    if (c->mode == CU_CAPTURE) {
        cudaGraph_t g = NULL;
        cudaStreamEndCapture(c->stream, &g);   /* its result is the error being reported */
        if (g) cudaGraphDestroy(g);
    }
    c->mode = CU_EAGER;
    c->in_step = 0;
    c->step_ok = 0;
    drop_graph(c);
    c->act16_src = NULL;
    c->err = 0;
    c->msg[0] = 0;
    cudaError_t e = cudaStreamSynchronize(c->stream);
    if (e == cudaSuccess && c->cnt_n) e = cudaMemsetAsync(c->cnt, 0, c->cnt_n, c->stream);
    if (e == cudaSuccess) e = cudaMemsetAsync(c->am_cnt, 0, sizeof *c->am_cnt * CU_AM_MAX, c->stream);
    c->am_kn = 0, c->am_last = c->am_pend = -1, c->am_out = NULL;
    if (e == cudaSuccess) e = cudaStreamSynchronize(c->stream);
    cu_clear_expected(c, e, "recovery after an error");
    if (e != cudaSuccess) cu_check(c, e, "recovery after an error");   /* sticky: the next status reports it */
    c->arena_off = c->stage0 = 0;
    return err;
}

static size_t cuda_mem_available(be_ctx *c) {
    size_t fr = 0, tot = 0;
    cudaError_t e = cudaMemGetInfo(&fr, &tot);
    if (e != cudaSuccess) { take(c, e, cudaSuccess, "cudaMemGetInfo"); return 0; }
    return fr;
}

static void cuda_batch_invariant(be_ctx *c, int on) { c->batch_inv = on != 0; }

static void cuda_step_begin(be_ctx *c) {
    if (c->in_step) cu_go_eager(c);
    if (c->am_kn == 1 && !c->staged_out && !c->err) {
        /* the step before kept its argmax on the device and nothing was staged since: this step is issued while
         * that one runs, its host arrays in the other half of the arena (the step before that one is done: its
         * result was taken) */
        c->mode = CU_EAGER;
        c->stage0 = c->stage0 ? 0 : CU_STEP_STAGE;
        c->arena_off = c->stage0;
    } else {
        sync(c, "step begin");
    }
    if (c->err) return;   /* no capture is opened while an error is pending */
    c->in_step = 1;
    c->step_ok = 1;
    c->live = 0;
    for (int g = 0; g < CU_GRAPHS; g++) c->live |= (unsigned)(c->graphs[g].exec != NULL) << g;
    if (c->live) {
        c->mode = CU_REPLAY;
        c->i_rec = 0;
    } else if (!cu_check(c, cudaStreamBeginCapture(c->stream, cudaStreamCaptureModeRelaxed), "begin capture")) {
        c->mode = CU_CAPTURE;
        c->n_recs = 0;
        /* the graph's first node: every host array the step stages, in one copy (the pinned
         * arena is filled by the ops before the graph is launched or replayed) */
        cu_check(c, cudaMemcpyAsync(c->arena_d + c->stage0, c->arena_h + c->stage0, CU_STEP_STAGE, cudaMemcpyHostToDevice, c->stream),
                 "step staging copy");
    }
}

void cu_step_launch(be_ctx *c) {
    if (!c->in_step) return;
    c->in_step = 0;
    if (c->mode == CU_CAPTURE) {
        cudaGraph_t g = NULL;
        cudaError_t e = cudaStreamEndCapture(c->stream, &g);
        cudaGraphExec_t ex = NULL;
        if (e == cudaSuccess && g && !c->err) e = cudaGraphInstantiate(&ex, g, 0);
        if (g) cudaGraphDestroy(g);
        c->mode = CU_EAGER;
        if (c->err) { if (ex) cudaGraphExecDestroy(ex); return; }   /* a failed step is not launched; status reports it */
        if (e != cudaSuccess || !ex) {   /* an invalidated capture or a graph that cannot instantiate: run eagerly */
            take(c, e, e, "graph");
            catch_up(c, c->n_recs);   /* nothing ran yet: run it eagerly */
            return;
        }
        int slot = 0;   /* a free slot, else the least recently used */
        for (int k = 1; k < CU_GRAPHS; k++)
            if (c->graphs[slot].exec && (!c->graphs[k].exec || c->graphs[k].used < c->graphs[slot].used)) slot = k;
        cu_graph *gr = &c->graphs[slot];
        free_graph(gr);
        gr->recs = (cu_rec *)malloc(sizeof *gr->recs * (size_t)(c->n_recs ? c->n_recs : 1));
        if (!gr->recs) {   /* launched once, not kept */
            cu_check(c, cudaGraphLaunch(ex, c->stream), "graph launch");
            cudaGraphExecDestroy(ex);
            return;
        }
        memcpy(gr->recs, c->recs, sizeof *gr->recs * (size_t)c->n_recs);
        gr->exec = ex;
        gr->n = c->n_recs;
        gr->used = ++c->tick;
        c->last = slot;
        c->n_captures++;
        cu_check(c, cudaGraphLaunch(ex, c->stream), "graph launch");
    } else if (c->mode == CU_REPLAY) {
        int g = -1;
        for (int k = 0; k < CU_GRAPHS && g < 0; k++)
            if ((c->live >> k & 1) && c->graphs[k].n == c->i_rec) g = k;
        if (g < 0) {   /* the step issued a prefix of every live graph: capture it as it is */
            recapture(c);
            c->in_step = 1;
            cu_step_launch(c);
            return;
        }
        c->mode = CU_EAGER;
        c->n_replays++;
        c->graphs[g].used = ++c->tick;
        c->last = g;
        cu_check(c, cudaGraphLaunch(c->graphs[g].exec, c->stream), "graph replay");
    }
    c->mode = CU_EAGER;
}

/* the step's graph launched; an argmax issued in it (cu_op_argmax) waited for and its keys read */
static void cuda_step_end(be_ctx *c) {
    const int was = c->in_step;
    cu_step_launch(c);
    if (was) c->staged_out = 0;
    if (c->am_pend >= 0) {   /* a kept result: queued behind an event, no wait */
        const int q = c->am_pend;
        c->am_pend = -1;
        if (!c->err && !cu_check(c, cudaEventRecord(c->am_ev[q], c->stream), "argmax event")) {
            c->am_fifo[c->am_kn++] = q;
            c->am_last = q;
        }
    }
    cu_argmax_settle(c);
}

extern "C" void cuda_graph_stats(const be_ctx *c, long *captures, long *replays) {
    *captures = c->n_captures;
    *replays = c->n_replays;
}

extern "C" int cuda_graph_replay_time(be_ctx *c, int reps, double *seconds) {
    *seconds = 0;
    if (c->last < 0 || !c->graphs[c->last].exec || reps <= 0) return 1;
    cudaGraphExec_t ex = c->graphs[c->last].exec;
    cudaEvent_t e0, e1;
    if (cudaEventCreate(&e0) != cudaSuccess) return 1;
    if (cudaEventCreate(&e1) != cudaSuccess) { cudaEventDestroy(e0); return 1; }
    int bad = cudaStreamSynchronize(c->stream) != cudaSuccess || cudaEventRecord(e0, c->stream) != cudaSuccess;
    for (int r = 0; r < reps && !bad; r++) bad = cudaGraphLaunch(ex, c->stream) != cudaSuccess;
    float ms = 0;
    bad = bad || cudaEventRecord(e1, c->stream) != cudaSuccess || cudaEventSynchronize(e1) != cudaSuccess ||
          cudaEventElapsedTime(&ms, e0, e1) != cudaSuccess;
    cudaEventDestroy(e0);
    cudaEventDestroy(e1);
    *seconds = ms * 1e-3 / reps;
    return bad;
}

static be_ops make_ops(void) {
    be_ops o;
    memset(&o, 0, sizeof o);
    o.name = "cuda";
    o.ctx_new = cuda_ctx_new;
    o.ctx_free = cuda_ctx_free;
    o.n_threads = cuda_n_threads;
    o.alloc = cuda_alloc;
    o.free = cuda_free;
    o.to_host = cuda_to_host;
    o.from_host = cuda_from_host;
    o.copy = cuda_copy;
    o.mat_prepare = cuda_mat_prepare;
    o.mat_release = cuda_mat_release;
    o.embed = cu_op_embed;
    o.matmul = cu_op_matmul;
    o.rmsnorm = cu_op_rmsnorm;
    o.rope = cu_op_rope;
    o.glu = cu_op_glu;
    o.scale = cu_op_scale;
    o.softcap = cu_op_softcap;
    o.add = cu_op_add;
    o.gather = cu_op_gather;
    o.kv_write = cu_op_kv_write;
    o.attention = cu_op_attention;
    o.status = cuda_status;
    o.mem_available = cuda_mem_available;
    o.batch_invariant = cuda_batch_invariant;
    o.step_begin = cuda_step_begin;
    o.step_end = cuda_step_end;
    o.argmax = cu_op_argmax;
    o.argmax_take = cu_op_argmax_take;
    o.score = cu_op_score;
    o.score_head = cu_op_score_head;
    o.score_take = cu_op_score_take;
    o.order_after = cu_op_order_after;
    o.sample = cu_op_sample;
    o.graph_stats = cuda_graph_stats;
    o.matmul_multi = cu_op_matmul_multi;
    o.norm_matmul = cu_op_norm_matmul;
    o.matmul_add = cu_op_matmul_add;
    o.prefetch_next = cu_op_prefetch_next;
    o.rope_kv_write = cu_op_rope_kv_write;
    o.rope_kv_attend = cu_op_rope_kv_attend;
    o.kvq_write = cu_op_kvq_write;
    o.rope_kvq_write = cu_op_rope_kvq_write;
    o.kvq_attention = cu_op_kvq_attention;
    return o;
}

static const be_ops cuda_ops = make_ops();

extern "C" const be_ops *be_cuda(void) { return &cuda_ops; }
