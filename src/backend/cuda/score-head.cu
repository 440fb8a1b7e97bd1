/*
 * score-head.cu — be_ops.score_head on the device: the LM head and the score
 * op's reduction in one kernel, so a scoring forward never writes its logits.
 *
 * Why: for a small hidden size the LM head is cheap to compute and expensive
 * to keep: prose-13m (hidden 256, vocabulary 32,000) spends 2 x 256 FLOPs on
 * a logit that costs 4 bytes to write and 8-12 to read back (score.cu); at
 * the H200's 800 TFLOP/s and 4.3 TB/s that round trip is worth ~2,000 FLOPs.
 * Taken for bf16 heads with hidden <= 256 (CINFER_CUDA_SCORE_HEAD=0: never,
 * =1: every bf16 head whose hidden is a multiple of 64); larger heads keep
 * cuBLAS + score.cu. Measured on the H200 (bench-cuda BENCH_SCORE_AB, 2026-12-02):
 * prose-13m (hidden 256) perplexity 73.6% -> 85.6% of the forward's rate at 512
 * tokens a row; Llama-3.2-1B (hidden 2048) forced to fold 94.4% -> 83.9%,
 * cuBLAS's GEMM being ~3x this kernel's there. 512-1024: not measured.
 *
 * The products: x rounded to bf16 as the matmul rounds it for cuBLAS
 * (gemm.cu), mma.sync m16n8k16 bf16 with f32 accumulation. The work is the
 * (row tile of 128, vocabulary tile of 128) pairs in row-tile order, one
 * wave of blocks (two an SM) each taking an equal run of them; 8 warps of
 * 32 rows x 64 columns; k in stages of 64 through cp.async (XOR-swizzled
 * rows, ldmatrix without bank conflicts). For hidden <= 256 the row tile
 * stays in shared memory for the block's run and the stages carry only the
 * head's rows (hidden a template parameter: 64, 128, 256). A base head (live
 * KL) is computed beside the model's in the same tile: two accumulators,
 * one block an SM. After a tile's last stage each thread folds its
 * accumulators into per-row state; the next tile's first products start
 * from zero (no zeroing pass). Each block writes one partial per row it
 * touched; k_sh_combine merges a row's partials (and takes the target's
 * logit as a dot product of the rounded row with the head's row).
 *
 * Against the definition (be_ref_score_row on the same logits): the max and
 * the first index of the max exactly; the exp sum online: a running max
 * shared by a row's 4 lanes, each tile's 16 terms ex2.approx((z - m) log2 e)
 * (relative error <= 2^-22) summed in f32 and then into a double,
 * rescaled when the max grows; partials merged by rescaling. lse moves by
 * ~1e-7 relative (test-backend-ops: <= 2e-7 of |lse| on V = 32,000).
 * KL without knowing the model's lse: with c a per-row constant (the base's
 * lse for a live base, 0 for a file base), lq'_i = z_i - c (f32) and
 *   kld = sum_{lb_i > -16} p_i (lb_i - lq'_i) + (lse - c) sum_{lb_i > -16} p_i,  p_i = exp(lb_i):
 * the reference's sum with lq_i rounded against c instead of lse. A live
 * base's terms are f32 a tile (its lb_i - lq'_i is exact or relative to
 * itself), a file base's double (lb_i - z_i is not). A model against itself
 * still gives exactly 0: every kind shares the tiles, the runs and each
 * thread's columns, so zb = z and the base's lse = the model's bit for bit,
 * lb_i = lq'_i, lse = c. code_scale and code_min are not computed (0): a
 * saved base's code rows go through the materialized path.
 */
#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include "backend/cuda/cuda.cuh"
#include "backend/cuda/mma.cuh"

#define SH_BM 128   /* rows a block */
#define SH_BK 64    /* k a stage */
#define SH_T 256    /* 8 warps: 4 along the rows, 2 along the vocabulary */
#define SH_RES_K 256   /* hidden sizes up to this keep the block's rows in shared memory for its whole split */

