/*
 * attn-decode.cu — attention of few queries (decode steps) over an f16 or
 * bf16 paged KV pool, head_dim 64 or 128, up to DEC_GMAX q heads per kv
 * head: the kernels behind cu_op_attention's ATT_DECODE path, on CUDA cores
 * (k_attn_decode, short spans) and on tensor cores (k_attn_dec_tc, from
 * DEC_TC_SPAN keys; cu_attn_decode_tc chooses), one tail (dec_tail) merging
 * the slices of both (attention.cu
 * holds the op, the split-K kernel for everything else and the flash kernel
 * for prefill). Mask and layout as attention.cu: the keys a query sees are
 * numbered by cu_span_of (sinks, then the run) and slices take ranges of
 * those numbers; each key row is found through the page table. The slice
 * geometry depends on the bucketed span bound only, never the position, so
 * a captured decode graph stays valid while positions move. Reference: Dao
 * et al., Flash-Decoding (2023).
 */
#include <math.h>
#include <cooperative_groups.h>
#include <type_traits>
#include "backend/cuda/cuda.cuh"
#include "backend/cuda/mma.cuh"
#include "backend/cuda/dec-tc.cuh"

#define DEC_SUB 64       /* keys in shared memory at a time */
#define DEC_THREADS 128
#define DEC_GMAX 8       /* q heads per kv head at most */
#define DEC_SMAX 64      /* slices per (query, kv head) at most */
#define DEC_CMAX 8       /* slices merged within a thread block cluster at most (the portable cluster size) */

/* 16-bit pool pairs as floats */
__device__ __forceinline__ float2 dec_f2(const __half2 *p, int t) { return __half22float2(p[t]); }
__device__ __forceinline__ float2 dec_f2(const __nv_bfloat162 *p, int t) { return __bfloat1622float2(p[t]); }
template <typename KT> struct dec_pair;
template <> struct dec_pair<__half> { typedef __half2 t; };
template <> struct dec_pair<__nv_bfloat16> { typedef __nv_bfloat162 t; };
/* two floats rounded to the pool's type (as cu_kv_put), a in the low half */
__device__ __forceinline__ uint32_t dec_pack(float a, float b, __half) {
    return (uint32_t)__half_as_ushort(__float2half_rn(a)) | (uint32_t)__half_as_ushort(__float2half_rn(b)) << 16;
}
__device__ __forceinline__ uint32_t dec_pack(float a, float b, __nv_bfloat16) {
    return (uint32_t)__bfloat16_as_ushort(__float2bfloat16_rn(a)) | (uint32_t)__bfloat16_as_ushort(__float2bfloat16_rn(b)) << 16;
}

/* The end of a decode block: its partial (m, l in mrun, lrun; o in osh for a cluster, else already in
 * part) merged with its slices' (cluster: after a cluster barrier, from the peers' shared memory;
 * else by the last block to arrive, through part: dec_merge). wt_, lt_: DEC_GMAX x DEC_SMAX floats of
 * shared scratch. */
template <int HD, bool CL, int T>
__device__ __forceinline__ void dec_tail(int s, int nsplit, int g, int bi, int H, int kvh, int n_kv, int valid, const float *part,
                                         float *mrun, float *lrun, float *osh, float *wt_, float *lt_, int *cnt, float *out) {
    int tid = threadIdx.x;
    if (CL) {   /* the slices of a (query, kv head) are one cluster: each block merges a share of the outputs
                 * from every block's shared memory, all of an output's loads issued together */
        cooperative_groups::cluster_group cl = cooperative_groups::this_cluster();
        cl.sync();
        for (int e = s * T + tid; e < g * HD; e += nsplit * T) {
            int h = e / HD;
            float ms[DEC_CMAX], ls[DEC_CMAX], os[DEC_CMAX], M = -INFINITY;
#pragma unroll
            for (int r = 0; r < DEC_CMAX; r++) {
                if (r >= nsplit) break;
                ms[r] = *cl.map_shared_rank(&mrun[h], r);
                ls[r] = *cl.map_shared_rank(&lrun[h], r);
                os[r] = *cl.map_shared_rank(osh + e, r);
            }
#pragma unroll
            for (int r = 0; r < DEC_CMAX; r++)
                if (r < nsplit) M = fmaxf(M, ms[r]);
            float l = 0.0f, o = 0.0f;
#pragma unroll
            for (int r = 0; r < DEC_CMAX; r++)
                if (r < nsplit && ms[r] != -INFINITY) {
                    float w = expf(ms[r] - M);
                    l += w * ls[r];
                    o += w * os[r];
                }
            out[((size_t)bi * H + (size_t)kvh * g) * HD + e] = valid && l > 0 ? o / l : 0.0f;
        }
        cl.sync();   /* every block's shared memory stays until all have read it */
        return;
    }
    dec_merge<HD, DEC_GMAX, DEC_GMAX * DEC_SMAX, T>(part, nsplit, g, bi, H, kvh, n_kv, valid, wt_, lt_, lt_ + DEC_GMAX, cnt, out);
}


