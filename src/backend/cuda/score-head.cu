/*
 * score-head.cu — be_ops.score_head on the device: the LM head and the score
 * op's reduction in one kernel, so a scoring forward never writes its logits.
 *
 * Why: for a small hidden size the LM head is cheap to compute and expensive
 * to keep: prose-13m (hidden 256, vocabulary 32,000) spends 2 x 256 FLOPs on
 * a logit that costs 4 bytes to write and 8-12 to read back (score.cu); at
 * the H200's 800 TFLOP/s and 4.3 TB/s that round trip is worth ~2,000 FLOPs.
 * Taken for bf16 heads with hidden <= 1024 (CINFER_CUDA_SCORE_HEAD=0: never,
 * =1: every bf16 head whose hidden is a multiple of 64); larger heads keep
 * cuBLAS + score.cu, which the H200 runs at 96-99% of the forward's rate.
 *
 * The products: x rounded to bf16 as the matmul rounds it for cuBLAS
 * (gemm.cu), mma.sync m16n8k16 bf16 with f32 accumulation; a block takes 128
 * rows and a split of the vocabulary in tiles of 128 columns (with a base
 * head, the base's tile alongside), k in stages of 64 through cp.async
 * (XOR-swizzled rows, ldmatrix without conflicts), 8 warps of 32 rows x 64
 * columns. After a tile's last k stage each thread folds its
 * accumulators into per-row state and the next tile starts from zero.
 *
 * The statistics, against the definition (be_ref_score_row on the same
 * logits): max, min and the first index of the max exactly; the exp sum is
 * online (a running max shared by the 4 lanes of a row, the sum rescaled
 * when it grows, then the partials of the warps and splits combined by
 * rescaling in k_sh_combine), each term expf(z - m) summed in double as the
 * reference does but against a running max: lse moves by f32 rounding only.
 * KL without knowing the model's lse: with c a per-row constant (the base's
 * lse for a live base, 0 for a file base), lq'_i = z_i - c (f32) and
 *   kld = sum_{lb_i > -16} p_i (lb_i - lq'_i) + (lse - c) sum_{lb_i > -16} p_i,  p_i = exp(lb_i),
 * in double: the reference's sum with lq_i = z_i - lse rounded against c
 * instead of lse (a model against itself still gives exactly 0: zb = z bit
 * for bit, lb_i = lq'_i, lse = c).
 */
#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include "backend/cuda/cuda.cuh"
#include "backend/cuda/mma.cuh"

#define SH_BM 128   /* rows a block */
#define SH_BK 64    /* k a stage */
#define SH_T 256    /* 8 warps: 4 along the rows, 2 along the vocabulary */

enum { SH_NONE = 0, SH_REC = 1, SH_HEAD = 2 };

/* a (row, split, warp column) partial: the running max m and the exp sum s against it,
 * min, argmax (bv, bi), the target's logit (tz when has), the KL sums s0 = sum p, s1 = sum p (lb - lq') */
struct sh_part {
    float m, mn, bv, tz;
    int bi, has;
    double s, s0, s1;
};

/* Every kind has the same tiles, splits and per-thread columns, so a row's lse comes out bit for bit
 * the same whichever kind computes it (a model against itself: KL exactly 0); a base head doubles
 * the accumulators and runs one block an SM. */
#define SH_BN 128   /* vocabulary columns a tile */
template <int KIND> struct sh_cfg {
    static constexpr int NG = KIND == SH_HEAD ? 2 : 1;   /* GEMMs a tile: the model's, the base's */
    static constexpr int BN = SH_BN;
    static constexpr int WN = BN / 2;                    /* a warp's columns */
    static constexpr int NT = WN / 8;                    /* its n8 tiles */
    static constexpr int STAGES = 3;
    static constexpr int MINB = NG == 1 ? 2 : 1;         /* blocks an SM (registers, shared memory) */
    static constexpr int STAGE = NG * (SH_BM + BN) * SH_BK;   /* bf16 elements a stage */
    static constexpr size_t SMEM = (size_t)STAGES * STAGE * 2;
};

/* element offset of (row r, 8-element chunk ch) in a [rows][64] tile, chunks XOR-swizzled by r */
__device__ __forceinline__ int sh_sw(int r, int ch) { return r * SH_BK + ((ch ^ (r & 7)) << 3); }

__device__ __forceinline__ void sh_pick(float &bv, int &bi, float ov, int oi) {
    if (ov > bv || (ov == bv && oi < bi)) { bv = ov; bi = oi; }
}

