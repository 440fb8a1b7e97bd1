/*
 * dec-tc.cuh — what the decode kernels share (attn-decode.cu over 16-bit pools,
 * kvquant.cu over quantized ones): the merge of a query's slices (dec_merge);
 * and in the two tensor-core kernels four warps a block, each
 * walking every fourth run of 16 keys of the block's slice with its own
 * cp.async pipeline and online softmax, the lane of a quad holding head
 * r = lane / 4's scores of keys 2c, 2c+1, 8+2c, 9+2c (c = lane % 4) and its
 * accumulators o[NT][4] (m16n8 fragments: rows r and r + 8 are two parts of
 * head r's sums, columns the n-tiles' dimensions); then the warps' partials
 * merged in shared memory into the block's (m, l, o).
 */
#ifndef CINFER_DEC_TC_CUH
#define CINFER_DEC_TC_CUH
#include <math.h>
#include "backend/cuda/mma.cuh"

/* A warp's cp.async pipeline over its `mine` runs, ST stages: dec_pipe_start loads runs 0 .. ST-2 (one
 * commit group each, empty past the end); dec_pipe_next(t), before run t is read, loads run t + ST - 1 and
 * waits until run t has landed (and is visible to the warp). load(t) issues run t's copies into stage t % ST. */
template <int ST, typename LD>
__device__ __forceinline__ void dec_pipe_start(int mine, LD &load) {
#pragma unroll
    for (int t = 0; t < ST - 1; t++) {
        if (t < mine) load(t);
        cp_async_commit();
    }
}
template <int ST, typename LD>
__device__ __forceinline__ void dec_pipe_next(int t, int mine, LD &load) {
    if (t + ST - 1 < mine) load(t + ST - 1);
    cp_async_commit();
    cp_async_wait<ST - 1>();
    __syncwarp();
}

/* one run's online softmax step: x[4] the lane's scores (-inf: not a key), m_r / l_r the running max and
 * (lane-partial) sum, o rescaled; pv[4] = exp(x - m). Lazily: the running max moves only when a score passes it
 * by more than tau (natural-log units), so pv <= e^tau and most runs keep it — a factor of exactly 1, whose
 * rescale (a warp vote) and exp are skipped; (m, l, o) stays a partial of the same definition for any m. The
 * caller's tau keeps pv in its operands' range (bf16 P and the quantized kernel: 8; f16 P: ln 2); tau 0 is the eager
 * recurrence bit for bit (CINFER_CUDA_DEC_LAZY=1 passes 8: opt-in, not yet run on a GPU). */
template <int NT>
__device__ __forceinline__ float dec_online(const float *x, float &m_r, float &l_r, float (*o)[4], float *pv, float tau) {
    float mx = fmaxf(fmaxf(x[0], x[1]), fmaxf(x[2], x[3]));
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
    float mn = mx > m_r + tau ? mx : m_r, al = mn == m_r ? 1.0f : m_r == -INFINITY ? 0.0f : expf(m_r - mn);
#pragma unroll
    for (int t = 0; t < 4; t++) pv[t] = x[t] == -INFINITY ? 0.0f : expf(x[t] - mn);
    l_r = l_r * al + ((pv[0] + pv[1]) + (pv[2] + pv[3]));
    m_r = mn;
    if (__any_sync(0xffffffffu, al != 1.0f)) {
#pragma unroll
        for (int n = 0; n < NT; n++) {
            o[n][0] *= al; o[n][1] *= al; o[n][2] *= al; o[n][3] *= al;
        }
    }
    return al;
}

/* The four warps' partials into the block's: a warp's head r (lanes of quad r, r < g) gives its max m_r,
 * sum l_r and o[d] = its dims' values (od(n, e): n-tile n, element e of the lane's columns 2c, 2c+1, which
 * hold dims dm(n, 2c + e): n * 8 + 2c + e where the kernel's n-tiles are not permuted), through
 * wo [4][8][HD] (shared, free now), wm, wl [4][8]; then head h's merged max, sum and o[d] go to
 * md[h * ms], ld[h * ms] and ov[h * os + d]. walk: this block had keys (else nothing is written). */
template <int HD, typename OD, typename DM>
__device__ __forceinline__ void dec_warps_merge(int walk, int g, float m_r, float l_r, OD od, DM dm, float *wo, float (*wm)[8], float (*wl)[8],
                                                float *md, float *ld, size_t ms, float *ov, size_t os) {
    int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, r = lane >> 2, c = lane & 3;
    __syncthreads();   /* the stages are free */
    if (walk && r < g) {
#pragma unroll
        for (int n = 0; n < HD / 8; n++) {
            float *w = wo + ((size_t)warp * 8 + r) * HD;
            w[dm(n, 2 * c)] = od(n, 0);
            w[dm(n, 2 * c + 1)] = od(n, 1);
        }
        if (c == 0) {
            wm[warp][r] = m_r;
            wl[warp][r] = l_r;
        }
    }
    __syncthreads();
    if (!walk) return;
    for (int e = tid; e < g * HD; e += blockDim.x) {
        int h = e / HD;
        float M = fmaxf(fmaxf(wm[0][h], wm[1][h]), fmaxf(wm[2][h], wm[3][h])), v = 0.0f;
#pragma unroll
        for (int w = 0; w < 4; w++)
            if (wm[w][h] != -INFINITY) v += expf(wm[w][h] - M) * wo[((size_t)w * 8 + h) * HD + e % HD];
        ov[h * os + e % HD] = v;
    }
    if (tid < g) {
        float M = fmaxf(fmaxf(wm[0][tid], wm[1][tid]), fmaxf(wm[2][tid], wm[3][tid])), l = 0.0f;
#pragma unroll
        for (int w = 0; w < 4; w++)
            if (wm[w][tid] != -INFINITY) l += expf(wm[w][tid] - M) * wl[w][tid];
        md[tid * ms] = M;
        ld[tid * ms] = l;
    }
}