enum { SH_NONE = 0, SH_REC = 1, SH_HEAD = 2 };

/* a (row, split, warp column) partial: the running max m and the exp sum s against it, argmax (bv, bi),
 * the KL sums s0 = sum p, s1 = sum p (lb - lq') */
struct sh_part {
    float m, bv;
    int bi, pad;
    double s, s0, s1;
};

/* Every kind has the same tiles, splits and per-thread columns, so a row's lse comes out bit for bit
 * the same whichever kind computes it (a model against itself: KL exactly 0); a base head doubles
 * the accumulators and runs one block an SM. RES: the block's rows (all of k) stay in shared
 * memory and the stages hold only the head's rows, so each 128 x 128 tile reads 64 kB from L2 instead of
 * 128 (hidden <= SH_RES_K). */
#define SH_BN 128   /* vocabulary columns a tile */
template <int KIND, int KCT> struct sh_cfg {
    static constexpr bool RES = KCT > 0;
    static constexpr int NG = KIND == SH_HEAD ? 2 : 1;   /* GEMMs a tile: the model's, the base's */
    static constexpr int BN = SH_BN;
    static constexpr int WN = BN / 2;                    /* a warp's columns */
    static constexpr int NT = WN / 8;                    /* its n8 tiles */
    static constexpr int STAGES = 3;
    static constexpr int MINB = NG == 1 ? 2 : 1;         /* blocks an SM (registers, shared memory) */
    static constexpr int STAGE = NG * ((RES ? 0 : SH_BM) + BN) * SH_BK;   /* bf16 elements a stage */
    static constexpr int ARES = NG * SH_BM * KCT * SH_BK;                 /* resident rows */
    static constexpr size_t SMEM = ((size_t)STAGES * STAGE + ARES) * 2;
};

/* element offset of (row r, 8-element chunk ch) in a tile of rows of rl elements, each 8 chunks
 * XOR-swizzled by r (ldmatrix and cp.async without bank conflicts) */
__device__ __forceinline__ int sh_sw(int r, int ch, int rl) { return r * rl + (((ch & ~7) | ((ch ^ r) & 7)) << 3); }

__device__ __forceinline__ void sh_pick(float &bv, int &bi, float ov, int oi) {
    if (ov > bv || (ov == bv && oi < bi)) { bv = ov; bi = oi; }
}

__device__ __forceinline__ float sh_ex2(float x) {
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
}

/* The blocks' runs of work: block b takes items [b NW / G, (b + 1) NW / G) of the NW = R * nvt
 * (row tile, vocabulary tile) pairs, G <= NW. The first block whose run holds row tile rt's first
 * item, and the partial slots a row needs (the blocks one row tile can span). */
__host__ __device__ __forceinline__ int sh_block_of(long long item, int G, long long NW) { return (int)(((item + 1) * G - 1) / NW); }
__host__ __device__ __forceinline__ int sh_first_block(int rt, int nvt, int G, long long NW) {
    return sh_block_of((long long)rt * nvt, G, NW);
}
__host__ __device__ __forceinline__ int sh_slots(int G, int R) { return (G + R - 1) / R + 1; }