/* The rope and the KV write folded into the decode kernel (cu_op_rope_kv_attend, one query a row): q and
 * the new k arrive unrotated (the q/k/v GEMV's output), every block rotates its q heads into shared memory and
 * the block whose slice holds the new key (the last key of the span) first writes that row to the pools (8 dims
 * a thread, from k and v in f32), then reads it as any other row after a barrier; no other block reads it.
 * (Made in the threads that load it and kept in their registers instead, the kernel's main loop took twice the
 * registers and ran at half the speed: H100, llama-3-8b 4-bit, 2.36 against 2.18 ms a step.) Rotation as
 * k_rope_kv (the same angles and products), the pool's rounding as cu_kv_put. */
struct dec_rope {
    const float *k, *v;     /* [B][n_kv][hd] this step's k (unrotated) and v */
    const int *pos;         /* [B] rope positions (staged) */
    const float *inv;       /* [rot / 2] frequencies (staged) */
    int rot, neox;
};
/* element d of x rotated at the angles (cs, sn): its pair's rotation (cu_rope_pair), the half that is d */
__device__ __forceinline__ float dec_rot(const float *x, int d, const float *cs, const float *sn, int rot, int neox) {
    if (d >= rot) return x[d];
    const int j = neox ? d % (rot / 2) : d >> 1;
    int i0, i1;
    cu_rope_dims(j, rot, neox, &i0, &i1);
    const float2 r = cu_rope_pair(x[i0], x[i1], cs[j], sn[j]);
    return d == i0 ? r.x : r.y;
}
/* dims 8 c .. 8 c + 7 of this step's K and V rows of (row bi, kv head kvh), rotated and rounded to the pool's type,
 * stored to the pools at pool row `row` */
template <typename KT>
__device__ __forceinline__ void dec_new_row(const dec_rope &ro, int bi, int kvh, int n_kv, int hd, int c, const float *cs,
                                            const float *sn, int64_t row, KT *K, KT *V) {
    const float *kx = ro.k + ((size_t)bi * n_kv + kvh) * hd, *vx = ro.v + ((size_t)bi * n_kv + kvh) * hd;
    uint32_t kw[4], vw[4];
#pragma unroll
    for (int t = 0; t < 4; t++) {
        const int d = 8 * c + 2 * t;
        kw[t] = dec_pack(dec_rot(kx, d, cs, sn, ro.rot, ro.neox), dec_rot(kx, d + 1, cs, sn, ro.rot, ro.neox), KT());
        vw[t] = dec_pack(vx[d], vx[d + 1], KT());
    }
    ((uint4 *)(K + (size_t)row * hd))[c] = make_uint4(kw[0], kw[1], kw[2], kw[3]);
    ((uint4 *)(V + (size_t)row * hd))[c] = make_uint4(vw[0], vw[1], vw[2], vw[3]);
}

/* Decode over a 16-bit pool: one block per (slice of keys, kv head, query),
 * serving all g q heads of the kv head, so each key and value row is read
 * once per step rather than g times. The slice is walked DEC_SUB keys at a
 * time: K and V rows to shared memory in one round of 16-byte loads, scores
 * (a thread per key and group of heads: the key row read once, the heads'
 * sums interleaved), an online softmax per head (a warp per head),
 * then P V with each thread owning one dimension for its heads; the next
 * piece's rows are loaded into registers while this one is computed. Rows
 * written before this step (positions < pos0) of the first piece are loaded
 * before waiting on the kernel before (the one writing this step's rows).
 * Partials (m, l, o) per q head. Slices (cu_attn_decode_fits): one per
 * piece up to DEC_SMAX, then DEC_SMAX of several pieces; one slice when the
 * (query, kv head) blocks alone fill the GPU (many sequences decoding together; attn-many.cu's
 * kernel takes that case outside batch-invariant mode). With at most DEC_CMAX
 * slices (a cache of up to 512 rows) the slices of a (query, kv head) are one
 * thread block cluster: the
 * partials stay in shared memory and, after a cluster barrier, each block
 * merges a share of the outputs reading its peers' shared memory. With
 * more, partials go to global memory and the last block to arrive (fence,
 * counter) merges them (dec_merge, dec-tc.cuh, shared with kvquant.cu's
 * kernels: at 4k keys on an H100 its rounds of loads took 0.75 ms off the
 * 8B step against this file's own earlier merge). Measured on the H200
 * (bench-cuda BENCH_AB, llama-3-8b decode at 128-256 positions): the
 * cluster merge took 3.1% off the step against the global one, whose
 * two-round form with these scores had taken 2.1% off one head's score
 * per thread and a round of loads per output column. The grid depends on the capacity
 * only, so a captured decode graph stays valid as positions advance. */