template <int KIND>
__global__ void __launch_bounds__(SH_T, sh_cfg<KIND>::MINB)
k_score_head(const __nv_bfloat16 *A, const __nv_bfloat16 *W, const __nv_bfloat16 *Ab, const __nv_bfloat16 *Wb, int n,
             int V, int K, const int32_t *tgt, const float *cb, const unsigned char *rec, long long rec_bytes,
             const int32_t *idx, int nvt, sh_part *part) {
    using C = sh_cfg<KIND>;
    constexpr int NG = C::NG, BN = C::BN, WN = C::WN, NT = C::NT, ST = C::STAGES;
    PDL_ENTRY();
    extern __shared__ __align__(16) __nv_bfloat16 sm[];
    const int t = threadIdx.x, lane = t & 31, wid = t >> 5, wm = wid >> 1, wn = wid & 1;
    const int r0 = blockIdx.x * SH_BM, S = gridDim.y, sp = blockIdx.y;
    const int vt0 = (int)((long long)sp * nvt / S), vt1 = (int)((long long)(sp + 1) * nvt / S);
    const int KC = K / SH_BK, T = (vt1 - vt0) * KC;
    const __nv_bfloat16 *As[2] = {A, Ab}, *Ws[2] = {W, Wb};

    /* stage it's loads: (vocabulary tile vt0 + it / KC, k chunk it % KC); rows past n and columns past V
     * read the last row / column (their results are never used) */
    auto load = [&](int it) {
        __nv_bfloat16 *st = sm + (it % ST) * C::STAGE;
        const int v0 = (vt0 + it / KC) * BN, k0 = (it % KC) * SH_BK;
#pragma unroll
        for (int g = 0; g < NG; g++) {
            __nv_bfloat16 *sa = st + g * (SH_BM + BN) * SH_BK, *sb = sa + SH_BM * SH_BK;
#pragma unroll
            for (int j = 0; j < SH_BM * 8 / SH_T; j++) {
                int i = t + j * SH_T, r = i >> 3, ch = i & 7, gr = r0 + r < n ? r0 + r : n - 1;
                cp_async16(sa + sh_sw(r, ch), As[g] + (size_t)gr * K + k0 + ch * 8);
            }
#pragma unroll
            for (int j = 0; j < BN * 8 / SH_T; j++) {
                int i = t + j * SH_T, r = i >> 3, ch = i & 7, gc = v0 + r < V ? v0 + r : V - 1;
                cp_async16(sb + sh_sw(r, ch), Ws[g] + (size_t)gc * K + k0 + ch * 8);
            }
        }
    };

    /* the block's rows' base constants */
    __shared__ float s_cb[SH_BM];
    if (t < SH_BM) s_cb[t] = KIND == SH_HEAD ? cb[r0 + t < n ? r0 + t : n - 1] : 0.0f;
    float acc[NG][2][NT][4];
    /* per-row state of the thread's 4 rows (ri = mt * 2 + h: block row wm*32 + mt*16 + lane/4 + 8h) */
    float m[4], mn[4], bv[4];
    int bi[4];
    double s[4], s0[4], s1[4];
#define SH_ROW(ri) (wm * 32 + ((ri) >> 1) * 16 + (lane >> 2) + ((ri) & 1) * 8)
#pragma unroll
    for (int ri = 0; ri < 4; ri++) {
        m[ri] = bv[ri] = -INFINITY;
        mn[ri] = INFINITY;
        bi[ri] = INT_MAX;
        s[ri] = s0[ri] = s1[ri] = 0.0;
    }
#pragma unroll
    for (int g = 0; g < NG; g++)
#pragma unroll
        for (int mt = 0; mt < 2; mt++)
#pragma unroll
            for (int nt = 0; nt < NT; nt++)
#pragma unroll
                for (int e = 0; e < 4; e++) acc[g][mt][nt][e] = 0.0f;

#pragma unroll
    for (int p = 0; p < ST - 1; p++) {
        if (p < T) load(p);
        cp_async_commit();
    }
    for (int it = 0; it < T; it++) {
        cp_async_wait<ST - 2>();
        __syncthreads();
        if (it + ST - 1 < T) load(it + ST - 1);
        cp_async_commit();
        const __nv_bfloat16 *st = sm + (it % ST) * C::STAGE;
#pragma unroll
        for (int ks = 0; ks < SH_BK / 16; ks++) {
#pragma unroll
            for (int g = 0; g < NG; g++) {
                const __nv_bfloat16 *sa = st + g * (SH_BM + BN) * SH_BK, *sb = sa + SH_BM * SH_BK;
                uint32_t af[2][4];
#pragma unroll
                for (int mt = 0; mt < 2; mt++) {
                    int r = wm * 32 + mt * 16 + (lane & 15);
                    ldsm_x4(af[mt], sa + sh_sw(r, ks * 2 + (lane >> 4)));
                }
#pragma unroll
                for (int p = 0; p < NT / 2; p++) {   /* n8 tiles 2p and 2p + 1 */
                    int r = wn * WN + p * 16 + (lane & 7) + ((lane >> 4) << 3);
                    uint32_t q[4];
                    ldsm_x4(q, sb + sh_sw(r, ks * 2 + ((lane >> 3) & 1)));
#pragma unroll
                    for (int mt = 0; mt < 2; mt++) {
                        mma16816_bf16(acc[g][mt][2 * p], af[mt], q[0], q[1]);
                        mma16816_bf16(acc[g][mt][2 * p + 1], af[mt], q[2], q[3]);
                    }
                }
            }
        }
        if (it % KC != KC - 1) continue;
        /* the tile's logits are complete: fold them into the rows' state */
        const int cb0 = (vt0 + it / KC) * BN + wn * WN + 2 * (lane & 3);
#pragma unroll
        for (int ri = 0; ri < 4; ri++) {
            const int mt = ri >> 1, h = ri & 1, lr = SH_ROW(ri);
            float lm = -INFINITY;
#pragma unroll
            for (int nt = 0; nt < NT; nt++)
#pragma unroll
                for (int e = 0; e < 2; e++) {
                    const int col = cb0 + nt * 8 + e;
                    const float v = acc[0][mt][nt][2 * h + e];
                    if (col < V) {
                        lm = fmaxf(lm, v);
                        mn[ri] = fminf(mn[ri], v);
                        if (v > bv[ri]) { bv[ri] = v; bi[ri] = col; }
                    }
                }
            lm = fmaxf(lm, __shfl_xor_sync(0xffffffffu, lm, 1));
            lm = fmaxf(lm, __shfl_xor_sync(0xffffffffu, lm, 2));
            const float mw = fmaxf(m[ri], lm);
            if (mw > m[ri]) {
                s[ri] *= (double)expf(__fsub_rn(m[ri], mw));
                m[ri] = mw;
            }
            if (mw != -INFINITY) {   /* the tile's (at most 16) terms in f32, then into the double sum */
                float ts = 0.0f;
#pragma unroll
                for (int nt = 0; nt < NT; nt++)
#pragma unroll
                    for (int e = 0; e < 2; e++)
                        if (cb0 + nt * 8 + e < V) ts += expf(__fsub_rn(acc[0][mt][nt][2 * h + e], mw));
                s[ri] += (double)ts;
            }
            if (KIND != SH_NONE && r0 + lr < n) {
                float bsc = 0.0f, bmin = 0.0f;
                const float crow = s_cb[lr];
                const unsigned char *rp = NULL;
                if (KIND == SH_REC) {
                    rp = rec + (size_t)idx[r0 + lr] * rec_bytes;
                    bsc = *(const float *)rp;
                    bmin = *(const float *)(rp + 4);
                }
#pragma unroll
                for (int nt = 0; nt < NT; nt++) {
                    const int col = cb0 + nt * 8;
                    if (col >= V) continue;
                    uint32_t qq = KIND == SH_REC ? *(const uint32_t *)(rp + 16 + 2 * (size_t)col) : 0u;   /* col even: 2 codes */
#pragma unroll
                    for (int e = 0; e < 2; e++) {
                        if (col + e >= V) continue;
                        float lb, lq;
                        if (KIND == SH_REC) {
                            lb = __fadd_rn(__fmul_rn(bsc, (float)((qq >> (16 * e)) & 0xffffu)), bmin);
                            lq = acc[0][mt][nt][2 * h + e];
                        } else {
                            lb = __fsub_rn(acc[NG - 1][mt][nt][2 * h + e], crow);
                            lq = __fsub_rn(acc[0][mt][nt][2 * h + e], crow);
                        }
                        if (lb > -16.0f) {
                            double p = exp((double)lb);
                            s0[ri] += p;
                            s1[ri] += p * ((double)lb - (double)lq);
                        }
                    }
                }
            }
        }
#pragma unroll
        for (int g = 0; g < NG; g++)
#pragma unroll
            for (int mt = 0; mt < 2; mt++)
#pragma unroll
                for (int nt = 0; nt < NT; nt++)
#pragma unroll
                    for (int e = 0; e < 4; e++) acc[g][mt][nt][e] = 0.0f;
    }
    cp_async_wait<0>();
    /* the 4 lanes of a row share m: their sums add; one lane writes the row's partial */
#pragma unroll
    for (int ri = 0; ri < 4; ri++) {
#pragma unroll
        for (int o = 1; o <= 2; o <<= 1) {
            s[ri] += __shfl_xor_sync(0xffffffffu, s[ri], o);
            s0[ri] += __shfl_xor_sync(0xffffffffu, s0[ri], o);
            s1[ri] += __shfl_xor_sync(0xffffffffu, s1[ri], o);
            mn[ri] = fminf(mn[ri], __shfl_xor_sync(0xffffffffu, mn[ri], o));
            float ov = __shfl_xor_sync(0xffffffffu, bv[ri], o);
            int oi = __shfl_xor_sync(0xffffffffu, bi[ri], o);
            sh_pick(bv[ri], bi[ri], ov, oi);
        }
        const int gr = r0 + SH_ROW(ri);
        if ((lane & 3) == 0 && gr < n) {
            sh_part q;
            q.m = m[ri]; q.mn = mn[ri]; q.bv = bv[ri];
            q.bi = bi[ri];
            q.s = s[ri]; q.s0 = s0[ri]; q.s1 = s1[ri];
            part[((size_t)gr * S + sp) * 2 + wn] = q;
        }
    }
#undef SH_ROW
}

