/*
 * kvquant.cu — the quantized KV ops on the device (be_ops.kvq_write,
 * kvq_attention; definitions in backend.h, scalar references in
 * cpu/ref-kvq.c). Pools are be_kvq: MLX affine codes along head_dim, a scale
 * and a bias per group in f32/f16/bf16 (kvq.cuh reads them).
 *
 * kvq_write: one thread per 8 values of a row (whose codes fill `bits` whole
 * bytes, so no two threads share a byte); a group's max and min by shuffles
 * among its group/8 lanes, then aq_quantize_row's float32 steps in its order
 * (IEEE division, roundf = half away from zero: MLX's GPU rule): the codes,
 * scales and biases equal the CPU reference bit for bit.
 *
 * kvq_attention, two paths:
 * - split (decode, and any query count where flash does not run) on tensor
 *   cores for 4- and 8-bit pools of head_dim 64/128 at every span unless
 *   CINFER_CUDA_DEC_TC=0 (kq_tc_takes; k_kvq_tc, below; its slices: runs
 *   of 64 keys, at most a wave of blocks); otherwise: grid
 *   (slices, kv heads, queries); a block serves every q head of its kv head
 *   (g <= 8), so each packed row is read once per step. A slice is scored
 *   whole before its softmax: a thread per key dequantizes on the fly,
 *   s = sum_groups scale * (q . codes) + bias * sum(q) (q pre-scaled, codes
 *   as floats by exponent bits), the slice's max and sum per head, then
 *   p V with a thread per 8 dimensions and a share of the keys (the V scale
 *   folded into p, the bias term once per group). Slices merge in the last
 *   block to arrive (counter) with exact max rescaling. Kernel unfused:
 *   slices are equal runs of the visible keys, so every score of a slice
 *   meets one precise softmax (the definition, up to the merge's exact
 *   rescaling); kernel tiled: the slices are exactly the definition's tiles
 *   (cut at range starts and multiples of BE_KVQ_TILE positions), each one a
 *   precise softmax, merged as the online recurrence does (in a different
 *   order: equal to f32 rounding). The slice geometry depends on the bucketed
 *   span only, so a captured decode graph stays valid as positions move.
 * - flash (prefill: L >= 16, head_dim 64/128/256 (32: split), no softcap, not
 *   batch-invariant): attention.cu's flash kernel with a tile loader that
 *   dequantizes into f16 shared memory (online softmax over 64-key tiles,
 *   f16 tensor cores, both kernel sets: the same f16 bar as dense flash).
 */
#include <math.h>
#include <stdio.h>
#include <string.h>
#include "backend/cuda/kvq.cuh"
#include "backend/cuda/mma.cuh"
#include "backend/cuda/dec-tc.cuh"

/* ------------------------------------------------------------------ write */

/* dims 8 c8 .. 8 c8 + 7 of a row (v) into pool row `row` (< 0: nothing written): the group's max and min by
 * shuffles among its group/8 lanes (an aligned run of the warp, so every lane of the warp calls this), then
 * aq_quantize_row's float32 steps in its order; the group's first lane writes its scale and bias */
__device__ __forceinline__ void kvq_put8(const float *v, int64_t row, int c8, uint8_t *codes, void *scales, void *biases, int bits,
                                         int group, int sdt, int hd) {
    int gl = group / 8;
    float mx = 0.0f, mn = v[0];
#pragma unroll
    for (int m = 0; m < 8; m++) {   /* GPU rule: the max starts at 0 */
        mx = fmaxf(mx, v[m]);
        mn = fminf(mn, v[m]);
    }
    for (int o = 1; o < gl; o <<= 1) {
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
        mn = fminf(mn, __shfl_xor_sync(0xffffffffu, mn, o));
    }
    if (row < 0) return;
    const float n = (float)((1 << bits) - 1), eps = 1e-7f;
    float s0 = __fdiv_rn(mx - mn, n);
    if (!(s0 > eps)) s0 = eps;
    float scale, edge;
    if (fabsf(mn) > fabsf(mx)) { scale = s0; edge = mn; }
    else { scale = -s0; edge = mx; }
    float q0 = roundf(__fdiv_rn(edge, scale)), bias = 0.0f;
    if (q0 != 0.0f) { scale = __fdiv_rn(edge, q0); bias = edge; }
    uint64_t w = 0;
#pragma unroll
    for (int m = 0; m < 8; m++) {
        float q = roundf(__fdiv_rn(__fsub_rn(v[m], bias), scale));
        q = q < 0.0f ? 0.0f : q > n ? n : q;
        w |= (uint64_t)(uint32_t)q << (m * bits);
    }
    uint8_t *out = codes + (size_t)row * (hd * bits / 8) + (size_t)c8 * bits;
    for (int k = 0; k < bits; k++) out[k] = (uint8_t)(w >> (8 * k));
    if (c8 % gl == 0) {
        size_t gi = (size_t)row * (hd / group) + c8 / gl;
        cu_kv_put(scales, sdt, gi, scale);
        cu_kv_put(biases, sdt, gi, bias);
    }
}

/* a block of 128 threads, hd/8 threads per row (b, i, kv head) */
__global__ void __launch_bounds__(128) k_kvq_write(const float *src, uint8_t *codes, void *scales, void *biases, int bits, int group,
                                                   int sdt, int L, int n_kv, int hd, const int32_t *pt, int n_pt, int sh, const int *pos0,
                                                   const int *len, const int *seq, int n_rows) {
    PDL_ENTRY();
    int per = hd / 8, t = blockIdx.x * blockDim.x + threadIdx.x, r = t / per, c8 = t % per;
    float v[8];
    int live = r < n_rows;
    int h = 0, i = 0, b = 0;
    if (live) {
        h = r % n_kv;
        i = (r / n_kv) % L;
        b = r / n_kv / L;
        live = i < len[b];
    }
    const float *s = src + (size_t)(live ? r : 0) * hd + c8 * 8;
#pragma unroll
    for (int m = 0; m < 8; m++) v[m] = live ? s[m] : 0.0f;
    int64_t row = live ? cu_kv_row(pt + (size_t)seq[b] * n_pt, sh, n_kv, h, pos0[b] + i) : -1;
    kvq_put8(v, row, c8, codes, scales, biases, bits, group, sdt, hd);
}

/* the record: p src, codes, scales, biases, then the geometry at p[4]; i[CU_A_OP..]: bits, group, sdt */
static void l_kvq_write(be_ctx *c, const cu_rec *r) {
    int n_rows = (int)(r->i[CU_A_B] * r->i[CU_A_L] * r->i[CU_A_NKV]), hd = (int)r->i[CU_A_HD];
    if (n_rows <= 0) return;
    unsigned blocks = cu_blocks((size_t)n_rows * (hd / 8), 128);
    cu_launch(c, k_kvq_write, dim3(blocks), dim3(128), 0, (const float *)r->p[0], (uint8_t *)r->p[1], (void *)r->p[2], (void *)r->p[3],
              (int)r->i[CU_A_OP], (int)r->i[CU_A_OP + 1], (int)r->i[CU_A_OP + 2], (int)r->i[CU_A_L], (int)r->i[CU_A_NKV], hd,
              (const int32_t *)r->p[8], (int)r->i[CU_A_NPT], (int)r->i[CU_A_PSH], (const int *)r->p[4], (const int *)r->p[5],
              (const int *)r->p[6], n_rows);
    CU_LAUNCHED(c, "kvq_write");
}

/* what the device kernels take: head_dim 32, 64, 128 or 256, the
 * pool's bits and group as backend.h says; 0 and a message otherwise */
