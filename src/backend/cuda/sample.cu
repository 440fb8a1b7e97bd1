/*
 * sample.cu — be_ops.sample on the device (the definition: backend.h and
 * cpu/ref-sample.c, which this follows step for step): a decode step's rows
 * become tokens without their logits leaving the GPU; per row only a
 * be_sample_out (172 bytes) crosses to the host.
 *
 * One cluster of 4 blocks of 1024 threads a row (a 32-row step fills 128 SMs;
 * one block a row was instruction bound on 32 SMs: ncu, 648 us for 32 rows of
 * 128,256): each block takes every 4th stretch of 1024 ids in the strided
 * passes, and the blocks' partials are combined through distributed shared
 * memory in rank order. The logits row stays where the LM head wrote it
 * (L2-resident at decode sizes) and is read once a pass: the argmax, the
 * masses (written once to a u64 workspace [n][V]), each radix-select pass,
 * the draw. A byte of the key has few distinct values among a row's
 * logits, so the radix histograms would serialize on one bin: a thread sums
 * into 4 (bin, sum) registers and adds a sum to its warp's histogram (64 kB
 * of shared memory in all) only when it evicts it; merged in a fixed order.
 * Masses are integers, so every sum is exact and the block's order of adding
 * does not matter: the device draws the reference's token. Walks in id order
 * (ties at a threshold, the draw) give each warp a contiguous range (lanes on
 * consecutive ids) and scan within the one warp that holds the crossing.
 */
#include <cooperative_groups.h>
#include "backend/cuda/cuda.cuh"
#include "backend/cuda/cuda-api.h"

namespace cg = cooperative_groups;

#define SP_T 1024
#define SP_W (SP_T / 32)
#define SP_CL 4            /* blocks of a row (one thread block cluster) */
#define SP_GW (SP_CL * SP_W)   /* warps of a row */
#define SP_U 4             /* elements a thread loads before using any */

struct sp_smem {
    unsigned long long hist[SP_W][256];   /* per-warp radix histograms; [0] the block's after the merge */
    unsigned long long hsum[256];         /* the cluster's histogram */
    unsigned long long w64[SP_W];         /* per-warp partials */
    unsigned long long gw64[SP_GW];       /* the row's per-warp sums (sp_first_reaching) */
    double wd[SP_W];
    unsigned long long c64;               /* this block's partial of a cluster reduction (read by the others) */
    double cd;
    int found;                            /* sp_first_reaching: the id this block's walk found (INT_MAX: none) */
    unsigned long long b64;
    int bi;
};

__device__ __forceinline__ unsigned sp_key(float v) {
    if (v != v) v = -INFINITY;
    unsigned u = __float_as_uint(v);
    return (u & 0x80000000u) ? ~u : u | 0x80000000u;
}

__device__ __forceinline__ float sp_val(float v) { return v == v ? v : -INFINITY; }

/* a prefix of the order (logit descending, then id): key > T, or key == T and id <= cut; on == 0: everything */
struct sp_set {
    unsigned T;
    int cut, on;
};

__device__ __forceinline__ bool sp_in(const sp_set &s, unsigned k, int i) { return !s.on || k > s.T || (k == s.T && i <= s.cut); }

/* the block's share of a row: ids rank * SP_T + threadIdx.x + k * SP_CL * SP_T */
#define SP_STRIDE (SP_CL * SP_T)
__device__ __forceinline__ int sp_first(const cg::cluster_group &cl) { return (int)cl.block_rank() * SP_T + (int)threadIdx.x; }

/* the shared slots of a reduction of T: per-warp partials and this block's partial */
__device__ __forceinline__ unsigned long long *sp_wslot(sp_smem &s, unsigned long long) { return s.w64; }
__device__ __forceinline__ double *sp_wslot(sp_smem &s, double) { return s.wd; }
__device__ __forceinline__ unsigned long long *sp_cslot(sp_smem &s, unsigned long long) { return &s.c64; }
__device__ __forceinline__ double *sp_cslot(sp_smem &s, double) { return &s.cd; }

