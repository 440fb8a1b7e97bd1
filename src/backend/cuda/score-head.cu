/*
 * score-head.cu — be_ops.score_head on the device: the LM head and the score
 * op's reduction in one kernel, so a scoring forward never writes its logits.
 *
 * Why: for a small hidden size the LM head is cheap to compute and expensive
 * to keep: prose-13m (hidden 256, vocabulary 32,000) spends 2 x 256 FLOPs on
 * a logit that costs 4 bytes to write and 8-12 to read back (score.cu); at
 * the H200's 800 TFLOP/s and 4.3 TB/s that round trip is worth ~2,000 FLOPs.
 * Taken for bf16 heads of hidden 64, 128, 192 or 256 (CINFER_CUDA_SCORE_HEAD=0:
 * never); larger heads keep cuBLAS + score.cu. Measured on the H200 (bench-cuda
 * BENCH_SCORE_AB, 2026-12-02, the mma.sync form of this kernel): prose-13m
 * perplexity 73.6% -> 85.6% of the forward's rate at 512 tokens a row;
 * Llama-3.2-1B (hidden 2048) forced to fold 94.4% -> 83.9%, cuBLAS's GEMM
 * being ~3x that kernel's there. The wgmma form (2026-12-06, H100): SH_NONE
 * 436 -> 375 us on 8,176 rows, perplexity 90-93% -> 94-95%.
 *
 * The products: x rounded to bf16 as the matmul rounds it for cuBLAS
 * (gemm.cu), wgmma (sm_90a) with f32 accumulation: the rows' A fragments
 * in registers, the head's tiles in shared memory (k_score_wg below). The
 * work is the (row tile of 128, vocabulary tile) pairs in row-tile order,
 * one wave of blocks (one an SM) each taking an equal run of them. After a
 * tile's products each thread folds its accumulators into per-row state;
 * each block writes one partial per row it touched; k_sh_combine merges a
 * row's partials (and takes the target's logit as a dot product of the
 * rounded row with the head's row). Hidden sizes 64, 128, 192, 256.
 *
 * Against the definition (be_ref_score_row on the same logits): the max and
 * the first index of the max exactly; the exp sum online: a running max of
 * each lane's columns, each tile's terms ex2.approx((z - m) log2 e)
 * (relative error <= 2^-22) summed in f32 and then into a double, rescaled
 * when the max grows; lanes and partials merged by rescaling. lse moves by
 * ~1e-7 relative (test-backend-ops: <= 3e-7 of |lse| on V = 32,000).
 * KL without knowing the model's lse: with c a per-row constant (the base's
 * lse for a live base, 0 for a file base), lq'_i = z_i - c (f32) and
 *   kld = sum_{lb_i > -16} p_i (lb_i - lq'_i) + (lse - c') sum_{lb_i > -16} p_i,  p_i = exp(lb_i):
 * the reference's sum with lq_i rounded against c instead of lse; c' = c
 * for a file base, and for a base head the base's lse as the kernel sums it
 * (its own, by the same rule as the model's, both sums started against c:
 * the two differ from c by the summation's rounding, ~1e-7). A live base's
 * terms are f32 a tile (its lb_i - lq'_i is exact or relative to itself), a
 * file base's double (lb_i - z_i is not). A model against itself gives
 * exactly 0: zb = z, so lb_i = lq'_i and the base's lse = the model's bit
 * for bit. code_scale and code_min are not computed (0): a saved base's code
 * rows go through the materialized path.
 */
#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include "backend/cuda/cuda.cuh"
#include "backend/cuda/mma.cuh"

#define SH_BK 64    /* hidden sizes: multiples of this up to 256 */

enum { SH_NONE = 0, SH_REC = 1, SH_HEAD = 2 };

/* a (row, block) partial: the running max m and the exp sum s against it, argmax (bv, bi), the KL sums
 * s0 = sum p, s1 = sum p (lb - lq'), and with a base head the base's running max mb and exp sum sb */
struct sh_part {
    float m, bv;
    int bi;
    float mb;
    double s, s0, s1, sb;
};

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