/* The end of a split decode block whose partial is in part (per head of the kv head's g: m, l, o[HD] of slice s at
 * s * (HD + 2), heads nsplit * (HD + 2) apart): the last block of the (query, kv head) to arrive merges the nsplit
 * slices into out: per head M = max m_s, weights exp(m_s - M) / sum_s l_s exp(m_s - M), in pieces of NB / GM slices
 * (buf: NB floats of shared scratch; mh, lh: GM floats). The merge is the kernel's tail, so its cost is its rounds of
 * L2 latency: a lane's m of all its slices issue together, then their (m, l), a piece's weights, then 8 slices of
 * every output of a thread at once. Empty slices (m = -inf) add exact zeros: the result does not depend on how many
 * there are (batch-invariant mode, where their number follows the batch). NTH threads a block. */
template <int HD, int GM, int NB, int NTH>
__device__ __forceinline__ void dec_merge(const float *part, int nsplit, int g, int bi, int H, int kvh, int n_kv, int valid, float *buf,
                                          float *mh, float *lh, int *cnt, float *out) {
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const size_t pstride = (size_t)nsplit * (HD + 2);
    int *ctr = &cnt[(size_t)bi * n_kv + kvh];
    if (!cu_arrive_last(ctr, nsplit)) return;
    const float *prow = part + ((size_t)bi * H + (size_t)kvh * g) * pstride;
    for (int h = warp; h < g; h += NTH / 32) {
        const float *ph = prow + h * pstride;
        float M = -INFINITY, l = 0.0f;
#pragma unroll 4
        for (int s2 = lane; s2 < nsplit; s2 += 32) M = fmaxf(M, __ldcg(ph + (size_t)s2 * (HD + 2)));
#pragma unroll
        for (int o = 16; o; o >>= 1) M = fmaxf(M, __shfl_xor_sync(0xffffffffu, M, o));
#pragma unroll 4
        for (int s2 = lane; s2 < nsplit; s2 += 32) {
            const float m = __ldcg(ph + (size_t)s2 * (HD + 2)), ls = __ldcg(ph + (size_t)s2 * (HD + 2) + 1);
            if (m != -INFINITY) l += ls * expf(m - M);
        }
#pragma unroll
        for (int o = 16; o; o >>= 1) l += __shfl_xor_sync(0xffffffffu, l, o);
        if (lane == 0) { mh[h] = M; lh[h] = l > 0 ? 1.0f / l : 0.0f; }
    }
    __syncthreads();
    constexpr int PIECE = NB / GM, OUTS = (GM * HD + NTH - 1) / NTH, SB = OUTS > 8 ? 4 : 8;   /* SB x OUTS loads a round */
    float o[OUTS];
#pragma unroll
    for (int u = 0; u < OUTS; u++) o[u] = 0.0f;
    for (int s0 = 0; s0 < nsplit; s0 += PIECE) {
        const int np = min(PIECE, nsplit - s0);
        for (int e = tid; e < g * PIECE; e += NTH) {
            const int h = e / PIECE, s2 = e % PIECE;
            const float m = s2 < np ? __ldcg(prow + h * pstride + (size_t)(s0 + s2) * (HD + 2)) : -INFINITY;
            buf[e] = m == -INFINITY ? 0.0f : expf(m - mh[h]) * lh[h];
        }
        __syncthreads();
        for (int sb = 0; sb < np; sb += SB) {   /* SB slices of every output: their loads in flight together */
            float v[SB][OUTS];
#pragma unroll
            for (int k = 0; k < SB; k++)
#pragma unroll
                for (int u = 0; u < OUTS; u++) {
                    const int e = tid + u * NTH, h = e / HD;
                    v[k][u] = h < g && sb + k < np ? __ldcg(prow + h * pstride + (size_t)(s0 + sb + k) * (HD + 2) + 2 + e % HD) : 0.0f;
                }
#pragma unroll
            for (int k = 0; k < SB; k++)
#pragma unroll
                for (int u = 0; u < OUTS; u++) {
                    const int e = tid + u * NTH, h = e / HD;
                    const float w = h < g && sb + k < np ? buf[h * PIECE + sb + k] : 0.0f;
                    o[u] += w > 0 ? w * v[k][u] : 0.0f;
                }
        }
        __syncthreads();
    }
#pragma unroll
    for (int u = 0; u < OUTS; u++) {
        const int e = tid + u * NTH, h = e / HD;
        if (h < g) out[((size_t)bi * H + (size_t)kvh * g + h) * HD + e % HD] = valid ? o[u] : 0.0f;
    }
    if (tid == 0) *ctr = 0;
}
#endif