template <int OP, class T>
__device__ __forceinline__ T sp_op(T a, T b) { return OP ? (b > a ? b : a) : a + b; }

/* block reductions, then the cluster's: each block's partial read by every block in rank order (the same
 * result everywhere, whatever the timing); OP 0 sum, 1 max; T u64 or double */
template <int OP, class T>
__device__ T sp_red(sp_smem &s, const cg::cluster_group &cl, T v) {
    T *ws = sp_wslot(s, v), *cs = sp_cslot(s, v);
#pragma unroll
    for (int o = 16; o; o >>= 1) v = sp_op<OP>(v, (T)__shfl_xor_sync(0xffffffffu, v, o));
    __syncthreads();
    if ((threadIdx.x & 31) == 0) ws[threadIdx.x >> 5] = v;
    __syncthreads();
    if (threadIdx.x == 0) {
        T t = 0;
        for (int w = 0; w < SP_W; w++) t = sp_op<OP>(t, ws[w]);
        *cs = t;
    }
    cl.sync();
    T t = 0;
    for (unsigned r = 0; r < SP_CL; r++) t = sp_op<OP>(t, *cl.map_shared_rank(cs, r));
    cl.sync();
    return t;
}

/* Walks ids in ascending order: the first id at which the running sum of wt(i) reaches need (dflt when none
 * does); with u (the draw), need = floor(u * total) + 1 (at most the total) instead. Each of the row's warps
 * owns a contiguous range of ids, its lanes reading consecutive ids: the warps' sums, then the one warp whose
 * range holds the crossing walks it 32 ids at a time with a warp scan. */
template <class W>
__device__ int sp_first_reaching(sp_smem &s, const cg::cluster_group &cl, int V, const W &wt, unsigned long long need,
                                 const double *u, int dflt) {
    int lane = threadIdx.x & 31, w = threadIdx.x >> 5, gw = (int)cl.block_rank() * SP_W + w;
    int ch = ((V + SP_GW - 1) / SP_GW + 31) & ~31, lo = min(V, gw * ch), hi = min(V, lo + ch);
    unsigned long long mine = 0;
#pragma unroll 4
    for (int i = lo + lane; i < hi; i += 32) mine += wt(i);
#pragma unroll
    for (int o = 16; o; o >>= 1) mine += __shfl_xor_sync(0xffffffffu, mine, o);
    __syncthreads();
    if (lane == 0) s.w64[w] = mine;
    if (threadIdx.x == 0) s.found = INT_MAX;
    cl.sync();
    if (threadIdx.x < SP_GW) s.gw64[threadIdx.x] = *cl.map_shared_rank(&s.w64[threadIdx.x % SP_W], threadIdx.x / SP_W);
    __syncthreads();
    unsigned long long before = 0, t = 0;
    for (int k = 0; k < SP_GW; k++) {
        before += k < gw ? s.gw64[k] : 0;
        t += s.gw64[k];
    }
    if (u) {
        unsigned long long r = (unsigned long long)(*u * (double)t);
        need = (r < t ? r : t - 1) + 1;
    }
    if (before < need && before + mine >= need) {   /* warp-uniform: this warp's range holds the crossing */
        unsigned long long acc = before;
        for (int i0 = lo; i0 < hi; i0 += 32) {
            int i = i0 + lane;
            unsigned long long inc = i < hi ? wt(i) : 0;
#pragma unroll
            for (int o = 1; o < 32; o <<= 1) {
                unsigned long long y = __shfl_up_sync(0xffffffffu, inc, o);
                if (lane >= o) inc += y;
            }
            unsigned hit = __ballot_sync(0xffffffffu, acc + inc >= need);
            if (hit) {
                if (lane == __ffs(hit) - 1) s.found = i;
                break;
            }
            acc += __shfl_sync(0xffffffffu, inc, 31);
        }
    }
    cl.sync();
    int r = INT_MAX;
    for (unsigned k = 0; k < SP_CL; k++) r = min(r, *cl.map_shared_rank(&s.found, k));
    cl.sync();
    return r == INT_MAX ? dflt : r;
}