static int kvq_shape_ok(be_ctx *c, const be_attn *a, const be_kvq *p, int attention, const char *what) {
    int hd = a->head_dim, bits = p->bits, g = p->group;
    int ok = (bits == 2 || bits == 3 || bits == 4 || bits == 5 || bits == 6 || bits == 8) && (g == 32 || g == 64 || g == 128) &&
             (hd == 32 || hd == 64 || hd == 128 || hd == 256) && hd % g == 0 && (p->sdt == BE_F32 || p->sdt == BE_F16 || p->sdt == BE_BF16) && a->n_kv_head > 0;
    if (attention) ok = ok && a->n_head % a->n_kv_head == 0;
    if (!ok) {
        if (!c->err) {
            c->err = (int)cudaErrorInvalidValue;
            snprintf(c->msg, sizeof c->msg, "%s: %d-bit codes, group %d, head_dim %d, %s scales: the CUDA kernels take 2, 3, 4, 5, 6 or "
                     "8 bits, group 32, 64 or 128 dividing head_dim (32, 64, 128 or 256), f32/f16/bf16 scales", what, bits, g, hd,
                     be_dtype_name(p->sdt));
        }
        return 0;
    }
    return 1;
}

void cu_op_kvq_write(be_ctx *c, const be_attn *a, const float *src, const be_kvq *pool) {
    if (!kvq_shape_ok(c, a, pool, 0, "kvq_write")) return;
    cu_rec r;
    memset(&r, 0, sizeof r);
    r.fn = l_kvq_write;
    r.p[0] = src;
    r.p[1] = pool->codes;
    r.p[2] = pool->scales;
    r.p[3] = pool->biases;
    cu_rec_attn(c, &r, a, 4);
    r.i[CU_A_OP] = pool->bits;
    r.i[CU_A_OP + 1] = pool->group;
    r.i[CU_A_OP + 2] = pool->sdt;
    cu_submit(c, &r);
}

/* a record's K pools (codes, scales, biases) from p[slot], then V's */
static void kq_rec_pools(cu_rec *r, int slot, const be_kvq *k, const be_kvq *v) {
    const be_kvq *pp[2] = {k, v};
    for (int i = 0; i < 2; i++) {
        r->p[slot + 3 * i] = pp[i]->codes;
        r->p[slot + 3 * i + 1] = pp[i]->scales;
        r->p[slot + 3 * i + 2] = pp[i]->biases;
    }
}

/* ---------------------------------------------------- rope + kvq write, fused */

/* One block per (token, kv head): the rotation pairs of the kv head's g q heads and of its k head, in place (as
 * k_rope_kv: angles from the staged positions and frequencies, computed before waiting on the kernel before),
 * then, after a barrier, the rotated k row and the v row quantized into their pools as k_kvq_write does (hd/8
 * threads a row, k's first: kvq_put8). A decode step's rope and writes in one launch instead of four (two ropes,
 * two writes); CINFER_CUDA_KVQ_ROPE=0 issues the four. */
__global__ void k_rope_kvq(float *q, float *k, const float *v, uint8_t *kc, void *ks, void *kb, uint8_t *vc, void *vs, void *vb, int bits,
                           int group, int sdt, int L, int H, int n_kv, int hd, int rot, const int32_t *pt, int n_pt, int sh,
                           const int *pos, const float *inv_freq, int neox, const int *pos0, const int *len, const int *seq) {
    int h = blockIdx.x % n_kv, t = blockIdx.x / n_kv, b = t / L, i = t % L;
    int half = rot / 2, g = H / n_kv, npair = (g + 1) * half, w = threadIdx.x;
    float *kr = k + ((size_t)t * n_kv + h) * hd;
    float cs = 0.0f, sn = 0.0f;
    PDL_TRIGGER();   /* the attention after this waits for it whole */
    if (w < npair) {
        float ang = (float)pos[t] * inv_freq[w % half];
        cs = cosf(ang);
        sn = sinf(ang);
    }
    PDL_WAIT();
    for (; w < npair; w += blockDim.x) {
        int i0, i1;
        float2 r;
        cu_rope_kv_pair(w, q + ((size_t)t * H + h * g) * hd, kr, hd, half, rot, neox, g, (float)pos[t], inv_freq, cs, sn, &i0, &i1, &r);
    }
    __syncthreads();   /* the rotated k row, written by other threads of the block, is read below */
    int per = hd / 8, tid = threadIdx.x;
    if (tid >= (2 * per + 31) / 32 * 32) return;   /* whole warps take part in kvq_put8's shuffles */
    int isv = tid >= per, c8 = tid % per, live = tid < 2 * per && i < len[b];
    const float *src = (isv ? v + ((size_t)t * n_kv + h) * hd : kr) + c8 * 8;
    float x[8];
#pragma unroll
    for (int m = 0; m < 8; m++) x[m] = live ? src[m] : 0.0f;
    int64_t row = live ? cu_kv_row(pt + (size_t)seq[b] * n_pt, sh, n_kv, h, pos0[b] + i) : -1;
    kvq_put8(x, row, c8, isv ? vc : kc, isv ? vs : ks, isv ? vb : kb, bits, group, sdt, hd);
}

/* the record: p q, k, v, K codes/scales/biases, V codes/scales/biases, the geometry at p[9], positions p[14],
 * frequencies p[15]; i[CU_A_OP..]: bits, group, sdt, rot, neox */
static void l_rope_kvq(be_ctx *c, const cu_rec *r) {
    unsigned blocks = (unsigned)(r->i[CU_A_B] * r->i[CU_A_L] * r->i[CU_A_NKV]);
    if (!blocks) return;
    int g = (int)(r->i[CU_A_H] / r->i[CU_A_NKV]), hd = (int)r->i[CU_A_HD], rot = (int)r->i[CU_A_OP + 3];
    int work = max((g + 1) * (rot / 2), hd / 4), threads = (work + 31) / 32 * 32;
    cu_launch(c, k_rope_kvq, dim3(blocks), dim3(threads > 1024 ? 1024 : threads), 0, (float *)r->p[0], (float *)r->p[1],
              (const float *)r->p[2], (uint8_t *)r->p[3], (void *)r->p[4], (void *)r->p[5], (uint8_t *)r->p[6], (void *)r->p[7],
              (void *)r->p[8], (int)r->i[CU_A_OP], (int)r->i[CU_A_OP + 1], (int)r->i[CU_A_OP + 2], (int)r->i[CU_A_L],
              (int)r->i[CU_A_H], (int)r->i[CU_A_NKV], hd, rot, (const int32_t *)r->p[13], (int)r->i[CU_A_NPT], (int)r->i[CU_A_PSH],
              (const int *)r->p[14], (const float *)r->p[15], (int)r->i[CU_A_OP + 4], (const int *)r->p[9], (const int *)r->p[10],
              (const int *)r->p[11]);
    CU_LAUNCHED(c, "rope + kvq_write");
}

void cu_op_rope_kvq_write(be_ctx *c, const be_attn *a, float *q, float *k, const float *v, const be_kvq *kp, const be_kvq *vp) {
    int T = a->B * a->L;
    if (!c->kvq_rope || kp->bits != vp->bits || kp->group != vp->group || kp->sdt != vp->sdt || a->rot_dims <= 0 ||
        a->rot_dims > a->head_dim || a->rot_dims % 2) {   /* the four ops (and their checks) */
        cu_op_rope(c, q, T, a->n_head, a->head_dim, a->rot_dims, a->pos, a->inv_freq, a->neox);
        cu_op_rope(c, k, T, a->n_kv_head, a->head_dim, a->rot_dims, a->pos, a->inv_freq, a->neox);
        cu_op_kvq_write(c, a, k, kp);
        cu_op_kvq_write(c, a, v, vp);
        return;
    }
    if (!kvq_shape_ok(c, a, kp, 1, "rope_kvq_write")) return;
    cu_rec r;
    memset(&r, 0, sizeof r);
    r.fn = l_rope_kvq;
    r.p[0] = q;
    r.p[1] = k;
    r.p[2] = v;
    kq_rec_pools(&r, 3, kp, vp);
    cu_rec_attn(c, &r, a, 9);
    r.p[14] = cu_stage(c, a->pos, sizeof(int) * (size_t)T);
    r.p[15] = cu_stage(c, a->inv_freq, sizeof(float) * (size_t)(a->rot_dims / 2));
    r.i[CU_A_OP] = kp->bits;
    r.i[CU_A_OP + 1] = kp->group;
    r.i[CU_A_OP + 2] = kp->sdt;
    r.i[CU_A_OP + 3] = a->rot_dims;
    r.i[CU_A_OP + 4] = a->neox;
    cu_submit(c, &r);
}