/* KCT > 0: hidden = KCT * 64 (<= SH_RES_K), the rows resident; 0: any multiple of 64, streamed */
template <int KIND, int KCT>
__global__ void __launch_bounds__(SH_T, (sh_cfg<KIND, KCT>::MINB))
k_score_head(const __nv_bfloat16 *A, const __nv_bfloat16 *W, const __nv_bfloat16 *Ab, const __nv_bfloat16 *Wb, int n,
             int V, int K, const float *cb, const unsigned char *rec, long long rec_bytes, const int32_t *idx, int nvt,
             sh_part *part) {
    using C = sh_cfg<KIND, KCT>;
    constexpr int NG = C::NG, BN = C::BN, WN = C::WN, NT = C::NT, ST = C::STAGES;
    constexpr bool RES = C::RES;
    if (KCT) K = KCT * SH_BK;
    constexpr float LOG2E = 1.4426950408889634f;
    PDL_ENTRY();
    extern __shared__ __align__(16) __nv_bfloat16 sm[];
    const int t = threadIdx.x, lane = t & 31, wid = t >> 5, wm = wid >> 1, wn = wid & 1;
    /* the work: (row tile, vocabulary tile) pairs in row-tile order, an equal run a block */
    const int G = gridDim.x, b = blockIdx.x, R = (n + SH_BM - 1) / SH_BM, PS = sh_slots(G, R);
    const long long NW = (long long)R * nvt;
    const int w0 = (int)(b * NW / G), w1 = (int)((b + 1) * NW / G);
    const int KC = KCT ? KCT : K / SH_BK, T = (w1 - w0) * KC;
    const __nv_bfloat16 *As[2] = {A, Ab}, *Ws[2] = {W, Wb};
    __nv_bfloat16 *sres = sm + ST * C::STAGE;   /* RES: [NG][SH_BM][K] */
    __shared__ float s_cb[SH_BM];               /* the row tile's base constants */

    /* rows past n read the last row, columns past V the last column (their results are never used) */
    auto rows_in = [&](int rt) {   /* RES: row tile rt into sres (a commit group of its own); s_cb */
        const int r0 = rt * SH_BM;
        if (RES) {
#pragma unroll
            for (int g = 0; g < NG; g++)
                for (int i = t; i < SH_BM * (K / 8); i += SH_T) {
                    int r = i / (K / 8), ch = i % (K / 8), gr = r0 + r < n ? r0 + r : n - 1;
                    cp_async16(sres + g * SH_BM * K + sh_sw(r, ch, K), As[g] + (size_t)gr * K + ch * 8);
                }
        }
        cp_async_commit();
        if (t < SH_BM) s_cb[t] = KIND == SH_HEAD ? cb[r0 + t < n ? r0 + t : n - 1] : 0.0f;
    };
    /* the loads of the stage the cursor (row tile lrt, vocabulary tile lvt, k chunk lkc; stage lst)
     * names, then the cursor moves on */
    int lrt = w0 / nvt, lvt = w0 % nvt, lkc = 0, lst = 0;
    auto load = [&]() {
        __nv_bfloat16 *st = sm + lst * C::STAGE;
        const int v0 = lvt * BN, k0 = lkc * SH_BK, r0 = lrt * SH_BM;
#pragma unroll
        for (int g = 0; g < NG; g++) {
            __nv_bfloat16 *sa = st + g * ((RES ? 0 : SH_BM) + BN) * SH_BK, *sb = sa + (RES ? 0 : SH_BM * SH_BK);
            if (!RES) {
#pragma unroll
                for (int j = 0; j < SH_BM * 8 / SH_T; j++) {
                    int i = t + j * SH_T, r = i >> 3, ch = i & 7, gr = r0 + r < n ? r0 + r : n - 1;
                    cp_async16(sa + sh_sw(r, ch, SH_BK), As[g] + (size_t)gr * K + k0 + ch * 8);
                }
            }
#pragma unroll
            for (int j = 0; j < BN * 8 / SH_T; j++) {
                int i = t + j * SH_T, r = i >> 3, ch = i & 7, gc = v0 + r < V ? v0 + r : V - 1;
                cp_async16(sb + sh_sw(r, ch, SH_BK), Ws[g] + (size_t)gc * K + k0 + ch * 8);
            }
        }
        lst = lst == ST - 1 ? 0 : lst + 1;
        if (++lkc == KC) {
            lkc = 0;
            if (++lvt == nvt) { lvt = 0; lrt++; }
        }
    };

    float acc[NG][2][NT][4];
    /* per-row state of the thread's 4 rows (ri = mt * 2 + h: block row wm*32 + mt*16 + lane/4 + 8h);
     * m is shared by the row's 4 lanes, bv / bi are the lane's own */
    float m[4], bv[4];
    int bi[4];
    double s[4], s0[4], s1[4];
#define SH_ROW(ri) (wm * 32 + ((ri) >> 1) * 16 + (lane >> 2) + ((ri) & 1) * 8)
    auto reset = [&]() {
#pragma unroll
        for (int ri = 0; ri < 4; ri++) {
            m[ri] = bv[ri] = -INFINITY;
            bi[ri] = INT_MAX;
            s[ri] = s0[ri] = s1[ri] = 0.0;
        }
    };
    /* the 4 lanes of a row share m: their sums add; one lane writes the row's partial (slot: this
     * block among those that share row tile rt) */
    auto flush = [&](int rt) {
        const int slot = b - sh_first_block(rt, nvt, G, NW);
#pragma unroll
        for (int ri = 0; ri < 4; ri++) {
#pragma unroll
            for (int o = 1; o <= 2; o <<= 1) {
                s[ri] += __shfl_xor_sync(0xffffffffu, s[ri], o);
                s0[ri] += __shfl_xor_sync(0xffffffffu, s0[ri], o);
                s1[ri] += __shfl_xor_sync(0xffffffffu, s1[ri], o);
                float ov = __shfl_xor_sync(0xffffffffu, bv[ri], o);
                int oi = __shfl_xor_sync(0xffffffffu, bi[ri], o);
                sh_pick(bv[ri], bi[ri], ov, oi);
            }
            const int gr = rt * SH_BM + SH_ROW(ri);
            if ((lane & 3) == 0 && gr < n) {
                sh_part q;
                q.m = m[ri]; q.bv = bv[ri];
                q.bi = bi[ri]; q.pad = 0;
                q.s = s[ri]; q.s0 = s0[ri]; q.s1 = s1[ri];
                part[((size_t)gr * PS + slot) * 2 + wn] = q;
            }
        }
    };
    reset();
    /* acc = v at the columns >= lim of the tile whose first column (for this lane) is c0 */
    auto fill = [&](float v, int c0, int lim) {
#pragma unroll
        for (int g = 0; g < NG; g++)
#pragma unroll
            for (int mt = 0; mt < 2; mt++)
#pragma unroll
                for (int nt = 0; nt < NT; nt++)
#pragma unroll
                    for (int e = 0; e < 4; e++)
                        if (c0 + nt * 8 + (e & 1) >= lim) acc[g][mt][nt][e] = v;
    };

    int crt = w0 / nvt;   /* the row tile in shared memory */
    rows_in(crt);
#pragma unroll
    for (int p = 0; p < ST - 1; p++) {
        if (p < T) load();
        cp_async_commit();
    }
    int it = 0, rst = 0, rt = crt, vt = w0 % nvt - 1;   /* iterations done; the stage read next; the item */
    for (int w = w0; w < w1; w++) {
        if (++vt == nvt) { vt = 0; rt++; }
        if (rt != crt) {   /* the next row tile: flush, then its rows in (the stages in flight drain) */
            flush(crt);
            reset();
            __syncthreads();
            crt = rt;
            rows_in(crt);
            cp_async_wait<0>();
        }
#pragma unroll
        for (int kc = 0; kc < KC; kc++, it++) {
            cp_async_wait<ST - 2>();
            __syncthreads();
            if (it + ST - 1 < T) load();
            cp_async_commit();
            const __nv_bfloat16 *st = sm + rst * C::STAGE;
            rst = rst == ST - 1 ? 0 : rst + 1;
#pragma unroll
            for (int ks = 0; ks < SH_BK / 16; ks++) {
#pragma unroll
                for (int g = 0; g < NG; g++) {
                    const __nv_bfloat16 *sa = st + g * ((RES ? 0 : SH_BM) + BN) * SH_BK, *sb = sa + (RES ? 0 : SH_BM * SH_BK);
                    uint32_t af[2][4];
#pragma unroll
                    for (int mt = 0; mt < 2; mt++) {
                        int r = wm * 32 + mt * 16 + (lane & 15), ch = ks * 2 + (lane >> 4);
                        ldsm_x4(af[mt], RES ? sres + g * SH_BM * K + sh_sw(r, kc * 8 + ch, K) : sa + sh_sw(r, ch, SH_BK));
                    }
#pragma unroll
                    for (int p = 0; p < NT / 2; p++) {   /* n8 tiles 2p and 2p + 1 */
                        int r = wn * WN + p * 16 + (lane & 7) + ((lane >> 4) << 3);
                        uint32_t q[4];
                        ldsm_x4(q, sb + sh_sw(r, ks * 2 + ((lane >> 3) & 1), SH_BK));
#pragma unroll
                        for (int mt = 0; mt < 2; mt++) {
                            if (kc == 0 && ks == 0) {   /* the tile's first products */
                                mma16816_bf16_z(acc[g][mt][2 * p], af[mt], q[0], q[1]);
                                mma16816_bf16_z(acc[g][mt][2 * p + 1], af[mt], q[2], q[3]);
                            } else {
                                mma16816_bf16(acc[g][mt][2 * p], af[mt], q[0], q[1]);
                                mma16816_bf16(acc[g][mt][2 * p + 1], af[mt], q[2], q[3]);
                            }
                        }
                    }
                }
            }
        }
        /* the tile's logits are complete: fold them into the rows' state (columns past V: -inf) */
        const int cb0 = vt * BN + wn * WN + 2 * (lane & 3);
        if ((vt + 1) * BN > V) fill(-INFINITY, cb0, V);
#pragma unroll
        for (int ri = 0; ri < 4; ri++) {
            const int mt = ri >> 1, h = ri & 1, lr = SH_ROW(ri);
            float lm = -INFINITY;
#pragma unroll
            for (int nt = 0; nt < NT; nt++) lm = fmaxf(lm, fmaxf(acc[0][mt][nt][2 * h], acc[0][mt][nt][2 * h + 1]));
            if (lm > bv[ri]) {   /* a new best for this lane: its first column (rare after the first tiles) */
                bv[ri] = lm;
#pragma unroll
                for (int nt = NT - 1; nt >= 0; nt--)
#pragma unroll
                    for (int e = 1; e >= 0; e--)
                        if (acc[0][mt][nt][2 * h + e] == lm) bi[ri] = cb0 + nt * 8 + e;
            }
            lm = fmaxf(lm, __shfl_xor_sync(0xffffffffu, lm, 1));
            lm = fmaxf(lm, __shfl_xor_sync(0xffffffffu, lm, 2));
            const float mw = fmaxf(m[ri], lm);
            if (mw > m[ri]) {
                s[ri] *= (double)sh_ex2(__fmul_rn(__fsub_rn(m[ri], mw), LOG2E));
                m[ri] = mw;
            }
            if (mw != -INFINITY) {   /* the tile's (at most 16) terms in f32, then into the double sum */
                const float off = -mw * LOG2E;
                float ts = 0.0f;
#pragma unroll
                for (int nt = 0; nt < NT; nt++)
#pragma unroll
                    for (int e = 0; e < 2; e++) ts += sh_ex2(fmaf(acc[0][mt][nt][2 * h + e], LOG2E, off));
                s[ri] += (double)ts;
            }
            if (KIND == SH_HEAD) {   /* lb, lq' against the base's lse: f32 terms a tile, as above */
                const float crow = s_cb[lr];
                float t0 = 0.0f, t1 = 0.0f;
#pragma unroll
                for (int nt = 0; nt < NT; nt++)
#pragma unroll
                    for (int e = 0; e < 2; e++) {
                        float lb = __fsub_rn(acc[1][mt][nt][2 * h + e], crow), lq = __fsub_rn(acc[0][mt][nt][2 * h + e], crow);
                        if (lb > -16.0f) {   /* (columns past V are -inf on both sides: outside) */
                            float p = sh_ex2(lb * LOG2E);
                            t0 += p;
                            t1 = fmaf(p, __fsub_rn(lb, lq), t1);
                        }
                    }
                s0[ri] += (double)t0;
                s1[ri] += (double)t1;
            }
            if (KIND == SH_REC && rt * SH_BM + lr < n) {   /* lb from the record, lq' = z (c = 0): in double */
                const unsigned char *rp = rec + (size_t)idx[rt * SH_BM + lr] * rec_bytes;
                const float bsc = *(const float *)rp, bmin = *(const float *)(rp + 4);
#pragma unroll
                for (int nt = 0; nt < NT; nt++) {
                    const int col = cb0 + nt * 8;
                    if (col >= V) continue;
                    uint32_t qq = *(const uint32_t *)(rp + 16 + 2 * (size_t)col);   /* col even: 2 codes */
#pragma unroll
                    for (int e = 0; e < 2; e++) {
                        if (col + e >= V) continue;
                        float lb = __fadd_rn(__fmul_rn(bsc, (float)((qq >> (16 * e)) & 0xffffu)), bmin);
                        if (lb > -16.0f) {
                            double p = exp((double)lb);
                            s0[ri] += p;
                            s1[ri] += p * ((double)lb - (double)acc[0][mt][nt][2 * h + e]);
                        }
                    }
                }
            }
        }
    }
    cp_async_wait<0>();
    flush(crt);
#undef SH_ROW
}