template <int HD, bool CL, typename KT, int T, bool FUSE>
__global__ void __launch_bounds__(T) k_attn_decode(const float *q, const KT *K, const KT *V, int L, int H, int n_kv,
                                                              const int32_t *pt, int n_pt, int sh, int window, int keep, float scale,
                                                              const int *pos0, const int *len, const int *seq, const int *run0, int nsplit,
                                                              int chunk, float *part, int *cnt, float *out, dec_rope ro) {
    CU_TRACE(0, CU_TRACE_ATTN);
    constexpr int C = DEC_SUB, RV = HD / 8, PAD = HD + 8;   /* PAD: rows 16 bytes apart in banks */
    constexpr int LOADS = (C * RV + T - 1) / T, HSTEP = T / HD > 0 ? T / HD : 1;
    __shared__ __align__(16) KT ks[C * PAD];
    __shared__ __align__(16) KT vs[C * HD];
    __shared__ __align__(16) float qs[DEC_GMAX * HD];
    __shared__ float ps[DEC_GMAX][C];
    __shared__ float mrun[DEC_GMAX], lrun[DEC_GMAX], alpha[DEC_GMAX];
    __shared__ float rcs[FUSE ? HD / 2 : 1], rsn[FUSE ? HD / 2 : 1];   /* FUSE: the rope's angles at this row's position */
    int s = blockIdx.x, kvh = blockIdx.y, bi = blockIdx.z, b = bi / L, i = bi % L;
    int g = H / n_kv, tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    int first = pos0[b], p = first + i, valid = i < len[b];
    /* key numbers [j0, j1) of this slice (cu_span_of); the staged row data and the page
     * table were written before the step, so they are read before the wait */
    cu_span sp = cu_span_of(p, window, keep, run0[b]);
    int j0, j1;
    cu_slice(sp.n, s, nsplit, chunk, &j0, &j1);
    const int32_t *ptr = pt + (size_t)seq[b] * n_pt;
    uint4 kr[LOADS], vr[LOADS];
    int64_t rowu[LOADS];   /* pool row of each load's key (-1: none) */
#pragma unroll
    for (int u = 0; u < LOADS; u++) {   /* rows of earlier steps: no wait needed */
        int e = tid + u * T, j = j0 + e / RV, pos = valid && j < j1 ? cu_span_key(sp, j) : -1;
        rowu[u] = pos >= 0 ? cu_kv_row(ptr, sh, n_kv, kvh, pos) : -1;
        if (j < j0 + C && pos >= 0 && pos < first && rowu[u] >= 0) {
            kr[u] = ((const uint4 *)(K + (size_t)rowu[u] * HD))[e % RV];
            vr[u] = ((const uint4 *)(V + (size_t)rowu[u] * HD))[e % RV];
        }
    }
    if (FUSE) {   /* positions and frequencies are staged before the step */
        for (int j = tid; j < ro.rot / 2; j += T) {
            const float ang = (float)ro.pos[bi] * ro.inv[j];
            rcs[j] = cosf(ang);
            rsn[j] = sinf(ang);
        }
        __syncthreads();
    }
    PDL_ENTRY();
    CU_TRACE(1, CU_TRACE_ATTN);
    const size_t pstride = (size_t)nsplit * (HD + 2);
    float *pbase = part + ((size_t)bi * H + (size_t)kvh * g) * pstride + (size_t)s * (HD + 2);   /* head h: + h * pstride */
    if (valid && j0 < j1) {
        const float *qg = q + ((size_t)bi * H + (size_t)kvh * g) * HD;
        for (int e = tid; e < g * HD; e += T)
            qs[e] = (FUSE ? dec_rot(qg + e / HD * HD, e % HD, rcs, rsn, ro.rot, ro.neox) : qg[e]) * scale;
        if (tid < DEC_GMAX) { mrun[tid] = -INFINITY; lrun[tid] = 0.0f; }
        if (FUSE && j1 == sp.n) {   /* the slice of the new key (key sp.n - 1, at position p): its row into the pools */
            const int64_t row = cu_kv_row(ptr, sh, n_kv, kvh, p);
            if (tid < RV && row >= 0) dec_new_row<KT>(ro, bi, kvh, n_kv, HD, tid, rcs, rsn, row, (KT *)K, (KT *)V);
            __syncthreads();
        }
        float acc[DEC_GMAX];
#pragma unroll
        for (int h = 0; h < DEC_GMAX; h++) acc[h] = 0.0f;
        int d = tid % HD, h0 = tid / HD;
#pragma unroll
        for (int u = 0; u < LOADS; u++) {   /* the first piece's rows of this step (written by the kernel before) */
            int e = tid + u * T, j = j0 + e / RV;
            if (j < min(j1, j0 + C)) {
                int pos = cu_span_key(sp, j);
                int64_t row = rowu[u];
                if (pos >= first || row < 0) {   /* not fetched before the wait */
                    if (row < 0) row = 0;   /* be_span shows held keys only; never read past the pool */
                    kr[u] = ((const uint4 *)(K + (size_t)row * HD))[e % RV];
                    vr[u] = ((const uint4 *)(V + (size_t)row * HD))[e % RV];
                }
            }
        }
        for (int jb = j0; jb < j1; jb += C) {
            int n = min(C, j1 - jb);
#pragma unroll
            for (int u = 0; u < LOADS; u++) {
                int e = tid + u * T;
                if (e < n * RV) {
                    *(uint4 *)&ks[(e / RV) * PAD + (e % RV) * 8] = kr[u];
                    *(uint4 *)&vs[e * 8] = vr[u];
                }
            }
            __syncthreads();
            if (jb == j0) CU_TRACE(2, CU_TRACE_ATTN);   /* q and the first piece's rows in shared memory */
            /* the next piece's rows into the registers now, in flight while this piece is computed */
            if (jb + C < j1) {
                int jn = jb + C, nn = min(C, j1 - jn);
#pragma unroll
                for (int u = 0; u < LOADS; u++) {
                    int e = tid + u * T, j = jn + e / RV;
                    if (j < jn + nn) {
                        int64_t row = cu_kv_row(ptr, sh, n_kv, kvh, cu_span_key(sp, j));
                        if (row < 0) row = 0;
                        kr[u] = ((const uint4 *)(K + (size_t)row * HD))[e % RV];
                        vr[u] = ((const uint4 *)(V + (size_t)row * HD))[e % RV];
                    }
                }
            }
            {   /* scores: thread = key tid % C for heads tid / C + HS * i; the key row read once, the heads' sums interleaved */
                constexpr int HS = T / C, NH = DEC_GMAX / HS;
                int j = tid % C, hb = tid / C;
                float sc[NH];
#pragma unroll
                for (int i = 0; i < NH; i++) sc[i] = 0.0f;
#pragma unroll
                for (int d8 = 0; d8 < RV; d8++) {
                    uint4 kk = *(const uint4 *)&ks[j * PAD + d8 * 8];
                    const typename dec_pair<KT>::t *k2 = (const typename dec_pair<KT>::t *)&kk;
                    float f[8];
#pragma unroll
                    for (int t = 0; t < 4; t++) {
                        float2 ff = dec_f2(k2, t);
                        f[2 * t] = ff.x;
                        f[2 * t + 1] = ff.y;
                    }
#pragma unroll
                    for (int i = 0; i < NH; i++) {
                        if (hb + HS * i >= g) break;
                        const float4 *qq = (const float4 *)(qs + (hb + HS * i) * HD + d8 * 8);
                        float4 a = qq[0], b = qq[1];
                        sc[i] += a.x * f[0] + a.y * f[1] + a.z * f[2] + a.w * f[3] + b.x * f[4] + b.y * f[5] + b.z * f[6] + b.w * f[7];
                    }
                }
#pragma unroll
                for (int i = 0; i < NH; i++)
                    if (hb + HS * i < g) ps[hb + HS * i][j] = j < n ? sc[i] : -INFINITY;
            }
            __syncthreads();
            for (int h = warp; h < g; h += T / 32) {
                float a = ps[h][lane], c = ps[h][lane + 32], mo = mrun[h];
                float m = fmaxf(fmaxf(a, c), mo);
#pragma unroll
                for (int o = 16; o; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
                float ea = a == -INFINITY ? 0.0f : expf(a - m), ec = c == -INFINITY ? 0.0f : expf(c - m);
                ps[h][lane] = ea;
                ps[h][lane + 32] = ec;
                float l = ea + ec;
#pragma unroll
                for (int o = 16; o; o >>= 1) l += __shfl_xor_sync(0xffffffffu, l, o);
                __syncwarp();   /* every lane has read mrun[h] */
                if (lane == 0) {
                    float al = mo == -INFINITY ? 0.0f : expf(mo - m);
                    alpha[h] = al;
                    lrun[h] = lrun[h] * al + l;
                    mrun[h] = m;
                }
            }
            __syncthreads();
            if (d < HD) {
#pragma unroll
                for (int h = 0; h < DEC_GMAX; h += HSTEP)
                    if (h + h0 < g) acc[h] *= alpha[h + h0];
#pragma unroll 8
                for (int j = 0; j < n; j++) {
                    float vv = cu_f<KT>(vs[j * HD + d]);
#pragma unroll
                    for (int h = 0; h < DEC_GMAX; h += HSTEP)
                        if (h + h0 < g) acc[h] += ps[h + h0][j] * vv;
                }
            }
            __syncthreads();
        }
        if (CL) {   /* the partial stays in shared memory: o in ks (free now), m and l in mrun, lrun */
#pragma unroll
            for (int h = 0; h < DEC_GMAX; h += HSTEP)
                if (h + h0 < g) ((float *)(void *)ks)[(h + h0) * HD + d] = acc[h];
        } else {
#pragma unroll
            for (int h = 0; h < DEC_GMAX; h += HSTEP)
                if (h + h0 < g) pbase[(h + h0) * pstride + 2 + d] = acc[h];
            if (tid < g) {
                pbase[tid * pstride] = mrun[tid];
                pbase[tid * pstride + 1] = lrun[tid];
            }
        }
    } else if (tid < g) {
        if (CL) {
            mrun[tid] = -INFINITY;
            lrun[tid] = 0.0f;
        } else {
            pbase[tid * pstride] = -INFINITY;
            pbase[tid * pstride + 1] = 0.0f;
        }
    }
    CU_TRACE(4, CU_TRACE_ATTN);
    dec_tail<HD, CL, T>(s, nsplit, g, bi, H, kvh, n_kv, valid, part, mrun, lrun, (float *)(void *)ks, &ps[0][0], (float *)(void *)ks, cnt,
                     out);
    CU_TRACE(3, CU_TRACE_ATTN);
}
CU_TRACE_HOST(cu_trace_attn)

/* Tensor-core decode (from DEC_TC_SPAN keys): the same blocks, slices and partials as k_attn_decode, the
 * work inside a block on mma.sync. Each warp takes every fourth run of DEC_TK keys of the slice and
 * walks them with its own cp.async pipeline (dec_tc_geo::ST stages of K and V rows in shared memory, rows
 * 16 bytes a chunk XOR-swizzled by key so ldmatrix reads without bank conflicts; keys past the
 * slice zero-filled) and its own online softmax; the four warps' partials merge in shared memory
 * at the end. Precision: a pool row is exact in its 16-bit type; a query (times the scale and a
 * power of two that puts its largest value near 2^14) is split into three 16-bit parts hi + mid
 * + lo of that type (24+ significant bits), rows 0-7 of the A operand hi, rows 8-15 mid, then a
 * second product with lo in rows 0-7: every score S[h][j] is the sum of accumulator rows h and
 * h + 8, f32 products and sums as the CUDA-core kernel's up to the order of additions. P (times
 * 2^14) is split the same way for P V. */
#define DEC_TK 16
template <int HD> struct dec_tc_geo {
    static constexpr int ST = HD == 128 ? 2 : 3;                               /* stages per warp */
    static constexpr size_t SMEM = (size_t)ST * 4 * 2 * DEC_TK * HD * 2;      /* 64 KB (HD 128) / 48 KB (HD 64) */
    static constexpr int BLOCKS_SM = HD == 128 ? 3 : 4;                       /* resident blocks per SM (registers, shared memory) */
};
static_assert(dec_tc_geo<128>::SMEM >= (4 + 1) * DEC_GMAX * 128 * 4 + 2 * DEC_GMAX * DEC_SMAX * 4, "merge scratch fits");
static_assert(dec_tc_geo<64>::SMEM >= (4 + 1) * DEC_GMAX * 64 * 4 + 2 * DEC_GMAX * DEC_SMAX * 4, "merge scratch fits");

template <int HD, bool CL, typename KT>
__global__ void __launch_bounds__(DEC_THREADS, dec_tc_geo<HD>::BLOCKS_SM) k_attn_dec_tc(const float *q, const KT *K, const KT *V, int L, int H, int n_kv,
                                                              const int32_t *pt, int n_pt, int sh, int window, int keep, float scale,
                                                              const int *pos0, const int *len, const int *seq, const int *run0, int nsplit,
                                                              int chunk, float *part, int *cnt, float *out, float tau) {
    typedef dec_tc_geo<HD> G;
    constexpr int ST = G::ST, RV = HD / 8, KS = HD / 16, NT = HD / 8, TILE = DEC_TK * HD, PER = DEC_TK * RV / 32;
    static_assert(DEC_THREADS == 128 && DEC_GMAX == 8, "four warps; q heads are the A operand's rows 0-7");
    extern __shared__ __align__(16) unsigned char dsm[];
    KT *tiles = (KT *)(void *)dsm;   /* [warp][stage][K, V][DEC_TK][HD] */
    float *wo = (float *)(void *)dsm;                  /* after the walk: [warp][DEC_GMAX][HD] partials */
    float *osh = wo + 4 * DEC_GMAX * HD;               /* [DEC_GMAX][HD] the block's o */
    float *wt = osh + DEC_GMAX * HD, *lt = wt + DEC_GMAX * DEC_SMAX;
    __shared__ float mrun[DEC_GMAX], lrun[DEC_GMAX], wm[4][DEC_GMAX], wl[4][DEC_GMAX];
    int s = blockIdx.x, kvh = blockIdx.y, bi = blockIdx.z, b = bi / L, i = bi % L;
    int g = H / n_kv, tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, r = lane >> 2, c = lane & 3;
    int first = pos0[b], p = first + i, valid = i < len[b];
    cu_span sp = cu_span_of(p, window, keep, run0[b]);
    int j0, j1;
    cu_slice(sp.n, s, nsplit, chunk, &j0, &j1);
    const int32_t *ptr = pt + (size_t)seq[b] * n_pt;
    PDL_ENTRY();
    const size_t pstride = (size_t)nsplit * (HD + 2);
    float *pbase = part + ((size_t)bi * H + (size_t)kvh * g) * pstride + (size_t)s * (HD + 2);   /* head h: + h * pstride */
    int walk = valid && j0 < j1;
    float o[NT][4], m_r = -INFINITY, l_r = 0.0f;
#pragma unroll
    for (int n = 0; n < NT; n++) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.0f;
    if (walk) {
        /* the query's A operands: head r, dims 16 ks + 2c + {0, 1, 8, 9} */
        uint32_t aq[KS][4], aql[KS][4];
        float qun;
        {
            float qv[KS][4], amax = 0.0f;
            const float *qh = q + ((size_t)bi * H + (size_t)kvh * g + (r < g ? r : 0)) * HD;
#pragma unroll
            for (int ks = 0; ks < KS; ks++)
#pragma unroll
                for (int t = 0; t < 4; t++) {
                    qv[ks][t] = r < g ? qh[16 * ks + 2 * c + (t & 1) + (t >> 1) * 8] * scale : 0.0f;
                    amax = fmaxf(amax, fabsf(qv[ks][t]));
                }
            amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, 1));
            amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, 2));
            int e2 = amax > 0.0f && amax < INFINITY ? 14 - ilogbf(amax) : 0;
            float qsc = ldexpf(1.0f, e2);
            qun = ldexpf(1.0f, -e2);