/* weights of the walks: the ties at key T within S (mass or count), and the kept ids' masses */
template <bool MASS>
struct sp_tie_w {
    const float *z;
    const unsigned long long *m;
    sp_set S;
    unsigned T;
    __device__ unsigned long long operator()(int i) const {
        unsigned k = sp_key(z[i]);
        return k == T && sp_in(S, k, i) ? (MASS ? m[i] : 1ull) : 0;
    }
};

struct sp_kept_w {
    const float *z;
    const unsigned long long *m;
    sp_set S, P;
    double floor_m;
    __device__ unsigned long long operator()(int i) const {
        unsigned k = sp_key(z[i]);
        return sp_in(S, k, i) && sp_in(P, k, i) && (double)m[i] >= floor_m ? m[i] : 0;
    }
};

/* the shortest prefix of the order, within S, whose weight (masses m, or counts) reaches need (ref-sample.c's
 * select_prefix) */
template <bool MASS>
__device__ sp_set sp_select(sp_smem &s, const cg::cluster_group &cl, const float *z, const unsigned long long *m, int V,
                            sp_set S, unsigned long long need) {
    unsigned pre = 0, msk = 0;
    int w = threadIdx.x >> 5;
    for (int sh = 24; sh >= 0; sh -= 8) {
        __syncthreads();
        for (int b = threadIdx.x; b < SP_W * 256; b += SP_T) (&s.hist[0][0])[b] = 0;
        __syncthreads();
        /* a thread's adds go through 4 (bin, sum) registers, flushed to the warp's histogram when a bin is
         * not among them: the few bins a byte of the logits' keys takes get few atomics */
        int cb[4] = {-1, -1, -1, -1}, rr = 0;
        unsigned long long cs[4] = {0, 0, 0, 0};
        for (int i0 = sp_first(cl); i0 < V; i0 += SP_U * SP_STRIDE) {
            unsigned kq[SP_U];
            unsigned long long xq[SP_U];
#pragma unroll
            for (int q = 0; q < SP_U; q++) {   /* the loads of SP_U elements first */
                int i = i0 + q * SP_STRIDE;
                kq[q] = i < V ? sp_key(z[i]) : 0;
                xq[q] = MASS && i < V ? m[i] : 1ull;
            }
#pragma unroll
            for (int q = 0; q < SP_U; q++) {
                int i = i0 + q * SP_STRIDE;
                unsigned k = kq[q];
                if (i >= V || (k & msk) != pre || !sp_in(S, k, i)) continue;
                unsigned long long x = xq[q];
                int bin = (int)((k >> sh) & 255);
                if (bin == cb[0]) cs[0] += x;
                else if (bin == cb[1]) cs[1] += x;
                else if (bin == cb[2]) cs[2] += x;
                else if (bin == cb[3]) cs[3] += x;
                else {   /* evict round robin */
#pragma unroll
                    for (int e = 0; e < 4; e++)
                        if (e == rr) {
                            if (cb[e] >= 0 && cs[e]) atomicAdd(&s.hist[w][cb[e]], cs[e]);
                            cb[e] = bin;
                            cs[e] = x;
                        }
                    rr = (rr + 1) & 3;
                }
            }
        }
#pragma unroll
        for (int q = 0; q < 4; q++)
            if (cb[q] >= 0 && cs[q]) atomicAdd(&s.hist[w][cb[q]], cs[q]);
        __syncthreads();
        if (threadIdx.x < 256) {   /* merge the warps' histograms in a fixed order */
            unsigned long long t = 0;
            for (int k = 0; k < SP_W; k++) t += s.hist[k][threadIdx.x];
            s.hist[0][threadIdx.x] = t;
        }
        cl.sync();
        if (threadIdx.x < 256) {   /* ... and the cluster's blocks, in rank order */
            unsigned long long t = 0;
            for (unsigned r = 0; r < SP_CL; r++) t += cl.map_shared_rank(&s.hist[0][0], r)[threadIdx.x];
            s.hsum[threadIdx.x] = t;
        }
        cl.sync();   /* every block has read the others' histograms: they may be cleared */
        if (threadIdx.x == 0) {
            unsigned long long cum = 0;
            int d = 0;
            for (int b = 255; b >= 0; b--) {
                if (cum + s.hsum[b] >= need) { d = b; break; }
                cum += s.hsum[b];
            }
            s.bi = d;
            s.b64 = cum;
        }
        __syncthreads();
        need -= s.b64;
        pre |= (unsigned)s.bi << sh;
        msk |= 0xffu << sh;
    }
    sp_tie_w<MASS> wt = {z, m, S, pre};
    sp_set r = {pre, sp_first_reaching(s, cl, V, wt, need, (const double *)NULL, V - 1), 1};
    return r;
}

