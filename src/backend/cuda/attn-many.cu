/*
 * attn-many.cu — decode attention when many sequences decode together: the
 * (query, kv head) pairs alone fill the GPU, so each is one block and no
 * merge of slices is needed (attn-decode.cu's kernel is used otherwise, and
 * always in batch-invariant mode). Same mask and layout as attn-decode.cu:
 * the keys a query sees are numbered by cu_span_of, each row found through
 * the page table.
 *
 * The block's MANY_WARPS warps take chunks of MANY_CK keys in turn. In a
 * warp, lane l owns head dims [l*DPL, l*DPL + DPL) of the query's g q heads
 * (q and the output accumulators in registers) and of every key and value
 * row, so one row is one coalesced warp-wide load. A chunk's scores are
 * per-lane partial dot products, reduced across the warp by a
 * reduce-scatter (31 shuffles for 32 sums) that leaves each lane the whole
 * score of one (key, head); an online softmax per head across the lanes
 * holding it; the probabilities through shared memory to every lane for
 * P V. At the end the warps' (m, l, o) merge in shared memory. Sums are in
 * f32; the keys' order within a query's sums depends on the shape only.
 *
 * Why: attn-decode.cu's kernel (a block walks 64-key pieces with block
 * barriers, a thread per key for scores and per dim for P V) ran at ~50 us a
 * layer for 32 sequences of 64..511 tokens on the H200 whatever its slicing
 * (ncu), ~5x the time its bytes take at bandwidth: few warps per SM, each
 * waiting on barriers and shared-memory latency.
 */
#include <math.h>
#include "backend/cuda/cuda.cuh"

#define MANY_WARPS 8
#define MANY_CK(G) ((G) >= 8 ? 8 : 16)   /* keys of a warp's chunk (8 q heads: 8, within 128 registers) */
#define FULL 0xffffffffu

/* a pair of 16-bit pool values as floats */
template <typename KT> __device__ __forceinline__ float2 many_f2(unsigned u);
template <> __device__ __forceinline__ float2 many_f2<__nv_bfloat16>(unsigned u) {
    return make_float2(__uint_as_float(u << 16), __uint_as_float(u & 0xffff0000u));
}
template <> __device__ __forceinline__ float2 many_f2<__half>(unsigned u) {
    __half2 h;
    memcpy(&h, &u, sizeof h);
    return __half22float2(h);
}

/* a lane's DPL values of a row: one 8-byte (DPL 4) or 4-byte (DPL 2) load */
template <int DPL> struct many_row { unsigned w[DPL / 2]; };
template <int DPL> __device__ __forceinline__ many_row<DPL> many_load(const void *row, int lane) {
    many_row<DPL> r;
    if constexpr (DPL == 4) {
        uint2 v = ((const uint2 *)row)[lane];
        r.w[0] = v.x;
        r.w[1] = v.y;
    } else {
        r.w[0] = ((const unsigned *)row)[lane];
    }
    return r;
}
template <typename KT, int DPL> __device__ __forceinline__ void many_unpack(const many_row<DPL> &r, float *f) {
#pragma unroll
    for (int t = 0; t < DPL / 2; t++) {
        float2 x = many_f2<KT>(r.w[t]);
        f[2 * t] = x.x;
        f[2 * t + 1] = x.y;
    }
}

/* v[0..P) summed over the warp, scattered: afterwards lane l holds in v[0] the sum of
 * element l % P (lanes l and l + P hold the same when P < 32). Steps by template recursion
 * so that every index is a constant (v stays in registers) */
template <int P, int O> struct many_rs {
    static __device__ __forceinline__ void go(float *v, int lane) {
        if constexpr (O >= P) {   /* lanes O apart hold the same elements: plain sums */
#pragma unroll
            for (int i = 0; i < P; i++) v[i] += __shfl_xor_sync(FULL, v[i], O);
        } else {   /* lanes with bit O keep the upper half, the others the lower: O elements left */
            bool up = lane & O;
#pragma unroll
            for (int i = 0; i < O; i++) {
                float send = up ? v[i] : v[i + O], keep = up ? v[i + O] : v[i];
                v[i] = keep + __shfl_xor_sync(FULL, send, O);
            }
        }
        if constexpr (O > 1) many_rs<P, O / 2>::go(v, lane);
    }
};
template <int P> __device__ __forceinline__ float many_reduce_scatter(float *v, int lane) {
    many_rs<P, 16>::go(v, lane);
    return v[0];
}