/* -------------------------------------------------------------- attention */

#define KQ_THREADS 128
#define KQ_CHUNK 512     /* keys of a slice at most (its scores stay in shared memory) */
#define KQ_GMAX 8        /* q heads per kv head at most */

/* the slice [*j0, *j1) of key numbers (cu_span_of) of slice s. Unfused: cu_slice's runs. Tiled: tile s of
 * the definition's tiles (the sinks, then the run, each cut at multiples of BE_KVQ_TILE positions) */
__device__ __forceinline__ void kq_slice(const cu_span &sp, int p, int tiled, int s, int nsplit, int chunk, int *j0, int *j1) {
    if (!tiled) {
        cu_slice(sp.n, s, nsplit, chunk, j0, j1);
        return;
    }
    const int T = BE_KVQ_TILE;
    int s_hi = sp.s_lo + sp.n_s, nt_s = sp.n_s > 0 ? (s_hi - 1) / T - sp.s_lo / T + 1 : 0;
    int lo, hi, base;   /* positions [lo, hi) of the range, key number of position `base` */
    if (s < nt_s) {
        lo = sp.s_lo; hi = s_hi; base = 0;
    } else {
        s -= nt_s;
        lo = sp.r_lo; hi = p + 1; base = sp.n_s;
        if (hi <= lo) { *j0 = *j1 = 0; return; }
    }
    int a = (lo / T + s) * T, b = a + T;
    a = max(a, lo);
    b = min(b, hi);
    if (a >= b) { *j0 = *j1 = 0; return; }
    *j0 = base + (a - lo);
    *j1 = base + (b - lo);
}

/* a split block's query, slice of its visible keys [j0, j1) (empty for a padded query) and partial */
struct kq_blk {
    int s, kvh, bi, g, valid, j0, j1;
    cu_span sp;
    const int32_t *ptr;   /* the sequence's page table row */
    size_t pstride;
    float *pbase;         /* the partial of head 0 of the kv head's group, slice s */
};
__device__ __forceinline__ kq_blk kq_block(int HD, int L, int H, int n_kv, const int32_t *pt, int n_pt, int window, int keep, int tiled,
                                           const int *pos0, const int *len, const int *seq, const int *run0, int nsplit, int chunk,
                                           float *part) {
    kq_blk k;
    k.s = blockIdx.x;
    k.kvh = blockIdx.y;
    k.bi = blockIdx.z;
    int b = k.bi / L, i = k.bi % L, p = pos0[b] + i;
    k.g = H / n_kv;
    k.valid = i < len[b];
    k.sp = cu_span_of(p, window, keep, run0[b]);
    kq_slice(k.sp, p, tiled, k.s, nsplit, chunk, &k.j0, &k.j1);
    if (!k.valid) k.j1 = k.j0;
    k.ptr = pt + (size_t)seq[b] * n_pt;
    k.pstride = (size_t)nsplit * (HD + 2);
    k.pbase = part + ((size_t)k.bi * H + (size_t)k.kvh * k.g) * k.pstride + (size_t)k.s * (HD + 2);
    return k;
}

/* One block per (slice, kv head, query) serving the kv head's g <= GM q heads. Shared: qs [GM][HD] the
 * scaled queries, qsum [GM][HD/32] their sums per 32 dims, buf [KQ_CHUNK*GM] scores then partial outputs. */