/* a warp a row: the row's P partials into its be_score_row (as be_ref_score_row finishes) */
__global__ void k_sh_combine(const sh_part *part, int P, int n, int kind, const float *cb, be_score_row *out) {
    PDL_ENTRY();
    const int lane = threadIdx.x & 31, r = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    if (r >= n) return;
    const sh_part *pp = part + (size_t)r * P;
    float M = -INFINITY, mn = INFINITY, bv = -INFINITY, tz = 0.0f;
    int bi = INT_MAX, has = 0;
    for (int i = lane; i < P; i += 32) M = fmaxf(M, pp[i].m);
    for (int o = 16; o; o >>= 1) M = fmaxf(M, __shfl_xor_sync(0xffffffffu, M, o));
    double s = 0, s0 = 0, s1 = 0;
    for (int i = lane; i < P; i += 32) {
        sh_part q = pp[i];
        if (q.m != -INFINITY) s += q.s * (double)expf(__fsub_rn(q.m, M));
        s0 += q.s0;
        s1 += q.s1;
        mn = fminf(mn, q.mn);
        sh_pick(bv, bi, q.bv, q.bi);
        if (q.has) { tz = q.tz; has = 1; }
    }
    for (int o = 16; o; o >>= 1) {
        s += __shfl_xor_sync(0xffffffffu, s, o);
        s0 += __shfl_xor_sync(0xffffffffu, s0, o);
        s1 += __shfl_xor_sync(0xffffffffu, s1, o);
        mn = fminf(mn, __shfl_xor_sync(0xffffffffu, mn, o));
        float ov = __shfl_xor_sync(0xffffffffu, bv, o);
        int oi = __shfl_xor_sync(0xffffffffu, bi, o);
        sh_pick(bv, bi, ov, oi);
        float otz = __shfl_xor_sync(0xffffffffu, tz, o);
        int oh = __shfl_xor_sync(0xffffffffu, has, o);
        if (oh && !has) { tz = otz; has = 1; }
    }
    if (lane) return;
    be_score_row o;
    /* every logit -inf (or NaN): the reference's sum is NaN */
    o.lse = M == -INFINITY ? NAN : __fadd_rn(M, (float)log(s));
    o.lp = __fsub_rn(tz, o.lse);
    o.argmax = bi == INT_MAX ? 0 : bi;
    const float top = __fsub_rn(bv, o.lse);
    float lo = __fsub_rn(mn, o.lse);
    if (lo < __fsub_rn(top, 16.0f)) lo = __fsub_rn(top, 16.0f);
    o.code_min = lo;
    o.code_scale = __fdiv_rn(__fsub_rn(top, lo), 65535.0f);
    o.kld = kind == SH_NONE ? 0.0 : s1 + ((double)o.lse - (double)(kind == SH_HEAD ? cb[r] : 0.0f)) * s0;
    out[r] = o;
}