/* a warp a row: the row's P partials into its be_score_row (as be_ref_score_row finishes); the
 * target's logit as a dot product of the row's rounded x with the head's row (f32, the lanes' sums
 * then a shuffle tree) */
__global__ void k_sh_combine(const sh_part *part, int G, int nvt, int n, int kind, const float *cb, const __nv_bfloat16 *A,
                             const __nv_bfloat16 *W, int K, const int32_t *tgt, be_score_row *out) {
    PDL_ENTRY();
    const int lane = threadIdx.x & 31, r = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    if (r >= n) return;
    const int R = (n + SH_BM - 1) / SH_BM, rt = r / SH_BM;
    const long long NW = (long long)R * nvt;
    /* the slots of the blocks that took this row tile, two warp columns each */
    const int P = 2 * (sh_block_of((long long)(rt + 1) * nvt - 1, G, NW) - sh_first_block(rt, nvt, G, NW) + 1);
    const sh_part *pp = part + (size_t)r * sh_slots(G, R) * 2;
    float M = -INFINITY, bv = -INFINITY, tz = 0.0f;
    int bi = INT_MAX;
    const __nv_bfloat16 *a = A + (size_t)r * K, *w = W + (size_t)tgt[r] * K;
    for (int k = lane * 2; k < K; k += 64) {
        float2 x = __bfloat1622float2(*(const __nv_bfloat162 *)(a + k)), y = __bfloat1622float2(*(const __nv_bfloat162 *)(w + k));
        tz = fmaf(x.y, y.y, fmaf(x.x, y.x, tz));
    }
    for (int i = lane; i < P; i += 32) M = fmaxf(M, pp[i].m);
    for (int o = 16; o; o >>= 1) {
        M = fmaxf(M, __shfl_xor_sync(0xffffffffu, M, o));
        tz += __shfl_xor_sync(0xffffffffu, tz, o);
    }
    double s = 0, s0 = 0, s1 = 0;
    for (int i = lane; i < P; i += 32) {
        sh_part q = pp[i];
        if (q.m != -INFINITY) s += q.s * (double)expf(__fsub_rn(q.m, M));
        s0 += q.s0;
        s1 += q.s1;
        sh_pick(bv, bi, q.bv, q.bi);
    }
    for (int o = 16; o; o >>= 1) {
        s += __shfl_xor_sync(0xffffffffu, s, o);
        s0 += __shfl_xor_sync(0xffffffffu, s0, o);
        s1 += __shfl_xor_sync(0xffffffffu, s1, o);
        float ov = __shfl_xor_sync(0xffffffffu, bv, o);
        int oi = __shfl_xor_sync(0xffffffffu, bi, o);
        sh_pick(bv, bi, ov, oi);
    }
    if (lane) return;
    be_score_row o;
    /* every logit -inf (or NaN): the reference's sum is NaN */
    o.lse = M == -INFINITY ? NAN : __fadd_rn(M, (float)log(s));
    o.lp = __fsub_rn(tz, o.lse);
    o.argmax = bi == INT_MAX ? 0 : bi;
    o.code_min = o.code_scale = 0.0f;   /* no codes through this op */
    o.kld = kind == SH_NONE ? 0.0 : s1 + ((double)o.lse - (double)(kind == SH_HEAD ? cb[r] : 0.0f)) * s0;
    cu_store_score_row(out + r, o);
}