template <int HD, int G, typename KT>
__global__ void __launch_bounds__(MANY_WARPS * 32, 2) k_attn_many(const float *q, const KT *K, const KT *V, int L, int H, int n_kv,
                                                                   const int32_t *pt, int n_pt, int sh, int window, int keep,
                                                                   float scale, const int *pos0, const int *len, const int *seq,
                                                                   const int *run0, float *out) {
    /* DPL dims a lane; a chunk's scores in R rounds of KR keys x G heads = P sums */
    constexpr int DPL = HD / 32, CK = MANY_CK(G), KR = CK < 32 / G ? CK : 32 / G, R = CK / KR, P = KR * G;
    __shared__ __align__(16) float ps[MANY_WARPS][CK][G];   /* a chunk's probabilities, per warp */
    __shared__ __align__(16) float oa[MANY_WARPS][G][HD];   /* the warps' partial outputs */
    __shared__ float om[MANY_WARPS][G], ol[MANY_WARPS][G];
    int kvh = blockIdx.x, bi = blockIdx.y, b = bi / L, i = bi % L;
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    int p = pos0[b] + i, valid = i < len[b];
    cu_span sp = cu_span_of(p, window, keep, run0[b]);
    int n = valid ? sp.n : 0;
    const int32_t *ptr = pt + (size_t)seq[b] * n_pt;
    PDL_ENTRY();
    float qr[G][DPL], acc[G][DPL];
    const float *qg = q + ((size_t)bi * H + (size_t)kvh * G) * HD + lane * DPL;
#pragma unroll
    for (int h = 0; h < G; h++)
#pragma unroll
        for (int d = 0; d < DPL; d++) {
            qr[h][d] = qg[h * HD + d] * scale;
            acc[h][d] = 0.0f;
        }
    float m_run = -INFINITY, l_run = 0.0f;   /* of head lane % G */
    for (int jb = warp * CK; jb < n; jb += MANY_WARPS * CK) {
        int64_t rw = -1;
        if (lane < CK && jb + lane < n) rw = cu_kv_row(ptr, sh, n_kv, kvh, cu_span_key(sp, jb + lane));
        if (rw < 0) rw = 0;   /* keys past the span: loaded from row 0, never used */
        many_row<DPL> kk[CK], vv[CK];
#pragma unroll
        for (int k = 0; k < CK; k++) kk[k] = many_load<DPL>(K + __shfl_sync(FULL, rw, k) * HD, lane);
        float s[R];
#pragma unroll
        for (int r = 0; r < R; r++) {
            float v[P];
#pragma unroll
            for (int k = 0; k < KR; k++) {
                float f[DPL];
                many_unpack<KT, DPL>(kk[r * KR + k], f);
#pragma unroll
                for (int h = 0; h < G; h++) {
                    float t = 0.0f;
#pragma unroll
                    for (int d = 0; d < DPL; d++) t += qr[h][d] * f[d];
                    v[k * G + h] = t;
                }
            }
            s[r] = many_reduce_scatter<P>(v, lane);
            if (jb + r * KR + (lane % P) / G >= n) s[r] = -INFINITY;
        }
#pragma unroll
        for (int k = 0; k < CK; k++) vv[k] = many_load<DPL>(V + __shfl_sync(FULL, rw, k) * HD, lane);   /* in flight during the softmax */
        /* online softmax of head lane % G over the lanes holding it (lane % P distinct) */
        float mc = s[0];
#pragma unroll
        for (int r = 1; r < R; r++) mc = fmaxf(mc, s[r]);
#pragma unroll
        for (int o = P / 2; o >= G; o >>= 1) mc = fmaxf(mc, __shfl_xor_sync(FULL, mc, o));
        float mn = fmaxf(m_run, mc), lc = 0.0f, pr[R];   /* mn finite: key jb is in the span */
#pragma unroll
        for (int r = 0; r < R; r++) {
            pr[r] = s[r] == -INFINITY ? 0.0f : expf(s[r] - mn);
            lc += pr[r];
        }
#pragma unroll
        for (int o = P / 2; o >= G; o >>= 1) lc += __shfl_xor_sync(FULL, lc, o);
        float al = m_run == -INFINITY ? 0.0f : expf(m_run - mn);
        l_run = l_run * al + lc;
        m_run = mn;
        if (lane < P)
#pragma unroll
            for (int r = 0; r < R; r++) ps[warp][r * KR + lane / G][lane % G] = pr[r];
        __syncwarp();
#pragma unroll
        for (int h = 0; h < G; h++) {
            float a = __shfl_sync(FULL, al, h);
#pragma unroll
            for (int d = 0; d < DPL; d++) acc[h][d] *= a;
        }
#pragma unroll
        for (int k = 0; k < CK; k++) {
            if (jb + k >= n) break;   /* warp-uniform; a row past the span may hold anything */
            float f[DPL], pk[G];
            many_unpack<KT, DPL>(vv[k], f);
#pragma unroll
            for (int h = 0; h < G; h++) pk[h] = ps[warp][k][h];
#pragma unroll
            for (int h = 0; h < G; h++)
#pragma unroll
                for (int d = 0; d < DPL; d++) acc[h][d] += pk[h] * f[d];
        }
        __syncwarp();   /* ps is rewritten by the next chunk */
    }
    if (lane < G) {
        om[warp][lane] = m_run;
        ol[warp][lane] = l_run;
    }
#pragma unroll
    for (int h = 0; h < G; h++)
#pragma unroll
        for (int d = 0; d < DPL; d++) oa[warp][h][lane * DPL + d] = acc[h][d];
    __syncthreads();
    for (int e = threadIdx.x; e < G * HD; e += MANY_WARPS * 32) {
        int h = e / HD;
        float M = -INFINITY, l = 0.0f, o = 0.0f;
#pragma unroll
        for (int w = 0; w < MANY_WARPS; w++) M = fmaxf(M, om[w][h]);
#pragma unroll
        for (int w = 0; w < MANY_WARPS; w++)
            if (om[w][h] != -INFINITY) {
                float wt = expf(om[w][h] - M);
                l += wt * ol[w][h];
                o += wt * oa[w][h][e % HD];
            }
        out[((size_t)bi * H + (size_t)kvh * G) * HD + e] = valid && l > 0 ? o / l : 0.0f;
    }
}