#pragma unroll
            for (int ks = 0; ks < KS; ks++) {
#pragma unroll
                for (int t = 0; t < 4; t++) qv[ks][t] *= qsc;
                mma_a_split<KT>(qv[ks], aq[ks], aql[ks]);
            }
        }
        int nst = (j1 - j0 + DEC_TK - 1) / DEC_TK, mine = nst > warp ? (nst - warp + 3) / 4 : 0;
        KT *wtile = tiles + (size_t)warp * ST * 2 * TILE;
        /* run t of this warp (keys j0 + (warp + 4 t) * DEC_TK ...) into stage t % ST */
        auto load = [&](int t) {
            int jb = j0 + (warp + 4 * t) * DEC_TK;
            int64_t row = lane < DEC_TK && jb + lane < j1 ? cu_kv_row(ptr, sh, n_kv, kvh, cu_span_key(sp, jb + lane)) : -1;
            KT *kt = wtile + (size_t)(t % ST) * 2 * TILE, *vt = kt + TILE;
#pragma unroll
            for (int u = 0; u < PER; u++) {
                int e = lane + 32 * u, kk = e / RV, ch = e % RV;
                int64_t rw = __shfl_sync(0xffffffffu, row, kk);
                int at = kk * HD + ((ch ^ (kk & 7)) * 8);
                size_t src = (size_t)(rw < 0 ? 0 : rw) * HD + ch * 8;
                cp_async16_zf(kt + at, K + src, rw >= 0);
                cp_async16_zf(vt + at, V + src, rw >= 0);
            }
        };
        dec_pipe_start<ST>(mine, load);
        for (int t = 0; t < mine; t++) {
            dec_pipe_next<ST>(t, mine, load);
            const KT *kt = wtile + (size_t)(t % ST) * 2 * TILE, *vt = kt + TILE;
            int jb = j0 + (warp + 4 * t) * DEC_TK;
            float sc[2][4] = {{0.0f, 0.0f, 0.0f, 0.0f}, {0.0f, 0.0f, 0.0f, 0.0f}};
#pragma unroll
            for (int ks = 0; ks < KS; ks++) {   /* S^T tile: rows (head, part), columns keys 0-7 and 8-15 */
                uint32_t bb[4];
                int kk = (lane & 7) + ((lane >> 4) << 3), ch = 2 * ks + ((lane >> 3) & 1);
                ldsm_x4(bb, kt + kk * HD + ((ch ^ (kk & 7)) * 8));
                mma_t<KT>::mma(sc[0], aq[ks], bb[0], bb[1]);
                mma_t<KT>::mma(sc[0], aql[ks], bb[0], bb[1]);
                mma_t<KT>::mma(sc[1], aq[ks], bb[2], bb[3]);
                mma_t<KT>::mma(sc[1], aql[ks], bb[2], bb[3]);
            }
            /* head r's scores of keys jb + 2c, 2c+1, 8+2c, 9+2c */
            float x[4] = {(sc[0][0] + sc[0][2]) * qun, (sc[0][1] + sc[0][3]) * qun, (sc[1][0] + sc[1][2]) * qun, (sc[1][1] + sc[1][3]) * qun};
#pragma unroll
            for (int t2 = 0; t2 < 4; t2++)
                if (jb + 2 * c + (t2 & 1) + (t2 >> 1) * 8 >= j1) x[t2] = -INFINITY;
            float pv[4];
            dec_online<NT>(x, m_r, l_r, o, pv, std::is_same<KT, __half>::value ? fminf(tau, 0.69f) : tau);   /* f16 P: 16384 p < 2^15 */
#pragma unroll
            for (int t2 = 0; t2 < 4; t2++) pv[t2] *= 16384.0f;
            uint32_t ap[4], apl[4];
            mma_a_split<KT>(pv, ap, apl);
#pragma unroll
            for (int n2 = 0; n2 < NT / 2; n2++) {   /* O += P V: keys 0-15, dims 16 n2 .. 16 n2 + 15 */
                uint32_t bb[4];
                int kk = (lane & 7) + (((lane >> 3) & 1) << 3), ch = 2 * n2 + (lane >> 4);
                ldsm_x4_t(bb, vt + kk * HD + ((ch ^ (kk & 7)) * 8));
                mma_t<KT>::mma(o[2 * n2], ap, bb[0], bb[1]);
                mma_t<KT>::mma(o[2 * n2], apl, bb[0], bb[1]);
                mma_t<KT>::mma(o[2 * n2 + 1], ap, bb[2], bb[3]);
                mma_t<KT>::mma(o[2 * n2 + 1], apl, bb[2], bb[3]);
            }
            __syncwarp();   /* every lane is done with this stage before it is loaded again */
        }
        cp_async_wait<0>();
        l_r += __shfl_xor_sync(0xffffffffu, l_r, 1);
        l_r += __shfl_xor_sync(0xffffffffu, l_r, 2);
    }
    float *md = CL ? mrun : pbase, *ld = CL ? lrun : pbase + 1, *ov = CL ? osh : pbase + 2;
    size_t ms = CL ? 1 : pstride, os = CL ? HD : pstride;
    dec_warps_merge<HD>(walk, g, m_r, l_r, [&](int n, int e) { return (o[n][e] + o[n][e + 2]) * (1.0f / 16384.0f); },
                        [](int n, int j) { return n * 8 + j; }, wo, wm, wl, md, ld, ms, ov, os);
    if (!walk && tid < g) {
        md[tid * ms] = -INFINITY;
        ld[tid * ms] = 0.0f;
    }
    dec_tail<HD, CL, DEC_THREADS>(s, nsplit, g, bi, H, kvh, n_kv, valid, part, mrun, lrun, osh, wt, lt, cnt, out);
}