/* ------------------------------------------------------------------ the warpgroup kernel
 * Block: two warpgroups, each 64 rows of a 128-row tile, sharing the head's tiles of BN columns (64 without
 * a base head, 32 with one: the registers). A row tile's rows stay in registers (the wgmma A fragments: 4
 * words a k step and head) for the block's items on it; the head's tiles come through a ring of ST
 * shared-memory stages (cp.async, 128-byte swizzle), ST items loaded ahead. Items go in pairs: both
 * products issued (asynchronously, into two accumulator sets), the second's running on the tensor cores
 * while the first's logits are folded (the main loop says why not a rolling pipeline). Each lane keeps its
 * own running max and sum for its 2 rows; a row's 4 lanes are merged at the end of the block's run on its
 * row tile, one partial a (row, block). */
#define SW_BM 128
#define SW_T 256
template <int KIND, int KCT> struct sw_cfg {
    static constexpr int NG = KIND == SH_HEAD ? 2 : 1;
    static constexpr int BN = NG == 1 ? 64 : 32;          /* vocabulary columns an item */
    static constexpr int NA = BN / 2;                      /* accumulators a thread and head */
    static constexpr int ST = 5;                           /* stages */
    static constexpr int K = KCT * SH_BK;
    static constexpr int KS = K / 16;                      /* k steps */
    static constexpr int HB = BN * K * 2;                  /* bytes of a head's tile */
    static constexpr int STAGE = NG * HB;
    static constexpr size_t SMEM = (size_t)ST * STAGE + 1024;   /* + the 1024-byte alignment of the swizzle */
};
static int sw_bn(int kind) { return kind == SH_HEAD ? 32 : 64; }