/* out[r] = bf16(x[idx ? idx[r] : r]), rows of K */
__global__ void k_sh_round(const float *x, const int32_t *idx, __nv_bfloat16 *out, int n, int K) {
    PDL_ENTRY();
    size_t total = (size_t)n * K;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < total; i += (size_t)gridDim.x * blockDim.x) {
        size_t r = i / K, k = i % K;
        size_t sr = idx ? (size_t)idx[r] : r;
        out[i] = __float2bfloat16_rn(x[sr * K + k]);
    }
}

static int sh_takes(const be_ctx *c, const be_mat *w) {
    return w && w->dt == BE_BF16 && w->cols % SH_BK == 0 && w->cols <= c->score_head_k && w->rows >= 1;
}

template <int KIND>
static void sh_launch(be_ctx *c, dim3 grid, const __nv_bfloat16 *A, const __nv_bfloat16 *W, const __nv_bfloat16 *Ab,
                      const __nv_bfloat16 *Wb, int n, int V, int K, const int32_t *tgt, const float *cb,
                      const unsigned char *rec, long long rec_bytes, const int32_t *idx, int nvt, sh_part *part) {
    size_t smem = sh_cfg<KIND>::SMEM;
    if (cu_check(c, cudaFuncSetAttribute(k_score_head<KIND>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem),
                 "score head smem"))
        return;
    cu_launch(c, k_score_head<KIND>, grid, dim3(SH_T), smem, A, W, Ab, Wb, n, V, K, tgt, cb, rec, rec_bytes, idx, nvt, part);
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
    /* about four waves of two blocks an SM, the vocabulary split evenly */
    int S = c->n_sm * 2 * 4 / R;
    S = S < 1 ? 1 : S > nvt ? nvt : S;
    const int P = S * 2;
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
    if (kind == SH_HEAD) {   /* each scored row's base lse, in scored-row order */
        float *l = (float *)malloc(sizeof(float) * (size_t)n);
        if (!l) { cu_check(c, cudaErrorMemoryAllocation, "score head"); return 1; }
        for (int i = 0; i < n; i++) l[i] = base->lse[base->idx[i]];
        d_cb = (const float *)cu_stage(c, l, sizeof(float) * (size_t)n);
        free(l);
    }
    unsigned g = cu_blocks((size_t)n * K, 256);
    g = g > (unsigned)c->n_sm * 16 ? (unsigned)c->n_sm * 16 : g;
    cu_launch(c, k_sh_round, dim3(g), dim3(256), 0, x, (const int32_t *)NULL, A, n, K);
    if (kind == SH_HEAD) cu_launch(c, k_sh_round, dim3(g), dim3(256), 0, base->x, d_idx, Ab, n, K);
    if (CU_LAUNCHED(c, "score head: round")) return 1;
    const __nv_bfloat16 *W = (const __nv_bfloat16 *)w->dev;
    dim3 grid((unsigned)R, (unsigned)S);
    if (kind == SH_NONE) sh_launch<SH_NONE>(c, grid, A, W, NULL, NULL, n, V, K, d_tgt, NULL, NULL, 0, NULL, nvt, part);
    else if (kind == SH_REC)
        sh_launch<SH_REC>(c, grid, A, W, NULL, NULL, n, V, K, d_tgt, NULL, base->rec, (long long)base->rec_bytes, d_idx, nvt, part);
    else
        sh_launch<SH_HEAD>(c, grid, A, W, Ab, (const __nv_bfloat16 *)base->w->dev, n, V, K, d_tgt, d_cb, NULL, 0, NULL, nvt,
                           part);
    be_score_row *d_out = (be_score_row *)c->score_out;
    cu_launch(c, k_sh_combine, dim3(cu_blocks((size_t)n, 8)), dim3(256), 0, (const sh_part *)part, P, n, kind, d_cb, d_out);
    if (!CU_LAUNCHED(c, "score head") &&
        !cu_check(c, cudaMemcpyAsync(out, d_out, sizeof *out * (size_t)n, cudaMemcpyDeviceToHost, c->stream), "score head copy") &&
        !cu_check(c, cudaStreamSynchronize(c->stream), "score head sync"))
        c->arena_off = 0;   /* drained: the staged arrays are consumed */
    return 1;
}