/* 1 when the decode kernel serves this shape (16-bit pool), with its slices (at most DEC_SMAX): runs of a multiple
 * of DEC_SUB keys, or (real) a query's keys spread over them; target > 0: the number of blocks that fills the GPU (not in batch-invariant mode, where a query's
 * slices must not depend on its batch); tc_sm > 0: the tensor-core kernel runs, on that many SMs (0 in
 * batch-invariant mode too); real (never in batch-invariant mode): the slices sized from each query's span (cu_slice);
 * short32 (default; CINFER_CUDA_DEC_SHORT=0 off; never in batch-invariant mode): the CUDA-core kernel takes a span of at
 * most DEC_CMAX * 32 keys in slices of at most 32, one cluster (H200, A/B in one process, decode at 129-256 keys, 4-bit
 * g64: llama-3-8b step graph 1.880 -> 1.856 ms, llama-3.2-1b 0.584 -> 0.564; slices of at least 128 or 256 keys instead
 * had been slower on an H100, 8B 2.137 -> 2.277 / 2.574 ms) */
int cu_attn_decode_fits(const be_attn *a, be_dtype dt, int span, int target, int tc_sm, int real, int short32, int *chunk, int *nsplit) {
    int g = a->n_kv_head > 0 ? a->n_head / a->n_kv_head : 0;
    if (span < 1) span = 1;
    if (!((dt == BE_F16 || dt == BE_BF16) && (a->head_dim == 64 || a->head_dim == 128) && g >= 1 && g <= DEC_GMAX &&
          a->n_head % a->n_kv_head == 0))
        return 0;
    /* as many slices as the span has pieces, up to DEC_SMAX: the kernel is bound by each block's
     * latency, so parallel slices beat longer ones (H200, llama-3.1-8b decode at 4k: 8 slices of 8
     * pieces, merged in a cluster, took 6.25 ms a step against 5.74 for 64 slices of 1) ... */
    int pieces = (span + DEC_SUB - 1) / DEC_SUB, want = pieces < DEC_SMAX ? pieces : DEC_SMAX;
    /* ... until the (query, kv head) blocks fill the GPU by themselves (many sequences decoding
     * together): then one slice each, whose loads of the next piece overlap the current one's
     * work, and no merge (H200, llama-3-8b, 64 sequences of 64..511 tokens: 8.08 ms a step against
     * 9.49 with 9 slices merged through global memory); attn-many.cu's kernel then serves it
     * (cu_attn_many_fits: 6.85 ms a step) */
    const int many = target > 0 && (long)a->B * a->L * a->n_kv_head >= target;
    if (many) want = 1;
    /* the tensor-core kernel (3 or 4 blocks an SM by its shared memory): at most one wave of blocks
     * (H200, llama-3.1-8b decode: 64 slices of one piece at 4k, 512 blocks for 396 places, ran
     * 0.95x the CUDA-core kernel's step) */
    if (tc_sm > 0)
        want = cu_one_wave(want, tc_sm * (a->head_dim == 128 ? dec_tc_geo<128>::BLOCKS_SM : dec_tc_geo<64>::BLOCKS_SM),
                           (long)a->B * a->L * a->n_kv_head);
    static_assert(DEC_SUB == CU_DEC_RUN && 4 * DEC_TK == CU_DEC_RUN, "slices in pieces, and in the four warps' runs");
    cu_dec_slices(span, want, tc_sm > 0 && real, chunk, nsplit);
    /* the CUDA-core kernel (real: CINFER_CUDA_SLICE_REAL, never in batch-invariant mode, where a row's slices must not
     * depend on the batch's bucket): the query's keys spread evenly over the bucket's slices, not in runs of 64 (at
     * 129-192 keys of a 256 bucket: 4 slices of 33-48 keys instead of 64, 64, 1-64 and none) */
    if (!tc_sm && real && *nsplit > 1) *chunk = -1;
    if (!tc_sm && short32 && !many && span <= DEC_CMAX * 32) {
        *nsplit = (span + 31) / 32;
        *chunk = real ? -1 : 32;
    }
    return 1;
}