template <int HD, int BITS, int GM>
__global__ void __launch_bounds__(KQ_THREADS) k_kvq_split(const float *q, const uint8_t *Kc, const void *Ks, const void *Kb, const uint8_t *Vc,
                                                          const void *Vs, const void *Vb, int bits, int group, int sdt, int L, int H,
                                                          int n_kv, const int32_t *pt, int n_pt, int sh, int window, int keep, float scale,
                                                          float cap, int tiled, const int *pos0, const int *len, const int *seq,
                                                          const int *run0, int nsplit, int chunk, float *part, int *cnt, float *out) {
    constexpr int NB = (KQ_CHUNK * GM > 4 * GM * HD ? KQ_CHUNK * GM : 4 * GM * HD);
    constexpr int C8 = HD / 8, NJ = KQ_THREADS / C8;   /* PV: threads per key row, keys at a time */
    constexpr int QROW = HD + HD / 8;   /* QP(d) = d + 4 (d / 32): the lanes of a key read 32-dim blocks in different banks */
    __shared__ __align__(16) float qs[GM * QROW];
    __shared__ float qsum[GM][HD / 32];
    __shared__ __align__(16) float buf[NB];
    __shared__ uint32_t rows[KQ_CHUNK];
    __shared__ float mh[GM], lh[GM];
    PDL_ENTRY();
    const int nb = BITS ? BITS : bits, RB = HD * nb / 8, NG = HD / group;
    const kq_blk kb = kq_block(HD, L, H, n_kv, pt, n_pt, window, keep, tiled, pos0, len, seq, run0, nsplit, chunk, part);
    const int kvh = kb.kvh, bi = kb.bi, g = kb.g, valid = kb.valid, j0 = kb.j0, j1 = kb.j1, n = j1 - j0;
    const cu_span sp = kb.sp;
    const int32_t *ptr = kb.ptr;
    const size_t pstride = kb.pstride;
    float *pbase = kb.pbase;   /* head h: + h * pstride */
    int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    if (n > 0) {
        const float *qg = q + ((size_t)bi * H + (size_t)kvh * g) * HD;
        for (int e = tid; e < GM * HD; e += KQ_THREADS) qs[(e / HD) * QROW + e % HD + (e % HD) / 32 * 4] = e < g * HD ? qg[e] * scale : 0.0f;
        __syncthreads();
        for (int e = tid; e < GM * (HD / 32); e += KQ_THREADS) {
            const float *x = qs + (e / (HD / 32)) * QROW + (e % (HD / 32)) * 36;
            float t = 0.0f;
            for (int d = 0; d < 32; d++) t += x[d];
            qsum[e / (HD / 32)][e % (HD / 32)] = t;
        }
        __syncthreads();
        /* scores: TS lanes per key, 32 codes each (one group's), the row dequantized on the fly for all heads;
         * the lanes' sums meet by shuffles */
        constexpr int TS = HD / 32, KPW = 32 / TS, TSTEP = (KQ_THREADS / 32) * KPW;
        int tl = lane % TS, kw = lane / TS, gi = tl * 32 / group;
        /* the key row, codes, scale and bias of the next iteration are loaded while this one computes */
        int64_t row_n;
        uint64_t w4_n[4];
        float sc_n, bs_n;
        auto fetch = [&](int t) {   /* key t of the slice (row -1 past its end: row 0 read, never used) */
            row_n = t < n ? cu_kv_row(ptr, sh, n_kv, kvh, cu_span_key(sp, j0 + t)) : -1;
            size_t ro = row_n < 0 ? 0 : (size_t)row_n, si = ro * NG + gi;
            kvq_codes32<BITS>(Kc + ro * RB, tl, nb, w4_n);
            sc_n = cu_mat_get(Ks, sdt, si);
            bs_n = cu_mat_get(Kb, sdt, si);
        };
        fetch(warp * KPW + kw);
        for (int t0 = warp * KPW; t0 < n; t0 += TSTEP) {
            int t = t0 + kw, have = t < n;
            int64_t row = row_n;
            size_t ro = row < 0 ? 0 : (size_t)row;
            uint64_t w4[4] = {w4_n[0], w4_n[1], w4_n[2], w4_n[3]};
            float sc = sc_n, bs = bs_n;
            if (t0 + TSTEP < n) fetch(t + TSTEP);
            if (have && tl == 0) rows[t] = (uint32_t)ro;
            const float *qb = qs + tl * 36;   /* this lane's 32 dims of head 0 (padded rows, see QP) */
            float acc[GM];
#pragma unroll
            for (int h = 0; h < GM; h++) acc[h] = 0.0f;
#pragma unroll
            for (int u = 0; u < 4; u++) {   /* 8 codes at a time */
                float f[8];
#pragma unroll
                for (int m = 0; m < 8; m++) f[m] = kvq_code<BITS>(w4[u], m, nb);
#pragma unroll
                for (int h = 0; h < GM; h++) {
                    const float4 *qq = (const float4 *)(qb + h * QROW + u * 8);
                    float4 a = qq[0], bq = qq[1];
                    acc[h] += a.x * f[0] + a.y * f[1] + a.z * f[2] + a.w * f[3] + bq.x * f[4] + bq.y * f[5] + bq.z * f[6] + bq.w * f[7];
                }
            }
#pragma unroll
            for (int h = 0; h < GM; h++) {
                float v = sc * acc[h] + bs * qsum[h][tl];
#pragma unroll
                for (int o = 1; o < TS; o <<= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
                if (have && tl == 0) buf[h * KQ_CHUNK + t] = row < 0 ? -INFINITY : cap > 0 ? be_softcap(v, cap) : v;
            }
        }
        __syncthreads();
        /* the slice's precise softmax per head (a warp per head): max, exp, sum */
        for (int h = warp; h < g; h += KQ_THREADS / 32) {
            float *sc = buf + h * KQ_CHUNK, m = -INFINITY, l = 0.0f;
            for (int t = lane; t < n; t += 32) m = fmaxf(m, sc[t]);
#pragma unroll
            for (int o = 16; o; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
            for (int t = lane; t < n; t += 32) {
                float e = sc[t] == -INFINITY ? 0.0f : expf(sc[t] - m);
                sc[t] = e;
                l += e;
            }
#pragma unroll
            for (int o = 16; o; o >>= 1) l += __shfl_xor_sync(0xffffffffu, l, o);
            if (lane == 0) { mh[h] = m; lh[h] = l; }
        }
        __syncthreads();
        /* p V: thread (keys jp, jp + NJ, ..; dims 8*c8 .. 8*c8+7) */
        int c8 = tid % C8, jp = tid / C8, gv = c8 * 8 / group;
        float acc[GM][8], accb[GM];
#pragma unroll
        for (int h = 0; h < GM; h++) {
            accb[h] = 0.0f;
#pragma unroll
            for (int m = 0; m < 8; m++) acc[h][m] = 0.0f;
        }
#pragma unroll 4
        for (int t = jp; t < n; t += NJ) {
            uint32_t row = rows[t];
            uint64_t w = kvq_codes8<BITS>(Vc + (size_t)row * RB, c8, nb);
            size_t si = (size_t)row * NG + gv;
            float sv = cu_mat_get(Vs, sdt, si), bv = cu_mat_get(Vb, sdt, si), f[8];
#pragma unroll
            for (int m = 0; m < 8; m++) f[m] = kvq_code<BITS>(w, m, nb);
#pragma unroll
            for (int h = 0; h < GM; h++) {
                float e = buf[h * KQ_CHUNK + t], ps = e * sv;
                accb[h] += e * bv;
#pragma unroll
                for (int m = 0; m < 8; m++) acc[h][m] += ps * f[m];
            }
        }
        __syncthreads();   /* the scores are spent: buf takes the partial outputs */
        /* sum over the NJ key lanes: pairs within a warp by shuffles, then the warps through shared memory */
#pragma unroll
        for (int h = 0; h < GM; h++)
#pragma unroll
            for (int m = 0; m < 8; m++) {
                float v = acc[h][m] + accb[h];
                for (int o = C8; o < 32; o <<= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
                acc[h][m] = v;
            }
        constexpr int WJ = C8 >= 32 ? 1 : 32 / C8;   /* key lanes per warp */
        if (lane < C8 || C8 >= 32) {
            int wj = jp / WJ;   /* this warp's slot */
#pragma unroll
            for (int h = 0; h < GM; h++)
#pragma unroll
                for (int m = 0; m < 8; m++) buf[(wj * GM + h) * HD + c8 * 8 + m] = acc[h][m];
        }
        __syncthreads();
        constexpr int NW = KQ_THREADS / 32 < NJ ? KQ_THREADS / 32 : NJ;   /* warps holding partials */
        for (int e = tid; e < g * HD; e += KQ_THREADS) {
            int h = e / HD, d = e % HD;
            float o = 0.0f;
            for (int w2 = 0; w2 < NW; w2++) o += buf[(w2 * GM + h) * HD + d];
            pbase[h * pstride + 2 + d] = o;
        }
        if (tid < g) {
            pbase[tid * pstride] = mh[tid];
            pbase[tid * pstride + 1] = lh[tid];
        }
    } else if (tid < g) {
        pbase[tid * pstride] = -INFINITY;
        pbase[tid * pstride + 1] = 0.0f;
    }
    dec_merge<HD, GM, NB, KQ_THREADS>(part, nsplit, g, bi, H, kvh, n_kv, valid, buf, mh, lh, cnt, out);
}

/* The split path on tensor cores (the default for 4- and 8-bit pools, head_dim 64 or 128, a group's scales
 * and biases of a row 4, 8 or 16 bytes): the same slices, partials and merge as k_kvq_split. Each warp takes
 * every fourth run of KT_TK keys of its slice through its own cp.async pipeline (codes 16 bytes a chunk,
 * XOR-swizzled so a quad's rows fall in different banks; scales and biases; keys past the slice
 * zero-filled) and an online softmax; the four warps merge in shared memory. Codes become bf16 operands
 * exactly (4 bits: 128 + c under bf16's exponent minus 128; 8 bits: through f32); the query (times the
 * scale) is split into bf16 hi + mid + lo (24+ bits): per group s * (q . c) + b * sum(q) as k_kvq_split.
 * P V: A = p times the V scale of the group (split the same way), the bias term p * b summed apart. The
 * slice's softmax is the online recurrence over runs of 16 keys: the definition to f32 rounding, as the
 * slices' merge.
 * - 4-bit K: a k-step's k = 2c, 2c+1, 2c+8, 2c+9 hold dims 2c, 2c+8, 2c+1, 2c+9 (the query's A operand is
 *   ordered so), so a lane's B operands are the two nibbles of byte c of the step's two words: one byte
 *   permute (kq_bf2_nib); 8-bit K: they hold dims 4c .. 4c+3, word c of the step (kq_bf2_f32). V: column
 *   j of n-tile wi of group gi holds dim gi*G + j*G/8 + wi, so lane (r, c) reads the G/8 consecutive codes
 *   of each key and group once (4-bit: two tiles from each byte permute; 8-bit: a permute a code);
 *   dec_warps_merge gets that dim map (kq_vdim).
 * - PACK (g <= 4): rows 0-3 of the A operand hold hi, rows 8-11 mid and rows 4-7 lo of heads 0-3, so one
 *   mma per k-step and n-tile does what two do otherwise: lanes r and r + 4 (lane ^ 16) hold the two parts
 *   of head r & 3's sums, added by a shuffle (scores per run; P V once, before the merge). Otherwise hi and
 *   mid in rows 0-7 and 8-15, lo in a second product. CINFER_CUDA_KQ_PACK=0 keeps two products. */
#define KT_TK 16
#define KT_BLOCKS_SM 3   /* resident blocks per SM (4 for 4-bit pools, registers capped at 128: 0.95-0.97x on an H100) */
template <int HD, int BITS> struct kq_tc_geo {
    static constexpr int RB = HD * BITS / 8;                                  /* code bytes a row */
    static constexpr int ST = BITS == 8 ? 3 : 4;                              /* stages per warp */
    static constexpr int STAGE = 2 * KT_TK * RB + KT_TK * 64 + 16;            /* K, V codes; per key Ks|Kb|Vs|Vb 16 B each; key mask */
    static constexpr size_t SMEM = (size_t)ST * 4 * STAGE;
};
static_assert(kq_tc_geo<64, 4>::SMEM >= 4 * 8 * 128 * 4, "the merge's scratch fits");
/* bytes of a row's scales (and of its biases); k_kvq_tc takes rows of 4, 8 or 16 */
__host__ __device__ constexpr int kq_sbn(int hd, int group, int sdt) { return hd / group * (sdt == BE_F32 ? 4 : 2); }
__host__ __device__ constexpr bool kq_sbn_ok(int sbn) { return sbn == 4 || sbn == 8 || sbn == 16; }

/* 8-bit codes: byte i of x and byte j of y as an exact bf16 pair (x's in the low half): each put under 2^23's
 * exponent by a byte permute (selector 0x4550 | byte), less 2^23 */
__device__ __forceinline__ uint32_t kq_bf2_f32(uint32_t x, int i, uint32_t y, int j) {
    float a = __uint_as_float(__byte_perm(x, 0x4Bu, 0x4550u | (uint32_t)i)) - 8388608.0f;
    float b = __uint_as_float(__byte_perm(y, 0x4Bu, 0x4550u | (uint32_t)j)) - 8388608.0f;
    __nv_bfloat162 v = __floats2bfloat162_rn(a, b);
    return *(uint32_t *)&v;
}
/* 4-bit codes: byte sel & 7 of x and byte sel >> 8 & 7 of (x, y) (the permute's selector) as two exact bf16
 * pairs: lo = their low nibbles, hi = their high nibbles (the first byte's in the low halves) */
__device__ __forceinline__ uint32_t kq_and_or(uint32_t a, uint32_t orv) {   /* (a & 0x000F000F) | orv in one LOP3 */
    uint32_t d;
    asm("lop3.b32 %0, %1, 0x000F000F, %2, 0xEA;" : "=r"(d) : "r"(a), "r"(orv));
    return d;
}
__device__ __forceinline__ void kq_bf2_nib(uint32_t x, uint32_t y, uint32_t sel, uint32_t &lo, uint32_t &hi) {
    /* (the and and the or as one LOP3 each: ptxas, given both constants, spent two) */
    uint32_t v = __byte_perm(x, y, sel), a = kq_and_or(v, 0x43004300u), b = kq_and_or(v >> 4, 0x43004300u);
    const __nv_bfloat162 k128 = __floats2bfloat162_rn(128.0f, 128.0f);
    __nv_bfloat162 ra = __hsub2(*(__nv_bfloat162 *)&a, k128), rb = __hsub2(*(__nv_bfloat162 *)&b, k128);
    lo = *(uint32_t *)&ra;
    hi = *(uint32_t *)&rb;
}
/* the NG scales (or biases) of a key's row in a stage: one shared-memory load of the row's 4, 8 or 16 bytes, widened */
template <int SDT, int NG> __device__ __forceinline__ void kq_sb(const unsigned char *p, float *v) {
    constexpr int W = SDT == BE_F32 ? NG : (NG + 1) / 2;   /* 32-bit words: 1, 2 or 4 */
    uint32_t w[W];
    if (W == 1) w[0] = *(const uint32_t *)p;
    else if (W == 2) *(uint2 *)w = *(const uint2 *)p;
    else *(uint4 *)w = *(const uint4 *)p;
#pragma unroll
    for (int i = 0; i < NG; i++) {
        if (SDT == BE_F32) v[i] = __uint_as_float(w[i]);
        else if (SDT == BE_BF16) v[i] = __uint_as_float(i & 1 ? w[i / 2] & 0xFFFF0000u : w[i / 2] << 16);
        else v[i] = __half2float(__ushort_as_half((unsigned short)(w[i / 2] >> (i & 1) * 16)));
    }
}
/* the dim of column j of P V's n-tile n (permuted, see above) */
template <int GROUP> __device__ __forceinline__ int kq_vdim(int n, int j) {
    constexpr int WG = GROUP / 8;
    return n / WG * GROUP + j * WG + n % WG;
}
template <int HD, int BITS, int GROUP, int SDT, bool PACK>
__global__ void __launch_bounds__(KQ_THREADS, KT_BLOCKS_SM) k_kvq_tc(const float *q, const uint8_t *Kc, const void *Ks, const void *Kb, const uint8_t *Vc,
                                                         const void *Vs, const void *Vb, int L, int H, int n_kv, const int32_t *pt,
                                                         int n_pt, int sh, int window, int keep, float scale, float cap, int tiled,
                                                         const int *pos0, const int *len, const int *seq, const int *run0, int nsplit,
                                                         int chunk, float *part, int *cnt, float *out, float tau) {
    typedef kq_tc_geo<HD, BITS> G;
    constexpr int RB = G::RB, ST = G::ST, KS = HD / 16, NT = HD / 8, NG = HD / GROUP, CPR = RB / 16, WG = GROUP / 8;
    constexpr int RPL = CPR >= 8 ? 1 : 8 / CPR, PER = KT_TK * CPR / 32, NB = 4 * 8 * HD;
    constexpr int SBN = kq_sbn(HD, GROUP, SDT);
    constexpr int VB = GROUP * BITS / 64, VW = VB < 4 ? 1 : VB / 4;   /* V: bytes (words) of a key and group a lane reads */
    static_assert(KQ_THREADS == 128 && KQ_GMAX == 8 && GROUP % 16 == 0 && PER >= 1, "four warps; q heads in rows 0-7");
    static_assert(kq_sbn_ok(SBN), "a row's scales: 4, 8 or 16 bytes");
    extern __shared__ __align__(16) unsigned char dsm[];
    __shared__ float wm[4][KQ_GMAX], wl[4][KQ_GMAX], mh[KQ_GMAX], lh[KQ_GMAX];
    PDL_ENTRY();
    const kq_blk kb = kq_block(HD, L, H, n_kv, pt, n_pt, window, keep, tiled, pos0, len, seq, run0, nsplit, chunk, part);
    const int kvh = kb.kvh, bi = kb.bi, g = kb.g, valid = kb.valid, j0 = kb.j0, j1 = kb.j1, n = j1 - j0;
    const cu_span sp = kb.sp;
    const int32_t *ptr = kb.ptr;
    const size_t pstride = kb.pstride;
    float *pbase = kb.pbase;   /* head h: + h * pstride */
    int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, r = lane >> 2, c = lane & 3;
    const int hr = PACK ? (r & 3) : r, lo_rows = PACK && r >= 4;   /* the lane's head; PACK: its lo rows */
    float o[NT][4], ob[NG], m_r = -INFINITY, l_r = 0.0f;
#pragma unroll
    for (int w = 0; w < NT; w++) o[w][0] = o[w][1] = o[w][2] = o[w][3] = 0.0f;
#pragma unroll
    for (int gi = 0; gi < NG; gi++) ob[gi] = 0.0f;
    if (n > 0) {
        uint32_t aq[KS][4], aql[PACK ? 1 : KS][4];
        float qsum[NG];
        {   /* head hr's A operands and its sums per group: k = 2c + {0, 1, 8, 9} of step ks holds dim 16 ks +
             * 4c + {0, 1, 2, 3} (8-bit) or 2c + {0, 8, 1, 9} (4-bit) */
            const float *qh = q + ((size_t)bi * H + (size_t)kvh * g + (hr < g ? hr : 0)) * HD;
#pragma unroll
            for (int gi = 0; gi < NG; gi++) qsum[gi] = 0.0f;
#pragma unroll
            for (int ks = 0; ks < KS; ks++) {
                float qv[4];
#pragma unroll
                for (int t = 0; t < 4; t++) {
                    int d = 16 * ks + (BITS == 4 ? 2 * c + (t & 1) * 8 + (t >> 1) : 4 * c + t);
                    qv[t] = hr < g ? qh[d] * scale : 0.0f;
                    qsum[16 * ks / GROUP] += qv[t];
                }
                if (PACK) mma_a_pack<__nv_bfloat16>(qv, lo_rows, aq[ks]);
                else mma_a_split<__nv_bfloat16>(qv, aq[ks], aql[PACK ? 0 : ks]);
            }
#pragma unroll
            for (int gi = 0; gi < NG; gi++) {
                qsum[gi] += __shfl_xor_sync(0xffffffffu, qsum[gi], 1);
                qsum[gi] += __shfl_xor_sync(0xffffffffu, qsum[gi], 2);
            }
        }
        const uint32_t ksel = (uint32_t)c | (uint32_t)(4 + c) << 8;   /* byte c of a k-step's two words */
        int nst = (n + KT_TK - 1) / KT_TK, mine = nst > warp ? (nst - warp + 3) / 4 : 0;
        unsigned char *wst = dsm + (size_t)warp * ST * G::STAGE;
        auto cb = [&](int kk, int byte) {   /* byte `byte` of row kk's codes in a stage (the chunks swizzled) */
            return kk * RB + (((byte >> 4) ^ ((kk / RPL) & (CPR - 1))) << 4) + (byte & 15);
        };
        auto load = [&](int t) {   /* run t of this warp into stage t % ST */
            int jb = j0 + (warp + 4 * t) * KT_TK;
            int64_t row = lane < KT_TK && jb + lane < j1 ? cu_kv_row(ptr, sh, n_kv, kvh, cu_span_key(sp, jb + lane)) : -1;
            unsigned char *st = wst + (size_t)(t % ST) * G::STAGE;
#pragma unroll
            for (int u = 0; u < PER; u++) {
                int e = lane + 32 * u, kk = e / CPR, ch = e % CPR;
                int64_t rw = __shfl_sync(0xffffffffu, row, kk);
                int at = cb(kk, ch * 16);
                size_t src = (size_t)(rw < 0 ? 0 : rw) * RB + ch * 16;
                cp_async16_zf(st + at, Kc + src, rw >= 0);
                cp_async16_zf(st + KT_TK * RB + at, Vc + src, rw >= 0);
            }
            unsigned okm = __ballot_sync(0xffffffffu, row >= 0);
            if (lane < KT_TK) {
                size_t so = (size_t)(row < 0 ? 0 : row) * SBN;
                unsigned char *d = st + 2 * KT_TK * RB + lane * 64;
                const unsigned char *src[4] = {(const unsigned char *)Ks + so, (const unsigned char *)Kb + so, (const unsigned char *)Vs + so,
                                               (const unsigned char *)Vb + so};
#pragma unroll
                for (int k = 0; k < 4; k++) cp_async_ca<SBN>(d + 16 * k, src[k], row >= 0);
            }
            if (lane == 0) *(unsigned *)(st + 2 * KT_TK * RB + KT_TK * 64) = okm;
        };
        dec_pipe_start<ST>(mine, load);
        for (int t = 0; t < mine; t++) {
            dec_pipe_next<ST>(t, mine, load);
            const unsigned char *kc = wst + (size_t)(t % ST) * G::STAGE, *vc = kc + KT_TK * RB, *sb = vc + KT_TK * RB;
            unsigned okm = *(const unsigned *)(sb + KT_TK * 64);
            int jb = j0 + (warp + 4 * t) * KT_TK;
            float x[4];   /* head hr's scores of keys 2c, 2c+1, 8+2c, 9+2c of the run */
            {
                float sacc[NG][2][4];
#pragma unroll
                for (int gi = 0; gi < NG; gi++)
#pragma unroll
                    for (int nt = 0; nt < 2; nt++) sacc[gi][nt][0] = sacc[gi][nt][1] = sacc[gi][nt][2] = sacc[gi][nt][3] = 0.0f;
#pragma unroll
                for (int nt = 0; nt < 2; nt++) {   /* the B operands of key nt * 8 + r */
                    int kk = nt * 8 + r;
                    uint32_t wd[BITS == 4 ? RB / 4 : KS];   /* 4-bit: the row; 8-bit: word c of each k-step */
                    if (BITS == 4) {
#pragma unroll
                        for (int u = 0; u < CPR; u++) *(uint4 *)&wd[4 * u] = *(const uint4 *)(kc + cb(kk, 16 * u));
                    } else {
#pragma unroll
                        for (int ks = 0; ks < KS; ks++) wd[ks] = *(const uint32_t *)(kc + cb(kk, 16 * ks + 4 * c));
                    }
#pragma unroll
                    for (int ks = 0; ks < KS; ks++) {
                        uint32_t b0, b1;
                        if (BITS == 4) kq_bf2_nib(wd[2 * ks], wd[2 * ks + 1], ksel, b0, b1);
                        else {   /* bytes 16 ks + 4c .. 4c + 3 */
                            b0 = kq_bf2_f32(wd[ks], 0, wd[ks], 1);
                            b1 = kq_bf2_f32(wd[ks], 2, wd[ks], 3);
                        }
                        mma16816_bf16(sacc[16 * ks / GROUP][nt], aq[ks], b0, b1);
                        if (!PACK) mma16816_bf16(sacc[16 * ks / GROUP][nt], aql[PACK ? 0 : ks], b0, b1);
                    }
                }
#pragma unroll
                for (int t2 = 0; t2 < 4; t2++) {
                    int nt = t2 >> 1, e = t2 & 1, kk = nt * 8 + 2 * c + e;
                    float v = 0.0f, ks[NG], kb[NG];
                    kq_sb<SDT, NG>(sb + kk * 64, ks);
                    kq_sb<SDT, NG>(sb + kk * 64 + 16, kb);
#pragma unroll
                    for (int gi = 0; gi < NG; gi++) v += ks[gi] * (sacc[gi][nt][e] + sacc[gi][nt][e + 2]);
                    if (PACK) v += __shfl_xor_sync(0xffffffffu, v, 16);   /* + the other half's parts */
#pragma unroll
                    for (int gi = 0; gi < NG; gi++) v += kb[gi] * qsum[gi];
                    if (cap > 0) v = be_softcap(v, cap);
                    x[t2] = jb + kk < j1 && (okm >> kk & 1u) ? v : -INFINITY;
                }
            }
            float pv[4], al = dec_online<NT>(x, m_r, l_r, o, pv, tau), vs[4][NG], vb[4][NG];
#pragma unroll
            for (int t2 = 0; t2 < 4; t2++) {   /* the V scales and biases of the lane's keys */
                int kk = (t2 >> 1) * 8 + 2 * c + (t2 & 1);
                kq_sb<SDT, NG>(sb + kk * 64 + 32, vs[t2]);
                kq_sb<SDT, NG>(sb + kk * 64 + 48, vb[t2]);
            }
#pragma unroll
            for (int gi = 0; gi < NG; gi++) {   /* P V over the group's n-tiles gi * WG .. */
                uint32_t ap[4], apl[4];
                {   /* A = p * (V scale), the bias term apart */
                    float ps[4], bsum = 0.0f;
#pragma unroll
                    for (int t2 = 0; t2 < 4; t2++) {
                        ps[t2] = pv[t2] * vs[t2][gi];
                        bsum += pv[t2] * vb[t2][gi];
                    }
                    ob[gi] = ob[gi] * al + bsum;
                    if (PACK) mma_a_pack<__nv_bfloat16>(ps, lo_rows, ap);
                    else mma_a_split<__nv_bfloat16>(ps, ap, apl);
                }
                uint32_t vw[4][VW];   /* keys 2c, 2c+1, 2c+8, 2c+9: the codes of dims gi*G + r*G/8 .. + G/8 - 1 */
#pragma unroll
                for (int k = 0; k < 4; k++) {
                    const unsigned char *p = vc + cb(2 * c + (k & 1) + (k >> 1) * 8, (gi * GROUP + r * WG) * BITS / 8);
                    if (VB == 2) vw[k][0] = *(const uint16_t *)p;
                    else if (VB == 4) vw[k][0] = *(const uint32_t *)p;
                    else if (VB == 8) *(uint2 *)&vw[k][0] = *(const uint2 *)p;
                    else *(uint4 *)&vw[k][0] = *(const uint4 *)p;
                }
                if (BITS == 4) {   /* tiles 2j, 2j+1 of the group: byte j of each key's VB bytes */
#pragma unroll
                    for (int j = 0; j < WG / 2; j++) {
                        const uint32_t sel = 0x0400u | (uint32_t)(j & 3) * 0x0101u;
                        uint32_t b0l, b0h, b1l, b1h;
                        kq_bf2_nib(vw[0][j >> 2], vw[1][j >> 2], sel, b0l, b0h);
                        kq_bf2_nib(vw[2][j >> 2], vw[3][j >> 2], sel, b1l, b1h);
                        float *o0 = o[gi * WG + 2 * j], *o1 = o[gi * WG + 2 * j + 1];
                        mma16816_bf16(o0, ap, b0l, b1l);
                        mma16816_bf16(o1, ap, b0h, b1h);
                        if (!PACK) {
                            mma16816_bf16(o0, apl, b0l, b1l);
                            mma16816_bf16(o1, apl, b0h, b1h);
                        }
                    }
                } else {   /* tile wt of the group: byte wt of each key's VB bytes */
#pragma unroll
                    for (int wt = 0; wt < WG; wt++) {
                        const int wq = wt >> 2, i = wt & 3;
                        uint32_t b0 = kq_bf2_f32(vw[0][wq], i, vw[1][wq], i), b1 = kq_bf2_f32(vw[2][wq], i, vw[3][wq], i);
                        mma16816_bf16(o[gi * WG + wt], ap, b0, b1);
                        if (!PACK) mma16816_bf16(o[gi * WG + wt], apl, b0, b1);
                    }
                }
            }
            __syncwarp();   /* every lane is done with this stage before it is loaded again */
        }
        cp_async_wait<0>();
        l_r += __shfl_xor_sync(0xffffffffu, l_r, 1);
        l_r += __shfl_xor_sync(0xffffffffu, l_r, 2);
#pragma unroll
        for (int gi = 0; gi < NG; gi++) {
            ob[gi] += __shfl_xor_sync(0xffffffffu, ob[gi], 1);
            ob[gi] += __shfl_xor_sync(0xffffffffu, ob[gi], 2);
        }
        if (PACK) {   /* the two halves' P V sums folded into lanes r < 4 (rows r and r + 8, then the lo rows) */
#pragma unroll
            for (int w = 0; w < NT; w++)
#pragma unroll
                for (int e = 0; e < 2; e++) {
                    float s = o[w][e] + o[w][e + 2];
                    o[w][e] = s + __shfl_xor_sync(0xffffffffu, s, 16);
                    o[w][e + 2] = 0.0f;
                }
        }
    }
    dec_warps_merge<HD>(n > 0, g, m_r, l_r, [&](int w, int e) { return o[w][e] + o[w][e + 2] + ob[w / WG]; },
                        [](int w, int j) { return kq_vdim<GROUP>(w, j); }, (float *)(void *)dsm, wm, wl, pbase, pbase + 1, pstride,
                        pbase + 2, pstride);
    if (n <= 0 && tid < g) {
        pbase[tid * pstride] = -INFINITY;
        pbase[tid * pstride + 1] = 0.0f;
    }
    __syncthreads();   /* the partials are read: the merge's scratch goes there */
    dec_merge<HD, KQ_GMAX, NB, KQ_THREADS>(part, nsplit, g, bi, H, kvh, n_kv, valid, (float *)(void *)dsm, mh, lh, cnt, out);
}

enum { KQ_SPLIT = 0, KQ_FLASH = 1, KQ_TC = 2 };

/* 1 when k_kvq_tc serves this format (else k_kvq_split): at every span unless CINFER_CUDA_DEC_TC=0 (the
 * 16-bit pools take tensor cores from DEC_TC_SPAN keys; quantized ones gain at every span measured). H100,
 * llama-3.1-8b decode, tensor cores against the split kernel: KV4 1.029x at 1k keys, 1.052x at 2k, 1.068x at 4k,
 * 32k 7.55 ms a step against 9.91; 128k at 1.50x the bf16 pool's rate. */
static int kq_tc_takes(const be_ctx *c, int bits, int hd, int group, int sdt) {
    return c->dec_tc != 0 && (bits == 4 || bits == 8) && (hd == 64 || hd == 128) && kq_sbn_ok(kq_sbn(hd, group, sdt));
}

/* a record's geometry as l_kvq_attention decodes it, for the k_kvq_tc instance it picks */
struct kq_geo {
    int L, H, n_kv, n_pt, sh, window, keep, tiled, nsplit, chunk;
};
/* one k_kvq_tc instance; formats whose scales kq_tc_takes refuses instantiate nothing */
template <int HD, int BITS, int GROUP, int SDT, bool PACK>
static void kq_tc_go(be_ctx *c, const cu_rec *r, const kq_geo &k, dim3 grid) {
    if constexpr (kq_sbn_ok(kq_sbn(HD, GROUP, SDT))) {
        size_t sm = kq_tc_geo<HD, BITS>::SMEM;
        auto *fn = k_kvq_tc<HD, BITS, GROUP, SDT, PACK>;
        if (!cu_check(c, cudaFuncSetAttribute(fn, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)sm), "kvq attention: shared memory attribute"))
            cu_launch(c, fn, grid, dim3(KQ_THREADS), sm, (const float *)r->p[0], (const uint8_t *)r->p[2],
                      r->p[3], r->p[4], (const uint8_t *)r->p[5], r->p[6], r->p[7], k.L, k.H, k.n_kv, (const int32_t *)r->p[12], k.n_pt, k.sh,
                      k.window, k.keep, r->f[0], r->f[2], k.tiled, (const int *)r->p[8], (const int *)r->p[9], (const int *)r->p[10],
                      (const int *)r->p[11], k.nsplit, k.chunk, c->part, c->cnt, (float *)r->p[1], c->dec_lazy ? 8.0f : 0.0f);
    }
}
template <int HD, int BITS, int GROUP>
static void kq_tc_sdt(be_ctx *c, const cu_rec *r, const kq_geo &k, dim3 grid, int sdt, int pack) {
    if (sdt == BE_F32) pack ? kq_tc_go<HD, BITS, GROUP, BE_F32, true>(c, r, k, grid) : kq_tc_go<HD, BITS, GROUP, BE_F32, false>(c, r, k, grid);
    else if (sdt == BE_F16) pack ? kq_tc_go<HD, BITS, GROUP, BE_F16, true>(c, r, k, grid) : kq_tc_go<HD, BITS, GROUP, BE_F16, false>(c, r, k, grid);
    else pack ? kq_tc_go<HD, BITS, GROUP, BE_BF16, true>(c, r, k, grid) : kq_tc_go<HD, BITS, GROUP, BE_BF16, false>(c, r, k, grid);
}

/* the record: p q, out, K codes/scales/biases, V codes/scales/biases, geometry at p[8]; i[CU_A_OP..]: bits, group,
 * sdt | path << 4 | tiled << 8, nsplit; f: scale, chunk, softcap */
static void l_kvq_attention(be_ctx *c, const cu_rec *r) {
    int path = (int)(r->i[CU_A_OP + 2] >> 4 & 15);
    if (path == KQ_FLASH) { cu_kvq_flash_launch(c, r); return; }
    int B = (int)r->i[CU_A_B], L = (int)r->i[CU_A_L], H = (int)r->i[CU_A_H], n_kv = (int)r->i[CU_A_NKV], hd = (int)r->i[CU_A_HD];
    int sh = (int)r->i[CU_A_PSH], n_pt = (int)r->i[CU_A_NPT], window = (int)r->i[CU_A_WIN], keep = (int)r->i[CU_A_KEEP];
    int bits = (int)r->i[CU_A_OP], group = (int)r->i[CU_A_OP + 1], sdt = (int)(r->i[CU_A_OP + 2] & 15);
    int tiled = (int)(r->i[CU_A_OP + 2] >> 8 & 1), nsplit = (int)r->i[CU_A_OP + 3], chunk = (int)r->f[1];
    int g = H / n_kv;
    dim3 grid((unsigned)nsplit, (unsigned)n_kv, (unsigned)(B * L));
    if (path == KQ_TC) {
        int pack = c->kq_pack && g <= 4;
        const kq_geo k = {L, H, n_kv, n_pt, sh, window, keep, tiled, nsplit, chunk};
#define KT_G(HD, BITS) do { if (group == 32) kq_tc_sdt<HD, BITS, 32>(c, r, k, grid, sdt, pack); \
                            else if (group == 64) kq_tc_sdt<HD, BITS, 64>(c, r, k, grid, sdt, pack); \
                            else kq_tc_sdt<HD, BITS, HD>(c, r, k, grid, sdt, pack); } while (0)   /* 128: HD 128 only */
#define KT_B(HD) do { if (bits == 4) KT_G(HD, 4); else KT_G(HD, 8); } while (0)
        if (hd == 64) KT_B(64);
        else KT_B(128);
#undef KT_B
#undef KT_G
        CU_LAUNCHED(c, "kvq attention (split, tensor cores)");
        c->light_prev = 1;
        return;
    }
#define KQ(HD, BITS, GM)                                                                                                                  \
    cu_launch(c, k_kvq_split<HD, BITS, GM>, grid, dim3(KQ_THREADS), 0, (const float *)r->p[0], (const uint8_t *)r->p[2], r->p[3], r->p[4], \
              (const uint8_t *)r->p[5], r->p[6], r->p[7], bits, group, sdt, L, H, n_kv, (const int32_t *)r->p[12], n_pt, sh, window, keep, \
              r->f[0], r->f[2], tiled, (const int *)r->p[8], (const int *)r->p[9], (const int *)r->p[10], (const int *)r->p[11], nsplit,  \
              chunk, c->part, c->cnt, (float *)r->p[1])
#define KQ_B(HD, GM) do { if (bits == 4) KQ(HD, 4, GM); else if (bits == 8) KQ(HD, 8, GM); else KQ(HD, 0, GM); } while (0)
#define KQ_G(HD) do { if (g <= 4) KQ_B(HD, 4); else KQ_B(HD, 8); } while (0)
    if (hd == 32) KQ_G(32);
    else if (hd == 64) KQ_G(64);
    else if (hd == 128) KQ_G(128);
    else KQ_G(256);
#undef KQ_G
#undef KQ_B
#undef KQ
    CU_LAUNCHED(c, "kvq attention (split)");
    c->light_prev = 1;
}

void cu_op_kvq_attention(be_ctx *c, const be_attn *a, const float *q, const be_kvq *k, const be_kvq *v, int kernel, float *out) {
    if (!kvq_shape_ok(c, a, k, 1, "kvq_attention") || !kvq_shape_ok(c, a, v, 1, "kvq_attention")) return;
    if (a->n_head / a->n_kv_head > KQ_GMAX || k->bits != v->bits || k->group != v->group || k->sdt != v->sdt) {
        if (!c->err) {
            c->err = (int)cudaErrorInvalidValue;
            snprintf(c->msg, sizeof c->msg, "kvq_attention: %d q heads per kv head (the CUDA kernel takes up to %d), K and V pools of "
                     "one format", a->n_head / a->n_kv_head, KQ_GMAX);
        }
        return;
    }
    /* flash rounds to f16 (not in batch-invariant mode, see cu_op_attention); softcap: the split path */
    int flash = a->L >= 16 && a->head_dim >= 64 && !c->batch_inv && !(a->softcap > 0);
    int span = cu_span_bucket(a->max_span), tiled = kernel == BE_KVQ_TILED, chunk, nsplit;
    int tc = !flash && kq_tc_takes(c, k->bits, a->head_dim, k->group, k->sdt);
    if (tiled) {   /* the tiles: a range of n keys spans at most n / TILE + 2 of them; sinks and run */
        chunk = BE_KVQ_TILE;
        nsplit = span / BE_KVQ_TILE + 4;
    } else if (tc && !c->batch_inv) {
        /* the tensor-core kernel (no limit on a slice's keys): runs of 64, at most one wave of blocks
         * (H200, llama-3.1-8b decode at 32k, KV4: 256 slices of 128 keys ran 7.12 ms a step) */
        static_assert(4 * KT_TK == CU_DEC_RUN, "a slice's rounds are the four warps' runs");
        int pieces = (span + CU_DEC_RUN - 1) / CU_DEC_RUN, want = cu_one_wave(pieces, KT_BLOCKS_SM * c->n_sm, (long)a->B * a->L * a->n_kv_head);
        cu_dec_slices(span, want, c->slice_real, &chunk, &nsplit);
    } else {   /* runs of 128..KQ_CHUNK keys, about 256 slices on long spans */
        chunk = (span + 255) / 256;
        chunk = (chunk + 127) / 128 * 128;
        if (chunk > KQ_CHUNK) chunk = KQ_CHUNK;
        nsplit = (span + chunk - 1) / chunk;
    }
    if (!flash && !cu_split_ws(c, a, nsplit)) return;
    cu_rec r;
    memset(&r, 0, sizeof r);
    r.fn = l_kvq_attention;
    r.p[0] = q;
    r.p[1] = out;
    kq_rec_pools(&r, 2, k, v);
    cu_rec_attn(c, &r, a, 8);
    r.i[CU_A_OP] = k->bits;
    r.i[CU_A_OP + 1] = k->group;
    r.i[CU_A_OP + 2] = k->sdt | (flash ? KQ_FLASH : tc ? KQ_TC : KQ_SPLIT) << 4 | tiled << 8;
    r.i[CU_A_OP + 3] = nsplit;
    r.f[0] = a->scale;
    r.f[1] = (float)chunk;
    r.f[2] = a->softcap > 0 ? a->softcap : 0.0f;
    cu_submit(c, &r);
}