static int sh_takes(const be_ctx *c, const be_mat *w) {
    return w && w->dt == BE_BF16 && w->cols % SH_BK == 0 && w->cols <= c->score_head_k && w->rows >= 1;
}

template <int KIND, int KCT>
static void sh_launch_k(be_ctx *c, dim3 grid, const __nv_bfloat16 *A, const __nv_bfloat16 *W, const __nv_bfloat16 *Ab,
                        const __nv_bfloat16 *Wb, int n, int V, int K, const float *cb, const unsigned char *rec,
                        long long rec_bytes, const int32_t *idx, int nvt, sh_part *part) {
    size_t smem = sh_cfg<KIND, KCT>::SMEM;
    if (cu_check(c, cudaFuncSetAttribute(k_score_head<KIND, KCT>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem),
                 "score head smem"))
        return;
    cu_launch(c, k_score_head<KIND, KCT>, grid, dim3(SH_T), smem, A, W, Ab, Wb, n, V, K, cb, rec, rec_bytes, idx, nvt, part);
}

template <int KIND>
static void sh_launch(be_ctx *c, dim3 grid, const __nv_bfloat16 *A, const __nv_bfloat16 *W, const __nv_bfloat16 *Ab,
                      const __nv_bfloat16 *Wb, int n, int V, int K, const float *cb, const unsigned char *rec,
                      long long rec_bytes, const int32_t *idx, int nvt, sh_part *part) {
    switch (K) {   /* hidden 64, 128, 256: resident rows, the loop unrolled */
    case 64: sh_launch_k<KIND, 1>(c, grid, A, W, Ab, Wb, n, V, K, cb, rec, rec_bytes, idx, nvt, part); break;
    case 128: sh_launch_k<KIND, 2>(c, grid, A, W, Ab, Wb, n, V, K, cb, rec, rec_bytes, idx, nvt, part); break;
    case 256: sh_launch_k<KIND, 4>(c, grid, A, W, Ab, Wb, n, V, K, cb, rec, rec_bytes, idx, nvt, part); break;
    default: sh_launch_k<KIND, 0>(c, grid, A, W, Ab, Wb, n, V, K, cb, rec, rec_bytes, idx, nvt, part);
    }
}