/* 1 when a decode over this span (cu_span_bucket) runs the tensor-core kernel: from DEC_TC_SPAN keys by
 * default (H200, llama-3.1-8b, bf16 pool, A/B in one process: after 4096 tokens (span bucket 5120) the
 * CUDA-core kernel's step graph took 5.65 ms against 5.93; after 8192 6.42 against 6.14, after 16384 7.81
 * against 6.65), always or never by CINFER_CUDA_DEC_TC */
#define DEC_TC_SPAN 8192
int cu_attn_decode_tc(const be_ctx *c, int span) { return c->dec_tc == 2 || (c->dec_tc == 1 && span >= DEC_TC_SPAN); }

/* 1 when the CUDA-core decode kernel, which a decode of nsplit slices runs, also takes its rope and KV write
 * (cu_op_rope_kv_attend): one query a row, not attn-many.cu's kernel, an even rot_dims; never in batch-invariant mode
 * (a row's q is rotated by k_rope_kv in a batch of longer rows: the two kernels' roundings may differ in the last
 * bit); CINFER_CUDA_ROPE_FUSE=0: never */
int cu_attn_decode_rope(const be_ctx *c, const be_attn *a, int nsplit) {
    return c->rope_fuse && !c->batch_inv && a->L == 1 && a->inv_freq && a->rot_dims > 0 && a->rot_dims % 2 == 0 && a->rot_dims <= a->head_dim &&
           !cu_attn_many_fits(c, a->B, a->n_kv_head, a->n_head / a->n_kv_head, nsplit);
}