template <int KIND, int KCT>
__global__ void __launch_bounds__(SW_T, 1)
k_score_wg(const __nv_bfloat16 *A, const __nv_bfloat16 *W, const __nv_bfloat16 *Ab, const __nv_bfloat16 *Wb, int n, int V,
           const float *cb, const unsigned char *rec, long long rec_bytes, const int32_t *idx, int nvt, sh_part *part) {
    using C = sw_cfg<KIND, KCT>;
    constexpr int NG = C::NG, BN = C::BN, NA = C::NA, ST = C::ST, K = C::K, KS = C::KS;
    constexpr float LOG2E = 1.4426950408889634f;
    PDL_ENTRY();
    extern __shared__ __align__(16) unsigned char sw_raw[];
    unsigned char *sm = sw_raw + ((1024 - ((uint32_t)__cvta_generic_to_shared(sw_raw) & 1023)) & 1023);
    const int t = threadIdx.x, lane = t & 31, tq = lane & 3;
    const int rw = (t >> 7) * 64 + ((t >> 5) & 3) * 16 + (lane >> 2);   /* the thread's first row in the tile (+ 8: its second) */
    const int G = gridDim.x, b = blockIdx.x, R = (n + SW_BM - 1) / SW_BM, PS = sh_slots(G, R);
    const long long NW = (long long)R * nvt;
    const int w0 = (int)(b * NW / G), w1 = (int)((b + 1) * NW / G), cnt = w1 - w0;
    const __nv_bfloat16 *As[2] = {A, Ab}, *Ws[2] = {W, Wb};
    const uint64_t d0 = wg_desc_sw128(sm);   /* the stages' descriptors: d0 + byte offset / 16 */

    /* a head tile (rows past V read the last row) into a stage: per head K / 64 slabs of BN rows x 128 bytes;
     * thread t's chunks: row c = i / (K / 8), 16-byte chunk k8 = i % (K / 8) of i = t + j SW_T */
    constexpr int NCH = BN * K / 8 / SW_T;
    auto load_b = [&](int vt, unsigned char *st) {
        const int v0 = vt * BN;
#pragma unroll
        for (int j = 0; j < NCH; j++) {
            const int i = t + j * SW_T, c = i / (K / 8), k8 = i % (K / 8), gc = v0 + c < V ? v0 + c : V - 1;
            const int so = (k8 >> 3) * BN * 128 + c * 128 + (((k8 & 7) ^ (c & 7)) << 4);
#pragma unroll
            for (int gi = 0; gi < NG; gi++) cp_async16(st + gi * C::HB + so, Ws[gi] + (size_t)gc * K + k8 * 8);
        }
    };
    /* row tile rt: the A fragments (rows past n read the last row), the rows' state, base constants, records */
    uint32_t af[NG][KS][4];
    float m[2], mb[2], bv[2], crow[2];
    int bi[2];
    double s[2], sb[2], s0[2], s1[2];
    const unsigned char *rp[2];
    auto rows_in = [&](int rt) {
        const int r0 = rt * SW_BM + rw;
#pragma unroll
        for (int h = 0; h < 2; h++) {
            const int r = r0 + 8 * h < n ? r0 + 8 * h : n - 1;
            bv[h] = -INFINITY;
            bi[h] = INT_MAX;
            s[h] = sb[h] = s0[h] = s1[h] = 0.0;
            crow[h] = KIND == SH_HEAD ? cb[r] : 0.0f;
            m[h] = mb[h] = KIND == SH_HEAD ? crow[h] : -INFINITY;   /* a base head: both sums start against c */
            rp[h] = KIND == SH_REC ? rec + (size_t)idx[r] * rec_bytes : NULL;
#pragma unroll
            for (int gi = 0; gi < NG; gi++)
#pragma unroll
                for (int ks = 0; ks < KS; ks++) {
                    const __nv_bfloat16 *p = As[gi] + (size_t)r * K + ks * 16 + 2 * tq;
                    af[gi][ks][h] = *(const uint32_t *)p;
                    af[gi][ks][2 + h] = *(const uint32_t *)(p + 8);
                }
        }
    };
    /* a running max and sum of a row's terms e = exp(z - m) (the one rule for the model's and a base's lse) */
    auto run = [&](const float *z, float &mm, double &ss, float *e) {
        float lm = z[0];
#pragma unroll
        for (int i = 1; i < NA / 2; i++) lm = fmaxf(lm, z[i]);
        if (lm > mm) {
            if (mm != -INFINITY) ss *= (double)sh_ex2(__fmul_rn(__fsub_rn(mm, lm), LOG2E));
            mm = lm;
        }
        if (mm != -INFINITY) {   /* the tile's terms in f32 (four partial sums), then into the double sum */
            const float off = -mm * LOG2E;
            float ts[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
            for (int i = 0; i < NA / 2; i++) {
                e[i] = sh_ex2(fmaf(z[i], LOG2E, off));
                ts[i & 3] += e[i];
            }
            ss += (double)((ts[0] + ts[1]) + (ts[2] + ts[3]));
        }
        return lm;
    };
    /* item (vt)'s logits (a[0] the model's, a[1] a base head's) into the rows' state */
    auto fold = [&](const float (&a)[NG][NA], int vt) {
        const int c0 = vt * BN + 2 * tq;
        const bool tail = (vt + 1) * BN > V;   /* the last tile (uniform): columns past V */
#pragma unroll
        for (int h = 0; h < 2; h++) {
            float z[NG][NA / 2];   /* row h's values; columns past V: -inf (the accumulators are not written outside wgmma) */
            if (tail) {
#pragma unroll
                for (int gi = 0; gi < NG; gi++)
#pragma unroll
                    for (int i = 0; i < NA / 2; i++)
                        z[gi][i] = c0 + (i >> 1) * 8 + (i & 1) >= V ? -INFINITY : a[gi][4 * (i >> 1) + 2 * h + (i & 1)];
            } else {
#pragma unroll
                for (int gi = 0; gi < NG; gi++)
#pragma unroll
                    for (int i = 0; i < NA / 2; i++) z[gi][i] = a[gi][4 * (i >> 1) + 2 * h + (i & 1)];
            }
            float e[NA / 2];
            const float lm = run(z[0], m[h], s[h], e);
            if (lm > bv[h]) {   /* a new best for this lane: its first column in the tile */
                bv[h] = lm;
#pragma unroll
                for (int i = NA / 2 - 1; i >= 0; i--)
                    if (z[0][i] == lm) bi[h] = c0 + (i >> 1) * 8 + (i & 1);
            }
            if (KIND == SH_HEAD) {   /* the base's own lse (the same rule), and lb, lq' against its given lse c:
                                      * p = exp(lb) = e f, f = exp(mb - c) (mb = c but where zb passed c) */
                run(z[NG - 1], mb[h], sb[h], e);
                const float f = sh_ex2(__fmul_rn(__fsub_rn(mb[h], crow[h]), LOG2E));
                float t0 = 0.0f, t1 = 0.0f;
#pragma unroll
                for (int i = 0; i < NA / 2; i++) {
                    const float lb = __fsub_rn(z[NG - 1][i], crow[h]), lq = __fsub_rn(z[0][i], crow[h]);
                    if (lb > -16.0f) {   /* (columns past V are -inf on both sides: outside) */
                        const float p = e[i] * f;
                        t0 += p;
                        t1 = fmaf(p, __fsub_rn(lb, lq), t1);
                    }
                }
                s0[h] += (double)t0;
                s1[h] += (double)t1;
            }
            if (KIND == SH_REC) {   /* lb from the record, lq' = z (c = 0): in double */
                const float bsc = *(const float *)rp[h], bmin = *(const float *)(rp[h] + 4);
#pragma unroll
                for (int i = 0; i < NA / 2; i += 2) {
                    const int col = c0 + (i >> 1) * 8;
                    if (col >= V) continue;
                    const uint32_t qq = *(const uint32_t *)(rp[h] + 16 + 2 * (size_t)col);   /* col even: 2 codes */
#pragma unroll
                    for (int e = 0; e < 2; e++) {
                        if (col + e >= V) continue;
                        const float lb = __fadd_rn(__fmul_rn(bsc, (float)((qq >> (16 * e)) & 0xffffu)), bmin);
                        if (lb > -16.0f) {
                            const double p = exp((double)lb);
                            s0[h] += p;
                            s1[h] += p * ((double)lb - (double)z[0][i + e]);
                        }
                    }
                }
            }
        }
    };
    /* the row tile's partials: a row's 4 lanes merged (their maxima, sums rescaled to the largest) */
    auto merge = [&](float mm, double ss, float &M) {
        M = mm;
#pragma unroll
        for (int o = 1; o <= 2; o <<= 1) M = fmaxf(M, __shfl_xor_sync(0xffffffffu, M, o));
        double sc = mm == -INFINITY ? 0.0 : ss * (double)sh_ex2(__fmul_rn(__fsub_rn(mm, M), LOG2E));
#pragma unroll
        for (int o = 1; o <= 2; o <<= 1) sc += __shfl_xor_sync(0xffffffffu, sc, o);
        return sc;
    };
    auto flush = [&](int rt) {
        const int slot = b - sh_first_block(rt, nvt, G, NW);
#pragma unroll
        for (int h = 0; h < 2; h++) {
            sh_part q;
            q.s = merge(m[h], s[h], q.m);
            q.sb = KIND == SH_HEAD ? merge(mb[h], sb[h], q.mb) : 0.0;
            if (KIND != SH_HEAD) q.mb = -INFINITY;
            float bw = bv[h];
            int bx = bi[h];
            double a0 = s0[h], a1 = s1[h];
#pragma unroll
            for (int o = 1; o <= 2; o <<= 1) {
                a0 += __shfl_xor_sync(0xffffffffu, a0, o);
                a1 += __shfl_xor_sync(0xffffffffu, a1, o);
                float ov = __shfl_xor_sync(0xffffffffu, bw, o);
                int oi = __shfl_xor_sync(0xffffffffu, bx, o);
                sh_pick(bw, bx, ov, oi);
            }
            const int gr = rt * SW_BM + rw + 8 * h;
            if (tq == 0 && gr < n) {
                q.bv = bw;
                q.bi = bx;
                q.s0 = a0;
                q.s1 = a1;
                part[(size_t)gr * PS + slot] = q;
            }
        }
    };
    /* acc's registers pinned in place around a wgmma (not moved across the issue or the wait) */
    auto settle = [&](float (&acc)[NG][NA]) {
#pragma unroll
        for (int gi = 0; gi < NG; gi++)
#pragma unroll
            for (int i = 0; i < NA; i++) wg_reg_fence(acc[gi][i]);
    };
    /* an item's products into acc from a stage (acc = the first k step's product: no zeroing pass) */
    auto mma = [&](float (&acc)[NG][NA], const unsigned char *st) {
        settle(acc);
        wg_fence();
#pragma unroll
        for (int ks = 0; ks < KS; ks++)
#pragma unroll
            for (int gi = 0; gi < NG; gi++)   /* the heads' chains interleaved */
                wgmma_bf16<BN>(acc[gi], af[gi][ks], d0 + (((st - sm) + gi * C::HB + (ks >> 2) * BN * 128 + (ks & 3) * 32) >> 4), ks > 0);
        wg_commit();
    };

    /* Items go in pairs (one where the row tile changes or the run ends): both issued, the second's products
     * running while the first is folded; nothing in flight between pairs. (ptxas serializes every wgmma of a
     * kernel where an accumulator is read on a path it cannot prove retired, which a product carried across
     * iterations is: hence pairs, not a rolling pipeline.) Stage of item i: i % ST; ST items loaded ahead,
     * one cp.async group an item (empty past the run). */
    int crt = w0 / nvt, vt = w0 % nvt, lvt = vt, lj = 0, stj = 0, stl = 0;
    auto load_next = [&]() {
        if (lj < cnt) {
            load_b(lvt, sm + stl * C::STAGE);
            if (++lvt == nvt) lvt = 0;
        }
        lj++;
        stl = stl == ST - 1 ? 0 : stl + 1;
        cp_async_commit();
    };
    rows_in(crt);
#pragma unroll
    for (int p = 0; p < ST; p++) load_next();
    float acc0[NG][NA], acc1[NG][NA];
    for (int j = 0; j < cnt;) {
        const int rt = (w0 + j) / nvt, vt1 = vt + 1 < nvt ? vt + 1 : 0;
        if (rt != crt) {
            flush(crt);
            crt = rt;
            rows_in(crt);
        }
        const bool two = j + 1 < cnt && vt1 != 0;   /* the next item on the same row tile */
        if (two) cp_async_wait<ST - 2>();
        else cp_async_wait<ST - 1>();
        fence_proxy_async();
        __syncthreads();
        const int st1 = stj == ST - 1 ? 0 : stj + 1;
        if (two) {
            mma(acc0, sm + stj * C::STAGE);
            mma(acc1, sm + st1 * C::STAGE);
            wg_wait<1>();
            settle(acc0);
            fold(acc0, vt);
            wg_wait<0>();
            settle(acc1);
        } else {
            mma(acc0, sm + stj * C::STAGE);
            wg_wait<0>();
            settle(acc0);
        }
        __syncthreads();   /* every thread's products done: the pair's stages refill */
        load_next();
        if (two) load_next();
        if (two) fold(acc1, vt1);
        else fold(acc0, vt);
        const int k = two ? 2 : 1;
        j += k;
        stj = two ? (st1 == ST - 1 ? 0 : st1 + 1) : st1;
        vt = two ? (vt1 + 1 < nvt ? vt1 + 1 : 0) : vt1;
    }
    flush(crt);
    cp_async_wait<0>();
}

/* a warp a row: the row's P partials into its be_score_row (as be_ref_score_row finishes); the
 * target's logit as a dot product of the row's rounded x with the head's row (f32, the lanes' sums
 * then a shuffle tree) */
__global__ void k_sh_combine(const sh_part *part, int G, int nvt, int n, int kind, const float *cb, const __nv_bfloat16 *A,
                             const __nv_bfloat16 *W, int K, const int32_t *tgt, be_score_row *out) {
    PDL_ENTRY();
    const int lane = threadIdx.x & 31, r = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    if (r >= n) return;
    const int R = (n + SW_BM - 1) / SW_BM, rt = r / SW_BM;
    const long long NW = (long long)R * nvt;
    /* the slots of the blocks that took this row tile, two warp columns each */
    const int P = sh_block_of((long long)(rt + 1) * nvt - 1, G, NW) - sh_first_block(rt, nvt, G, NW) + 1;
    const sh_part *pp = part + (size_t)r * sh_slots(G, R);
    float M = -INFINITY, bv = -INFINITY, tz = 0.0f;
    int bi = INT_MAX;
    const __nv_bfloat16 *a = A + (size_t)r * K, *w = W + (size_t)tgt[r] * K;
    for (int k = lane * 2; k < K; k += 64) {
        float2 x = __bfloat1622float2(*(const __nv_bfloat162 *)(a + k)), y = __bfloat1622float2(*(const __nv_bfloat162 *)(w + k));
        tz = fmaf(x.y, y.y, fmaf(x.x, y.x, tz));
    }
    float MB = -INFINITY;
    for (int i = lane; i < P; i += 32) {
        M = fmaxf(M, pp[i].m);
        MB = fmaxf(MB, pp[i].mb);
    }
    for (int o = 16; o; o >>= 1) {
        M = fmaxf(M, __shfl_xor_sync(0xffffffffu, M, o));
        MB = fmaxf(MB, __shfl_xor_sync(0xffffffffu, MB, o));
        tz += __shfl_xor_sync(0xffffffffu, tz, o);
    }
    double s = 0, s0 = 0, s1 = 0, sb = 0;
    for (int i = lane; i < P; i += 32) {
        sh_part q = pp[i];
        if (q.m != -INFINITY) s += q.s * (double)expf(__fsub_rn(q.m, M));
        if (q.mb != -INFINITY) sb += q.sb * (double)expf(__fsub_rn(q.mb, MB));
        s0 += q.s0;
        s1 += q.s1;
        sh_pick(bv, bi, q.bv, q.bi);
    }
    for (int o = 16; o; o >>= 1) {
        s += __shfl_xor_sync(0xffffffffu, s, o);
        sb += __shfl_xor_sync(0xffffffffu, sb, o);
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
    /* a base head's lse: its own (the same rule as the model's: a model against itself gives exactly 0); the
     * given one where no partial has a finite max (the given one -inf: every sum empty) */
    const float lb = kind != SH_HEAD ? 0.0f : MB != -INFINITY ? __fadd_rn(MB, (float)log(sb)) : cb[r];
    o.kld = kind == SH_NONE ? 0.0 : s1 + ((double)o.lse - (double)lb) * s0;
    cu_store_score_row(out + r, o);
}

/* a base's lse of each scored row from its context's kept results (be_score_base.lse_of) */
__global__ void k_sh_lse_of(const be_score_row *rows, const int32_t *idx, int n, float *out) {
    PDL_ENTRY();
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = rows[idx[i]].lse;
}

int cu_op_score_take(be_ctx *c, be_score_row *out, int n) {
    if (c->err) return 1;
    if (!c->sh_ev || n > c->sh_out_n) return cu_check(c, cudaErrorInvalidValue, "score take: no results left by score_head");
    if (cu_check(c, cudaEventSynchronize(c->sh_ev), "score take")) return 1;
    memcpy(out, c->sh_out_h, sizeof *out * (size_t)n);
    return 0;
}

static int sh_takes(const be_ctx *c, const be_mat *w) {
    return w && w->dt == BE_BF16 && w->cols % SH_BK == 0 && w->cols <= 4 * SH_BK && w->cols <= c->score_head_k && w->rows >= 1;
}

template <int KIND, int KCT>
static void sw_launch_k(be_ctx *c, dim3 grid, const __nv_bfloat16 *A, const __nv_bfloat16 *W, const __nv_bfloat16 *Ab,
                        const __nv_bfloat16 *Wb, int n, int V, const float *cb, const unsigned char *rec, long long rec_bytes,
                        const int32_t *idx, int nvt, sh_part *part) {
    size_t smem = sw_cfg<KIND, KCT>::SMEM;
    if (cu_check(c, cudaFuncSetAttribute(k_score_wg<KIND, KCT>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem),
                 "score head smem"))
        return;
    cu_launch(c, k_score_wg<KIND, KCT>, grid, dim3(SW_T), smem, A, W, Ab, Wb, n, V, cb, rec, rec_bytes, idx, nvt, part);
}
template <int KIND>
static void sw_launch(be_ctx *c, dim3 grid, const __nv_bfloat16 *A, const __nv_bfloat16 *W, const __nv_bfloat16 *Ab,
                      const __nv_bfloat16 *Wb, int n, int V, int K, const float *cb, const unsigned char *rec, long long rec_bytes,
                      const int32_t *idx, int nvt, sh_part *part) {
    if (K == 64) sw_launch_k<KIND, 1>(c, grid, A, W, Ab, Wb, n, V, cb, rec, rec_bytes, idx, nvt, part);
    else if (K == 128) sw_launch_k<KIND, 2>(c, grid, A, W, Ab, Wb, n, V, cb, rec, rec_bytes, idx, nvt, part);
    else if (K == 192) sw_launch_k<KIND, 3>(c, grid, A, W, Ab, Wb, n, V, cb, rec, rec_bytes, idx, nvt, part);
    else sw_launch_k<KIND, 4>(c, grid, A, W, Ab, Wb, n, V, cb, rec, rec_bytes, idx, nvt, part);
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
    const int R = (n + SW_BM - 1) / SW_BM, bn = sw_bn(kind), nvt = (V + bn - 1) / bn;
    /* one wave of blocks (one an SM), each an equal run of the (row tile, vocabulary tile) pairs */
    const long long NW = (long long)R * nvt;
    const int G = (long long)c->n_sm < NW ? c->n_sm : (int)NW, P = sh_slots(G, R);
    size_t a_bytes = (size_t)n * K * 2, off_ab = (a_bytes + 255) & ~(size_t)255,
           off_part = off_ab + (kind == SH_HEAD ? (a_bytes + 255) & ~(size_t)255 : 0),
           off_cb = off_part + ((sizeof(sh_part) * (size_t)n * P + 255) & ~(size_t)255), total = off_cb + sizeof(float) * (size_t)n;
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
    if (kind == SH_HEAD && base->lse_of) {   /* the base context's kept results, read where they are */
        const be_ctx *o = base->lse_of;
        if (!o->score_out) {
            cu_check(c, cudaErrorInvalidValue, "score head: the base context has no score results");
            return 1;
        }
        d_cb = (const float *)(ws + off_cb);
        cu_launch(c, k_sh_lse_of, dim3(cu_blocks((size_t)n, 256)), dim3(256), 0, (const be_score_row *)o->score_out, d_idx, n,
                  (float *)d_cb);
    } else if (kind == SH_HEAD && !(d_cb = cu_stage_base_lse(c, base, n)))
        return 1;
    /* the rows rounded as the matmul rounds them for cuBLAS; a base's gathered in scored-row order */
    if (cu_round16(c, x, NULL, K, A, BE_BF16, (size_t)n * K) ||
        (kind == SH_HEAD && cu_round16(c, base->x, d_idx, K, Ab, BE_BF16, (size_t)n * K)))
        return 1;
    const __nv_bfloat16 *W = (const __nv_bfloat16 *)w->dev;
    dim3 grid((unsigned)G);
    const __nv_bfloat16 *Wb = kind == SH_HEAD ? (const __nv_bfloat16 *)base->w->dev : NULL;
    const unsigned char *rec = kind == SH_REC ? base->rec : NULL;
    const long long rb = kind == SH_REC ? (long long)base->rec_bytes : 0;
    if (kind == SH_NONE) sw_launch<SH_NONE>(c, grid, A, W, NULL, NULL, n, V, K, NULL, NULL, 0, NULL, nvt, part);
    else if (kind == SH_REC) sw_launch<SH_REC>(c, grid, A, W, NULL, NULL, n, V, K, NULL, rec, rb, d_idx, nvt, part);
    else sw_launch<SH_HEAD>(c, grid, A, W, Ab, Wb, n, V, K, d_cb, NULL, 0, NULL, nvt, part);
    be_score_row *d_out = (be_score_row *)c->score_out;
    cu_launch(c, k_sh_combine, dim3(cu_blocks((size_t)n, 8)), dim3(256), 0, (const sh_part *)part, G, nvt, n, kind, d_cb,
              (const __nv_bfloat16 *)A, W, K, d_tgt, d_out);
    if (!out) {   /* left for score_take: copied to pinned memory, an event after it; no wait */
        if (c->sh_out_n < n) {
            if (c->sh_out_h) cudaFreeHost(c->sh_out_h);
            c->sh_out_h = NULL;
            c->sh_out_n = 0;
            if (cu_check(c, cudaMallocHost((void **)&c->sh_out_h, sizeof *out * (size_t)n), "score results (pinned)")) return 1;
            c->sh_out_n = n;
        }
        if (!c->sh_ev && cu_check(c, cudaEventCreateWithFlags(&c->sh_ev, cudaEventDisableTiming), "score event")) return 1;
        if (!CU_LAUNCHED(c, "score head"))
            cu_check(c, cudaMemcpyAsync(c->sh_out_h, d_out, sizeof *out * (size_t)n, cudaMemcpyDeviceToHost, c->stream), "score head copy");
        cu_check(c, cudaEventRecord(c->sh_ev, c->stream), "score event");
        return 1;
    }
    if (!CU_LAUNCHED(c, "score head") &&
        !cu_check(c, cudaMemcpyAsync(out, d_out, sizeof *out * (size_t)n, cudaMemcpyDeviceToHost, c->stream), "score head copy") &&
        !cu_check(c, cudaStreamSynchronize(c->stream), "score head sync"))
        c->arena_off = 0;   /* drained: the staged arrays are consumed */
    return 1;
}