int cu_op_score_head(be_ctx *c, const float *x, int n, const be_mat *w, const int32_t *tgt, const be_score_base *base,
                     be_score_row *out) {
    int kind = !base ? SH_NONE : base->rec ? SH_REC : base->x ? SH_HEAD : -1;
    int takes = kind >= 0 && sh_takes(c, w) &&
                (kind != SH_HEAD || (sh_takes(c, base->w) && base->w->cols == w->cols && base->w->rows == w->rows));
    if (!x || !takes) return takes;
    if (n <= 0) return 1;
    cu_go_eager(c);
    const int K = (int)w->cols, V = (int)w->rows;
    const int R = (n + SH_BM - 1) / SH_BM, nvt = (V + SH_BN - 1) / SH_BN;
    /* one wave of two blocks an SM (every kind: the same runs, so the same sums), each an equal run
     * of the (row tile, vocabulary tile) pairs */
    const long long NW = (long long)R * nvt;
    const int G = (long long)c->n_sm * 2 < NW ? c->n_sm * 2 : (int)NW, P = sh_slots(G, R) * 2;
    size_t a_bytes = (size_t)n * K * 2, off_ab = (a_bytes + 255) & ~(size_t)255,
           off_part = off_ab + (kind == SH_HEAD ? (a_bytes + 255) & ~(size_t)255 : 0),
           total = off_part + sizeof(sh_part) * (size_t)n * P;
    if (!cu_ensure(c, &c->sh_ws, &c->sh_ws_n, total) ||
        !cu_ensure(c, &c->score_out, &c->score_out_n, sizeof(be_score_row) * (size_t)n)) {
        cu_check(c, cudaErrorMemoryAllocation, "score head workspace");
        return 1;
    }
    char *ws = (char *)c->sh_ws;
    __nv_bfloat16 *A = (__nv_bfloat16 *)ws, *Ab = (__nv_bfloat16 *)(ws + off_ab);
    sh_part *part = (sh_part *)(ws + off_part);
    const int32_t *d_tgt = (const int32_t *)cu_stage(c, tgt, sizeof(int32_t) * (size_t)n);
    const int32_t *d_idx = kind != SH_NONE ? (const int32_t *)cu_stage(c, base->idx, sizeof(int32_t) * (size_t)n) : NULL;
    const float *d_cb = NULL;
    if (kind == SH_HEAD && !(d_cb = cu_stage_base_lse(c, base, n))) return 1;
    /* the rows rounded as the matmul rounds them for cuBLAS; a base's gathered in scored-row order */
    if (cu_round16(c, x, NULL, K, A, BE_BF16, (size_t)n * K) ||
        (kind == SH_HEAD && cu_round16(c, base->x, d_idx, K, Ab, BE_BF16, (size_t)n * K)))
        return 1;
    const __nv_bfloat16 *W = (const __nv_bfloat16 *)w->dev;
    dim3 grid((unsigned)G);
    if (kind == SH_NONE) sh_launch<SH_NONE>(c, grid, A, W, NULL, NULL, n, V, K, NULL, NULL, 0, NULL, nvt, part);
    else if (kind == SH_REC)
        sh_launch<SH_REC>(c, grid, A, W, NULL, NULL, n, V, K, NULL, base->rec, (long long)base->rec_bytes, d_idx, nvt, part);
    else
        sh_launch<SH_HEAD>(c, grid, A, W, Ab, (const __nv_bfloat16 *)base->w->dev, n, V, K, d_cb, NULL, 0, NULL, nvt, part);
    be_score_row *d_out = (be_score_row *)c->score_out;
    cu_launch(c, k_sh_combine, dim3(cu_blocks((size_t)n, 8)), dim3(256), 0, (const sh_part *)part, G, nvt, n, kind, d_cb,
              (const __nv_bfloat16 *)A, W, K, d_tgt, d_out);
    if (!CU_LAUNCHED(c, "score head") &&
        !cu_check(c, cudaMemcpyAsync(out, d_out, sizeof *out * (size_t)n, cudaMemcpyDeviceToHost, c->stream), "score head copy") &&
        !cu_check(c, cudaStreamSynchronize(c->stream), "score head sync"))
        c->arena_off = 0;   /* drained: the staged arrays are consumed */
    return 1;
}