/* the record of cu_op_attention (see l_attention there) */
void cu_attn_decode_launch(be_ctx *c, const cu_rec *r) {
    const float *q = (const float *)r->p[0];
    const void *K = r->p[1], *V = r->p[2];
    float *out = (float *)r->p[3];
    const int *pos0 = (const int *)r->p[4], *len = (const int *)r->p[5], *seq = (const int *)r->p[6], *run0 = (const int *)r->p[7];
    const int32_t *pt = (const int32_t *)r->p[8];
    int B = (int)r->i[CU_A_B], L = (int)r->i[CU_A_L], H = (int)r->i[CU_A_H], n_kv = (int)r->i[CU_A_NKV], hd = (int)r->i[CU_A_HD];
    int sh = (int)r->i[CU_A_PSH], n_pt = (int)r->i[CU_A_NPT], window = (int)r->i[CU_A_WIN], keep = (int)r->i[CU_A_KEEP];
    int bf = r->i[CU_A_OP] == BE_BF16, nsplit = (int)r->i[CU_A_OP + 2], tc = (int)r->i[CU_A_OP + 3], chunk = (int)r->f[1];
    float scale = r->f[0];
    /* cu_op_rope_kv_attend's record: the rope and the KV write in the kernel (cu_attn_decode_rope said it takes them) */
    const dec_rope ro = {(const float *)r->p[9], (const float *)r->p[10], (const int *)r->p[11], (const float *)r->p[12],
                         (int)r->i[CU_A_OP + 4], (int)r->i[CU_A_OP + 5]};
    if (cu_attn_many_fits(c, B * L, n_kv, H / n_kv, nsplit)) {   /* one slice each: attn-many.cu's kernel */
        cu_attn_many_launch(c, r);
        return;
    }
    dim3 grid((unsigned)nsplit, (unsigned)n_kv, (unsigned)(B * L));
    /* 0: merge through global memory; always in batch-invariant mode, where the number of (empty)
     * slices varies with the batch: that merge adds exact zeros for them, the cluster's differs */
    unsigned cl = nsplit <= DEC_CMAX && c->cluster && !c->batch_inv ? (unsigned)nsplit : 0;
#define DEC(HD, CL, KT) do { \
        if (!tc) \
            cu_launch_cluster(c, cl, ro.k ? k_attn_decode<HD, CL, KT, 2 * DEC_THREADS, true> : c->dec_wide ? k_attn_decode<HD, CL, KT, 2 * DEC_THREADS, false> \
                              : k_attn_decode<HD, CL, KT, DEC_THREADS, false>, grid, dim3(ro.k || c->dec_wide ? 2 * DEC_THREADS : DEC_THREADS), 0, q, \
                              (const KT *)K, (const KT *)V, L, H, n_kv, pt, n_pt, sh, window, keep, scale, pos0, len, seq, run0, nsplit, chunk, \
                              c->part, c->cnt, out, ro); \
        else if (!cu_check(c, cudaFuncSetAttribute(k_attn_dec_tc<HD, CL, KT>, cudaFuncAttributeMaxDynamicSharedMemorySize, \
                                                   (int)dec_tc_geo<HD>::SMEM), "decode attention: shared memory attribute")) \
            cu_launch_cluster(c, cl, k_attn_dec_tc<HD, CL, KT>, grid, dim3(DEC_THREADS), dec_tc_geo<HD>::SMEM, q, (const KT *)K, \
                              (const KT *)V, L, H, n_kv, pt, n_pt, sh, window, keep, scale, pos0, len, seq, run0, nsplit, chunk, c->part, \
                              c->cnt, out, c->dec_lazy ? 8.0f : 0.0f); \
    } while (0)
#define DEC_KT(HD, CL) do { if (bf) DEC(HD, CL, __nv_bfloat16); else DEC(HD, CL, __half); } while (0)
    if (hd == 64) { if (cl) DEC_KT(64, true); else DEC_KT(64, false); }
    else { if (cl) DEC_KT(128, true); else DEC_KT(128, false); }
#undef DEC_KT
#undef DEC
    CU_LAUNCHED(c, "attention (decode)");
    c->light_prev = 1;
}