/* one row per cluster of SP_CL blocks */
__global__ void __cluster_dims__(SP_CL, 1, 1) __launch_bounds__(SP_T)
    k_sample(float *zall, int V, const be_sample_row *prm, const be_logit_edit *edits, unsigned long long *mall,
             be_sample_out *out) {
    PDL_ENTRY();
    extern __shared__ __align__(16) unsigned char sp_raw[];
    sp_smem &s = *reinterpret_cast<sp_smem *>(sp_raw);
    cg::cluster_group cl = cg::this_cluster();
    int row = blockIdx.x / SP_CL, rank = (int)cl.block_rank();
    const be_sample_row p = prm[row];
    float *z = zall + (size_t)row * V;
    unsigned long long *m = mall ? mall + (size_t)row * V : NULL;
    if (rank == 0 && threadIdx.x == 0) {
        for (int e = 0; e < p.n_edit; e++) {
            const be_logit_edit *ed = &edits[p.edit0 + e];
            if (ed->tok >= 0 && ed->tok < V) z[ed->tok] = be_apply_edit(z[ed->tok], ed);
        }
        __threadfence();
    }
    cl.sync();   /* the edits, seen by the cluster's blocks */
    unsigned long long bk = 0;   /* the order as one number: key << 32 | ~id, the largest first */
#pragma unroll 4
    for (int i = sp_first(cl); i < V; i += SP_STRIDE) {
        unsigned long long k = (unsigned long long)sp_key(z[i]) << 32 | (unsigned)~i;
        bk = k > bk ? k : bk;
    }
    bk = sp_red<1>(s, cl, bk);
    int best = (int)~(unsigned)bk;
    float zb = sp_val(z[best]), lse = NAN;
    be_sample_out *o = &out[row];
    if (p.n_top >= 0) {
        double sum = 0;
#pragma unroll 4
        for (int i = sp_first(cl); i < V; i += SP_STRIDE) sum += exp((double)sp_val(z[i]) - zb);
        lse = zb + (float)log(sp_red<0>(s, cl, sum));
        unsigned long long prev = ~0ull;
        for (int j = 0; j < p.n_top && j < V && j < BE_SAMPLE_TOP; j++) {
            unsigned long long mx = 0;
#pragma unroll 4
            for (int i = sp_first(cl); i < V; i += SP_STRIDE) {
                unsigned long long k = (unsigned long long)sp_key(z[i]) << 32 | (unsigned)~i;
                mx = k < prev && k > mx ? k : mx;
            }
            prev = sp_red<1>(s, cl, mx);
            int id = (int)~(unsigned)prev;
            if (rank == 0 && threadIdx.x == 0) {
                o->top_id[j] = id;
                o->top_lp[j] = sp_val(z[id]) - lse;
            }
        }
    }
    int tok = best;
    float zt = zb * p.inv_temp;
    if (p.inv_temp > 0 && isfinite(zt) && m) {
        for (int i0 = sp_first(cl); i0 < V; i0 += SP_U * SP_STRIDE) {
            float v[SP_U];
#pragma unroll
            for (int q = 0; q < SP_U; q++) v[q] = i0 + q * SP_STRIDE < V ? sp_val(z[i0 + q * SP_STRIDE]) : 0.0f;
#pragma unroll
            for (int q = 0; q < SP_U; q++)
                if (i0 + q * SP_STRIDE < V)
                    m[i0 + q * SP_STRIDE] = (unsigned long long)__double2ll_rn(exp((double)(v[q] * p.inv_temp) - (double)zt) * 0x1p40);
        }
        __threadfence();   /* the walks read masses other blocks wrote (after the cluster barriers below) */
        cl.sync();
        sp_set all = {0, 0, 0}, S = all, P = all;
        if (p.top_k > 0 && p.top_k < V) S = sp_select<false>(s, cl, z, m, V, all, (unsigned long long)p.top_k);
        if (p.top_p < 1.0f) {
            unsigned long long Zm = 0;
#pragma unroll 4
            for (int i = sp_first(cl); i < V; i += SP_STRIDE) Zm += sp_in(S, sp_key(z[i]), i) ? m[i] : 0;
            Zm = sp_red<0>(s, cl, Zm);
            double nd = ceil((double)p.top_p * (double)Zm);
            unsigned long long need = nd < 1 ? 1 : nd >= (double)Zm ? Zm : (unsigned long long)nd;
            P = sp_select<true>(s, cl, z, m, V, S, need);
        }
        sp_kept_w kw = {z, m, S, P, (double)p.min_p * 0x1p40};
        tok = sp_first_reaching(s, cl, V, kw, 0, &p.u, best);   /* r = floor(u * mass(kept)): the id where it is passed */
    }
    if (rank == 0 && threadIdx.x == 0) {
        o->tok = tok;
        o->zmax = zb;
        o->lp = p.n_top >= 0 ? sp_val(z[tok]) - lse : NAN;
    }
}