/* 1 when this kernel serves a decode launch of nsplit slices (attn-decode.cu): one slice per
 * (query, kv head) because those blocks fill the GPU, outside batch-invariant mode, g of 1, 2, 4 or 8 */
int cu_attn_many_fits(const be_ctx *c, int rows, int n_kv, int g, int nsplit) {
    return c->dec_many && !c->batch_inv && nsplit == 1 && c->dec_blocks > 0 && (long)rows * n_kv >= (long)c->dec_blocks * c->n_sm &&
           rows <= 65535 && (g == 1 || g == 2 || g == 4 || g == 8);
}

template <int HD, int G, typename KT>
static void many_go(be_ctx *c, const cu_rec *r) {
    int B = (int)r->i[CU_A_B], L = (int)r->i[CU_A_L], H = (int)r->i[CU_A_H], n_kv = (int)r->i[CU_A_NKV];
    cu_launch(c, k_attn_many<HD, G, KT>, dim3((unsigned)n_kv, (unsigned)(B * L)), dim3(MANY_WARPS * 32), 0, (const float *)r->p[0],
              (const KT *)r->p[1], (const KT *)r->p[2], L, H, n_kv, (const int32_t *)r->p[8], (int)r->i[CU_A_NPT], (int)r->i[CU_A_PSH],
              (int)r->i[CU_A_WIN], (int)r->i[CU_A_KEEP], r->f[0], (const int *)r->p[4], (const int *)r->p[5], (const int *)r->p[6],
              (const int *)r->p[7], (float *)r->p[3]);
}

template <int HD, typename KT>
static void many_g(be_ctx *c, const cu_rec *r, int g) {
    if (g == 1) many_go<HD, 1, KT>(c, r);
    else if (g == 2) many_go<HD, 2, KT>(c, r);
    else if (g == 4) many_go<HD, 4, KT>(c, r);
    else many_go<HD, 8, KT>(c, r);
}

/* the record of cu_op_attention's decode path when cu_attn_many_fits */
void cu_attn_many_launch(be_ctx *c, const cu_rec *r) {
    int g = (int)(r->i[CU_A_H] / r->i[CU_A_NKV]), bf = r->i[CU_A_OP] == BE_BF16;
    if (r->i[CU_A_HD] == 64) { if (bf) many_g<64, __nv_bfloat16>(c, r, g); else many_g<64, __half>(c, r, g); }
    else { if (bf) many_g<128, __nv_bfloat16>(c, r, g); else many_g<128, __half>(c, r, g); }
    CU_LAUNCHED(c, "attention (decode, many sequences)");
    c->light_prev = 1;
}