void cu_op_sample(be_ctx *c, float *z, int n, int V, const be_sample_row *p, const be_logit_edit *edits, int n_edits,
                  be_sample_out *out) {
    if (n <= 0 || V <= 0) return;
    cu_go_eager(c);
    int any_t = 0;
    for (int i = 0; i < n; i++) any_t |= p[i].inv_temp > 0;
    if (!cu_ensure(c, &c->score_out, &c->score_out_n, sizeof(be_sample_out) * (size_t)n) ||
        (any_t && !cu_ensure(c, &c->samp_mass, &c->samp_mass_n, sizeof(unsigned long long) * (size_t)n * V)) ||
        (n_edits > 0 && !cu_ensure(c, &c->samp_edits, &c->samp_edits_n, sizeof(be_logit_edit) * (size_t)n_edits))) {
        cu_check(c, cudaErrorMemoryAllocation, "sample workspace");
        return;
    }
    if (n_edits > 0 &&
        cu_check(c, cudaMemcpyAsync(c->samp_edits, edits, sizeof(be_logit_edit) * (size_t)n_edits, cudaMemcpyHostToDevice, c->stream),
                 "sample edits"))
        return;
    const be_sample_row *d_p = (const be_sample_row *)cu_stage(c, p, sizeof *p * (size_t)n);
    be_sample_out *d_out = (be_sample_out *)c->score_out;
    size_t smem = sizeof(sp_smem);
    if (cu_check(c, cudaFuncSetAttribute(k_sample, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem), "sample smem")) return;
    cu_launch_cluster(c, 0, k_sample, dim3((unsigned)n * SP_CL), dim3(SP_T), smem, z, V, d_p, (const be_logit_edit *)c->samp_edits,
              any_t ? (unsigned long long *)c->samp_mass : (unsigned long long *)NULL, d_out);
    if (!CU_LAUNCHED(c, "sample") &&
        !cu_check(c, cudaMemcpyAsync(out, d_out, sizeof *out * (size_t)n, cudaMemcpyDeviceToHost, c->stream), "sample copy") &&
        !cu_check(c, cudaStreamSynchronize(c->stream), "sample sync"))
        c->arena_off = 0;   /* drained: the staged arrays are consumed */
}
