/*
 * attention.cu — softmax(q k^T * scale + mask) v over the paged KV cache, on
 * the device. Query i of row b sits at position p = pos0[b] + i of sequence
 * seq[b] and sees what be_span says (sinks and a run, see backend.h); keys
 * are found through the device page table (cu_kv_row); padded queries
 * (i >= len[b]) get zeros. Pools [n_pages][n_kv][page][hd] in f32, f16 or
 * bf16; any power-of-two page size (every kernel looks a key's page up per
 * key row, so no kernel needs a minimum).
 *
 * Two kernels here, and the decode kernel for 16-bit pools in attn-decode.cu:
 * - split-K (flash-decoding): grid (slices of >= 32 keys, heads, queries);
 *   the keys a query sees are numbered 0..n-1 (cu_span_of: sinks, then the
 *   run), each block takes a slice of those numbers, scores it in f32, keeps
 *   its max m, sum l and unnormalised output o; the last block of each
 *   (query, head) merges the slices with exp(m_s - M) weights. The grid
 *   depends only on the bucketed span bound (cu_span_bucket), never on the
 *   position, so a captured decode graph stays valid while positions move
 *   (they arrive in device memory). Exact f32; any head_dim.
 * - flash (prefill, head_dim 64, 128 or 256, L >= 16, no softcap): FlashAttention-2 style, 64
 *   queries per block (16 per warp), key/value tiles of 64 positions in
 *   shared memory as f16 (bf16 and f32 pools converted on load), S = QK^T and
 *   O += PV on the tensor cores (mma.sync m16n8k16, f32 accumulate), online
 *   softmax in f32 with exp2. A block walks the tiles of its queries' sinks,
 *   then those of their run, skipping the gap a window leaves; each score is
 *   masked by its query's own span. Heaviest (latest) query tiles first.
 * References: Dao, FlashAttention-2 (2023); Dao et al., Flash-Decoding (2023);
 * PTX ISA, mma.m16n8k16 fragment layouts.
 */
#include <math.h>
#include <string.h>
#include <type_traits>
#include "backend/cuda/kvq.cuh"
#include "backend/cuda/mma.cuh"

#define SPLIT_MAX 4096   /* keys per split-K slice at most (shared memory) */
#define SPLIT_THREADS 128

template <typename KT> __device__ __forceinline__ float kv_at(const KT *p, size_t i) { return cu_f<KT>(p[i]); }

/* the slice's scores, softmax statistics and unnormalised output -> pp;
 * rows[n]: the pool row of each of the slice's keys (a key whose page is not
 * held, which be_span never shows, reads row 0 with weight 0) */
template <typename KT>
__device__ __forceinline__ void split_slice(const float *qq, const KT *K, const KT *V, const uint32_t *rows, const uint8_t *held, int hd,
                                            int n, float scale, float cap, float *qs, float *sc, float *red, float *pp) {
    int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int j0 = 0, j1 = n;
    for (int d = tid; d < hd; d += SPLIT_THREADS) qs[d] = qq[d];
    __syncthreads();
    /* scores: each warp takes KU keys at a time (independent loads in flight), lanes over hd */
    constexpr int KU = 8, NW = SPLIT_THREADS / 32;
    for (int jb = j0 + warp; jb < j1; jb += NW * KU) {
        float acc[KU];
#pragma unroll
        for (int u = 0; u < KU; u++) acc[u] = 0.0f;
        for (int d = lane; d < hd; d += 32) {
            float qd = qs[d];
#pragma unroll
            for (int u = 0; u < KU; u++) {
                int j = jb + NW * u;
                if (j < j1) acc[u] += qd * kv_at(K, (size_t)rows[j] * hd + d);
            }
        }
#pragma unroll
        for (int u = 0; u < KU; u++) {
            float a = acc[u];
#pragma unroll
            for (int o = 16; o; o >>= 1) a += __shfl_xor_sync(0xffffffffu, a, o);
            int j = jb + NW * u;
            if (lane == 0 && j < j1) sc[j - j0] = held[j] ? (cap > 0 ? be_softcap(a * scale, cap) : a * scale) : -INFINITY;
        }
    }
    __syncthreads();
    float mx = -INFINITY;
    for (int j = tid; j < n; j += SPLIT_THREADS) mx = fmaxf(mx, sc[j]);
#pragma unroll
    for (int o = 16; o; o >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
    if (lane == 0) red[warp] = mx;
    __syncthreads();
    mx = red[0];
    for (int w = 1; w < NW; w++) mx = fmaxf(mx, red[w]);
    __syncthreads();
    float sum = 0;
    for (int j = tid; j < n; j += SPLIT_THREADS) sum += (sc[j] = expf(sc[j] - mx));
#pragma unroll
    for (int o = 16; o; o >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
    if (lane == 0) red[warp] = sum;
    __syncthreads();
    if (tid == 0) {
        float t = 0;
        for (int w = 0; w < NW; w++) t += red[w];
        pp[0] = mx;
        pp[1] = t;
    }
    for (int d = tid; d < hd; d += SPLIT_THREADS) {
        const KT *vp = V + d;
        float a0 = 0, a1 = 0, a2 = 0, a3 = 0;
        int j = 0;
#pragma unroll 2
        for (; j + 4 <= n; j += 4) {
            a0 += sc[j] * kv_at(vp, (size_t)rows[j] * hd);
            a1 += sc[j + 1] * kv_at(vp, (size_t)rows[j + 1] * hd);
            a2 += sc[j + 2] * kv_at(vp, (size_t)rows[j + 2] * hd);
            a3 += sc[j + 3] * kv_at(vp, (size_t)rows[j + 3] * hd);
        }
        for (; j < n; j++) a0 += sc[j] * kv_at(vp, (size_t)rows[j] * hd);
        pp[2 + d] = (a0 + a1) + (a2 + a3);
    }
}

/* One block per (slice, head, query). The last block of a (query, head) to
 * finish (a self-resetting counter in cnt) merges the slices' partials, so
 * decode runs one attention kernel per layer. */
template <typename KT>
__global__ void __launch_bounds__(SPLIT_THREADS) k_attn_split(const float *q, const KT *K, const KT *V, int L, int H, int n_kv, int hd,
                                                              const int32_t *pt, int n_pt, int sh, int window, int keep, float scale,
                                                              float cap, const int *pos0, const int *len, const int *seq, const int *run0,
                                                              int nsplit, int chunk, float *part, int *cnt, float *out) {
    extern __shared__ float sm[];
    float *qs = sm, *sc = sm + hd;   /* [hd], [chunk] */
    uint32_t *rows = (uint32_t *)(sc + chunk);   /* [chunk] */
    uint8_t *held = (uint8_t *)(rows + chunk);   /* [chunk] */
    __shared__ float red[SPLIT_THREADS / 32];
    __shared__ int last;
    PDL_ENTRY();
    int s = blockIdx.x, h = blockIdx.y, bi = blockIdx.z, b = bi / L, i = bi % L;
    int tid = threadIdx.x;
    const float *prow = part + ((size_t)bi * H + h) * nsplit * (hd + 2);
    float *pp = (float *)prow + (size_t)s * (hd + 2);
    int p = pos0[b] + i, valid = i < len[b];
    cu_span sp = cu_span_of(p, window, keep, run0[b]);
    int t0 = s * chunk, t1 = min(sp.n, (s + 1) * chunk);
    if (valid && t0 < t1) {
        int kvh = h / (H / n_kv);
        const int32_t *ptr = pt + (size_t)seq[b] * n_pt;
        for (int t = t0 + tid; t < t1; t += SPLIT_THREADS) {   /* split_slice's first barrier publishes these */
            int64_t row = cu_kv_row(ptr, sh, n_kv, kvh, cu_span_key(sp, t));
            rows[t - t0] = row < 0 ? 0u : (uint32_t)row;
            held[t - t0] = row >= 0;
        }
        split_slice<KT>(q + ((size_t)bi * H + h) * hd, K, V, rows, held, hd, t1 - t0, scale, cap, qs, sc, red, pp);
    } else if (tid == 0) {
        pp[0] = -INFINITY;
        pp[1] = 0.0f;
    }
    __threadfence();
    __syncthreads();
    if (tid == 0) last = atomicAdd(&cnt[(size_t)bi * H + h], 1) == nsplit - 1;
    __syncthreads();
    if (!last) return;
    __threadfence();
    float *o = out + ((size_t)bi * H + h) * hd;
    if (!valid) {
        for (int d = tid; d < hd; d += SPLIT_THREADS) o[d] = 0.0f;
    } else {
        float M = -INFINITY;
        for (int s2 = 0; s2 < nsplit; s2++) M = fmaxf(M, __ldcg(prow + (size_t)s2 * (hd + 2)));
        float tot = 0;
        for (int s2 = 0; s2 < nsplit; s2++) {
            float m = __ldcg(prow + (size_t)s2 * (hd + 2));
            if (m != -INFINITY) tot += __ldcg(prow + (size_t)s2 * (hd + 2) + 1) * expf(m - M);
        }
        float inv = 1.0f / tot;
        for (int d = tid; d < hd; d += SPLIT_THREADS) {
            float acc = 0;
            for (int s2 = 0; s2 < nsplit; s2++) {
                float m = __ldcg(prow + (size_t)s2 * (hd + 2));
                if (m != -INFINITY) acc += __ldcg(prow + (size_t)s2 * (hd + 2) + 2 + d) * expf(m - M);
            }
            o[d] = acc * inv;
        }
    }
    if (tid == 0) cnt[(size_t)bi * H + h] = 0;
}

/* ------------------------------------------------------------------ flash */

__device__ __forceinline__ uint32_t pack_h2(float lo, float hi) {
    __half2 h = __floats2half2_rn(lo, hi);
    return *(uint32_t *)&h;
}

__device__ __forceinline__ uint32_t pack_hh(__half lo, __half hi) {
    __half2 h = __halves2half2(lo, hi);
    return *(uint32_t *)&h;
}

/* 8 consecutive cache elements as 8 halves (16 bytes) */
__device__ __forceinline__ uint4 load8h(const float *p) {
    float4 v = *(const float4 *)p, w = *(const float4 *)(p + 4);
    return make_uint4(pack_h2(v.x, v.y), pack_h2(v.z, v.w), pack_h2(w.x, w.y), pack_h2(w.z, w.w));
}
__device__ __forceinline__ uint4 load8h(const __half *p) { return *(const uint4 *)p; }
/* bf16 -> f16 is exact for |x| in [2^-14, 65504], where K and V live */
__device__ __forceinline__ uint4 load8h(const __nv_bfloat16 *p) {
    uint4 r = *(const uint4 *)p;
    const __nv_bfloat162 *b = (const __nv_bfloat162 *)&r;
    float2 f0 = __bfloat1622float2(b[0]), f1 = __bfloat1622float2(b[1]), f2 = __bfloat1622float2(b[2]), f3 = __bfloat1622float2(b[3]);
    return make_uint4(pack_h2(f0.x, f0.y), pack_h2(f1.x, f1.y), pack_h2(f2.x, f2.y), pack_h2(f3.x, f3.y));
}

/* Where flash tiles come from: a source gives the 8 f16 values of (pool row, dims d8..d8+7).
 * A dense pool (f16 ones also by address, for cp.async) ... */
template <typename KT, int HD> struct fl_dense {
    const KT *p;
    static constexpr bool ASYNC = std::is_same<KT, __half>::value;
    __device__ __forceinline__ const KT *at(int64_t row, int d8) const { return p + (size_t)row * HD + d8; }
    __device__ __forceinline__ uint4 load8(int64_t row, int d8) const { return load8h(at(row, d8)); }
};
/* ... or a quantized one (be_kvq), dequantized on load: s*q + b in f32, then rounded to f16 */
template <int HD> struct fl_kvq {
    const uint8_t *codes;
    const void *scales, *biases;
    int bits, group, sdt;
    static constexpr bool ASYNC = false;
    __device__ __forceinline__ const void *at(int64_t, int) const { return nullptr; }
    __device__ __forceinline__ uint4 load8(int64_t row, int d8) const {
        uint64_t w = kvq_codes8<0>(codes + (size_t)row * (HD * bits / 8), d8 / 8, bits);
        size_t gi = (size_t)row * (HD / group) + d8 / group;
        float s = cu_mat_get(scales, sdt, gi), b = cu_mat_get(biases, sdt, gi), v[8];
#pragma unroll
        for (int m = 0; m < 8; m++) v[m] = s * kvq_code<0>(w, m, bits) + b;
        return make_uint4(pack_h2(v[0], v[1]), pack_h2(v[2], v[3]), pack_h2(v[4], v[5]), pack_h2(v[6], v[7]));
    }
};

template <int HD, typename S> constexpr size_t flash_smem() {
    return (S::ASYNC ? 2 : 1) * 2 * (size_t)64 * (HD + 8) * sizeof(__half);
}

/* f16 caches stream tiles with cp.async, two stages deep; f32 caches are
 * converted on the way in, one stage. Fragments come from shared memory
 * through ldmatrix (.trans for V). Rows padded by 8 halves: conflict-free. */
template <int HD, typename S>
__global__ void __launch_bounds__(128) k_flash(const float *q, S K, S V, float *out, int L, int H, int n_kv,
                                               const int32_t *pt, int n_pt, int sh, int window, int keep, float scale_log2,
                                               const int *pos0, const int *len, const int *seq, const int *run0) {
    constexpr int BQ = 64, BK = 64, LD = HD + 8, KS = HD / 16, NT = HD / 8;   /* BK = 1 << 6: see load_tile */
    constexpr bool ASYNC = S::ASYNC;
    constexpr int STAGES = ASYNC ? 2 : 1;
    extern __shared__ __align__(16) unsigned char smraw[];
    __half *Ksm = (__half *)smraw, *Vsm = Ksm + STAGES * BK * LD;
    PDL_ENTRY();
    int qt = gridDim.x - 1 - blockIdx.x, h = blockIdx.y, b = blockIdx.z;
    int kvh = h / (H / n_kv);
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t4 = lane & 3;
    int lb = len[b], p0 = pos0[b], rs = run0[b];
    int q_first = qt * BQ;
    int r0 = q_first + warp * 16 + g, r1 = r0 + 8;
    int qlast = min(lb, min(L, q_first + BQ)) - 1;
    int khi = p0 + qlast + 1;
    int pr0 = p0 + r0, pr1 = p0 + r1;
    /* the tiles: the block's queries see sinks within [a0, a1) and a run within [b0, khi) (be_span
     * is monotone in p, so its first and last query bound them); a gap between is skipped */
    int a0, a1, b0, sl0, sh0, rl0, sl1, sh1, rl1, tmp;
    be_span(p0 + q_first, window, keep, rs, &a0, &tmp, &b0);
    int rl_last;   /* the last query's run start: tiles from there up to the first query are seen by all */
    be_span(p0 + max(qlast, q_first), window, keep, rs, &tmp, &a1, &rl_last);
    be_span(pr0, window, keep, rs, &sl0, &sh0, &rl0);
    be_span(pr1, window, keep, rs, &sl1, &sh1, &rl1);
    a0 = a0 / BK * BK;
    b0 = b0 / BK * BK;
    int a_end = (a1 + BK - 1) / BK * BK, two = a1 > a0 && b0 > a_end;
    int klo = a1 > a0 ? a0 : b0;
    auto next_tile = [&](int kb) { return two && kb + BK == a_end ? b0 : kb + BK; };
    const int32_t *ptr = pt + (size_t)seq[b] * n_pt;

    uint32_t qa[KS][4];
#pragma unroll
    for (int ks = 0; ks < KS; ks++) {
#pragma unroll
        for (int rr = 0; rr < 4; rr++) {
            int row = (rr & 1) ? r1 : r0, col = ks * 16 + 2 * t4 + ((rr & 2) ? 8 : 0);
            float a = 0, c = 0;
            if (row < L) {
                const float *src = q + (((size_t)b * L + row) * H + h) * HD + col;
                a = src[0];
                c = src[1];
            }
            qa[ks][rr] = pack_h2(a, c);
        }
    }
    float o[NT][4];
#pragma unroll
    for (int nt = 0; nt < NT; nt++) o[nt][0] = o[nt][1] = o[nt][2] = o[nt][3] = 0.0f;
    float m0 = -INFINITY, m1 = -INFINITY, l0 = 0, l1 = 0;
    /* pages of at least BK slots hold a whole (aligned) tile: one page-table read per tile,
     * issued a tile ahead (its latency hidden behind a tile's compute) rather than a dependent
     * read before every copy; smaller pages: a read per key in load_tile */
    auto tile_base = [&](int kb) -> int64_t { return sh >= 6 && kb < khi ? cu_kv_row(ptr, sh, n_kv, kvh, kb) : -1; };
    auto load_tile = [&](int stage, int kb, int64_t base) {
        __half *Ks = Ksm + stage * BK * LD, *Vs = Vsm + stage * BK * LD;
        for (int e = threadIdx.x; e < BK * HD / 8; e += 128) {
            int r = e / (HD / 8), d8 = (e % (HD / 8)) * 8;
            __half *kd = &Ks[r * LD + d8], *vd = &Vs[r * LD + d8];
            int64_t row = kb + r >= khi ? -1 : sh >= 6 ? (base < 0 ? -1 : base + r) : cu_kv_row(ptr, sh, n_kv, kvh, kb + r);
            if (row >= 0) {
                if constexpr (ASYNC) {
                    cp_async16(kd, K.at(row, d8));
                    cp_async16(vd, V.at(row, d8));
                } else {
                    *(uint4 *)kd = K.load8(row, d8);
                    *(uint4 *)vd = V.load8(row, d8);
                }
            } else {
                *(uint4 *)kd = make_uint4(0, 0, 0, 0);
                *(uint4 *)vd = make_uint4(0, 0, 0, 0);
            }
        }
        if constexpr (ASYNC) cp_async_commit();
    };

    int64_t pre = tile_base(klo);   /* the base of the next tile to load */
    if (klo < khi) {
        load_tile(0, klo, pre);
        pre = tile_base(next_tile(klo));
    }
    int it = 0;
    for (int kb = klo; kb < khi; kb = next_tile(kb), it++) {
        int stage = ASYNC ? (it & 1) : 0;
        if constexpr (ASYNC) {
            if (next_tile(kb) < khi) {
                load_tile(stage ^ 1, next_tile(kb), pre);
                pre = tile_base(next_tile(next_tile(kb)));
                cp_async_wait<1>();
            } else {
                cp_async_wait<0>();
            }
        }
        __syncthreads();
        const __half *Ks = Ksm + stage * BK * LD, *Vs = Vsm + stage * BK * LD;
        float s[BK / 8][4];
#pragma unroll
        for (int j = 0; j < BK / 8; j++) {
            s[j][0] = s[j][1] = s[j][2] = s[j][3] = 0.0f;
#pragma unroll
            for (int ks = 0; ks < KS; ks += 2) {
                uint32_t bf[4];
                ldsm_x4(bf, &Ks[(j * 8 + (lane & 7)) * LD + ks * 16 + (lane >> 3) * 8]);
                mma16816(s[j], qa[ks], bf[0], bf[1]);
                mma16816(s[j], qa[ks + 1], bf[2], bf[3]);
            }
        }
        float mx0 = -INFINITY, mx1 = -INFINITY;
        /* a tile inside every query's run (all but the diagonal and window-edge tiles) needs no mask */
        bool full = kb >= rl_last && kb + BK - 1 <= p0 + q_first;
#pragma unroll
        for (int j = 0; j < BK / 8; j++) {
#pragma unroll
            for (int e = 0; e < 4; e++) {
                int key = kb + j * 8 + 2 * t4 + (e & 1), pr = e < 2 ? pr0 : pr1;
                int sl = e < 2 ? sl0 : sl1, sh_ = e < 2 ? sh0 : sh1, rl = e < 2 ? rl0 : rl1;
                bool ok = full || (key < khi && ((key >= sl && key < sh_) || (key >= rl && key <= pr)));
                float v = ok ? s[j][e] * scale_log2 : -INFINITY;
                s[j][e] = v;
                if (e < 2) mx0 = fmaxf(mx0, v);
                else mx1 = fmaxf(mx1, v);
            }
        }
#pragma unroll
        for (int o2 = 1; o2 <= 2; o2 <<= 1) {
            mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, o2));
            mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, o2));
        }
        float mn0 = fmaxf(m0, mx0), mn1 = fmaxf(m1, mx1);
        float base0 = mn0 == -INFINITY ? 0.0f : mn0, base1 = mn1 == -INFINITY ? 0.0f : mn1;
        float al0 = exp2f(m0 - base0), al1 = exp2f(m1 - base1);
        m0 = mn0;
        m1 = mn1;
        float ps0 = 0, ps1 = 0;
#pragma unroll
        for (int j = 0; j < BK / 8; j++) {
            s[j][0] = exp2f(s[j][0] - base0);
            s[j][1] = exp2f(s[j][1] - base0);
            s[j][2] = exp2f(s[j][2] - base1);
            s[j][3] = exp2f(s[j][3] - base1);
            ps0 += s[j][0] + s[j][1];
            ps1 += s[j][2] + s[j][3];
        }
        l0 = l0 * al0 + ps0;
        l1 = l1 * al1 + ps1;
#pragma unroll
        for (int nt = 0; nt < NT; nt++) {
            o[nt][0] *= al0;
            o[nt][1] *= al0;
            o[nt][2] *= al1;
            o[nt][3] *= al1;
        }
#pragma unroll
        for (int kk = 0; kk < BK / 16; kk++) {
            uint32_t pa[4] = {pack_h2(s[2 * kk][0], s[2 * kk][1]), pack_h2(s[2 * kk][2], s[2 * kk][3]),
                              pack_h2(s[2 * kk + 1][0], s[2 * kk + 1][1]), pack_h2(s[2 * kk + 1][2], s[2 * kk + 1][3])};
            int mi = lane >> 3, rr = lane & 7;
#pragma unroll
            for (int nt = 0; nt < NT; nt += 2) {
                uint32_t bf[4];
                ldsm_x4_t(bf, &Vs[(kk * 16 + (mi & 1) * 8 + rr) * LD + (nt + (mi >> 1)) * 8]);
                mma16816(o[nt], pa, bf[0], bf[1]);
                mma16816(o[nt + 1], pa, bf[2], bf[3]);
            }
        }
        __syncthreads();
        if constexpr (!ASYNC) {
            if (next_tile(kb) < khi) {
                load_tile(0, next_tile(kb), pre);
                pre = tile_base(next_tile(next_tile(kb)));
            }
        }
    }
#pragma unroll
    for (int o2 = 1; o2 <= 2; o2 <<= 1) {
        l0 += __shfl_xor_sync(0xffffffffu, l0, o2);
        l1 += __shfl_xor_sync(0xffffffffu, l1, o2);
    }
    float inv0 = r0 < lb && l0 > 0 ? 1.0f / l0 : 0.0f, inv1 = r1 < lb && l1 > 0 ? 1.0f / l1 : 0.0f;
#pragma unroll
    for (int nt = 0; nt < NT; nt++) {
        int d = nt * 8 + 2 * t4;
        if (r0 < L) *(float2 *)(out + (((size_t)b * L + r0) * H + h) * HD + d) = make_float2(o[nt][0] * inv0, o[nt][1] * inv0);
        if (r1 < L) *(float2 *)(out + (((size_t)b * L + r1) * H + h) * HD + d) = make_float2(o[nt][2] * inv1, o[nt][3] * inv1);
    }
}

/* ---------------------------------------------------------------- the op */

enum { ATT_SPLIT = 0, ATT_FLASH = 1, ATT_DECODE = 2 };

/* one flash launch over sources K, V (its shared memory attribute set first) */
template <int HD, typename S>
static void flash_go(be_ctx *c, dim3 grid, const float *q, S K, S V, float *out, int L, int H, int n_kv, const int32_t *pt, int n_pt,
                     int sh, int window, int keep, float sl, const int *pos0, const int *len, const int *seq, const int *run0) {
    if (cu_check(c, cudaFuncSetAttribute(k_flash<HD, S>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)flash_smem<HD, S>()),
                 "flash attention: shared memory attribute"))
        return;
    cu_launch(c, k_flash<HD, S>, grid, dim3(128), flash_smem<HD, S>(), q, K, V, out, L, H, n_kv, pt, n_pt, sh, window, keep, sl, pos0,
              len, seq, run0);
}

/* flash prefill over quantized pools (kvquant.cu's record: p q, out, K codes/scales/biases, V codes/scales/biases, then the
 * attention geometry at p[8]; i[CU_A_OP..]: bits, group, sdt; f[0] scale) */
void cu_kvq_flash_launch(be_ctx *c, const cu_rec *r) {
    const float *q = (const float *)r->p[0];
    float *out = (float *)r->p[1];
    const int *pos0 = (const int *)r->p[8], *len = (const int *)r->p[9], *seq = (const int *)r->p[10], *run0 = (const int *)r->p[11];
    const int32_t *pt = (const int32_t *)r->p[12];
    int B = (int)r->i[CU_A_B], L = (int)r->i[CU_A_L], H = (int)r->i[CU_A_H], n_kv = (int)r->i[CU_A_NKV], hd = (int)r->i[CU_A_HD];
    int sh = (int)r->i[CU_A_PSH], n_pt = (int)r->i[CU_A_NPT], window = (int)r->i[CU_A_WIN], keep = (int)r->i[CU_A_KEEP];
    int bits = (int)r->i[CU_A_OP], group = (int)r->i[CU_A_OP + 1], sdt = (int)(r->i[CU_A_OP + 2] & 15);
    dim3 grid((unsigned)((L + 63) / 64), (unsigned)H, (unsigned)B);
    float sl = r->f[0] * 1.4426950408889634f;
#define FQ(HD) flash_go<HD>(c, grid, q, fl_kvq<HD>{(const uint8_t *)r->p[2], r->p[3], r->p[4], bits, group, sdt}, \
                            fl_kvq<HD>{(const uint8_t *)r->p[5], r->p[6], r->p[7], bits, group, sdt}, out, L, H, n_kv, pt, n_pt, sh, window, \
                            keep, sl, pos0, len, seq, run0)
    if (hd == 64) FQ(64);
    else if (hd == 128) FQ(128);
    else FQ(256);
#undef FQ
    CU_LAUNCHED(c, "flash attention (quantized KV)");
}

/* the record (see cu_rec_attn; p: q, K, V, out, pos0, len, seq, run0, pt, then cu_op_rope_kv_attend's k, v, pos,
 * inv_freq (NULL: none); i[CU_A_OP..]: dtype, path, nsplit, tc, rot_dims, neox; f: scale, chunk, softcap (0: none)) */
static void l_attention(be_ctx *c, const cu_rec *r) {
    const float *q = (const float *)r->p[0];
    const void *K = r->p[1], *V = r->p[2];
    float *out = (float *)r->p[3];
    const int *pos0 = (const int *)r->p[4], *len = (const int *)r->p[5], *seq = (const int *)r->p[6], *run0 = (const int *)r->p[7];
    const int32_t *pt = (const int32_t *)r->p[8];
    int B = (int)r->i[CU_A_B], L = (int)r->i[CU_A_L], H = (int)r->i[CU_A_H], n_kv = (int)r->i[CU_A_NKV], hd = (int)r->i[CU_A_HD];
    int sh = (int)r->i[CU_A_PSH], n_pt = (int)r->i[CU_A_NPT], window = (int)r->i[CU_A_WIN], keep = (int)r->i[CU_A_KEEP];
    int dt = (int)r->i[CU_A_OP], path = (int)r->i[CU_A_OP + 1], nsplit = (int)r->i[CU_A_OP + 2];
    float scale = r->f[0];
    if (path == ATT_FLASH) {
        dim3 grid((unsigned)((L + 63) / 64), (unsigned)H, (unsigned)B);
        float sl = scale * 1.4426950408889634f;
#define FL(HD, KT) flash_go<HD>(c, grid, q, fl_dense<KT, HD>{(const KT *)K}, fl_dense<KT, HD>{(const KT *)V}, out, L, H, n_kv, pt, \
                              n_pt, sh, window, keep, sl, pos0, len, seq, run0)
#define FL_DT(HD) do { if (dt == BE_F16) FL(HD, __half); else if (dt == BE_BF16) FL(HD, __nv_bfloat16); else FL(HD, float); } while (0)
        if (hd == 64) FL_DT(64);
        else if (hd == 128) FL_DT(128);
        else FL_DT(256);   /* Gemma 3 */
#undef FL_DT
#undef FL
        CU_LAUNCHED(c, "flash attention");
        return;
    }
    if (path == ATT_DECODE) {
        cu_attn_decode_launch(c, r);
        return;
    }
    int chunk = (int)r->f[1];
    dim3 grid((unsigned)nsplit, (unsigned)H, (unsigned)(B * L));
    size_t smem = sizeof(float) * (size_t)(hd + chunk) + 5 * (size_t)chunk;
#define SPL(KT) cu_launch(c, k_attn_split<KT>, grid, dim3(SPLIT_THREADS), smem, q, (const KT *)K, (const KT *)V, L, H, n_kv, hd, pt, n_pt, \
                          sh, window, keep, scale, r->f[2], pos0, len, seq, run0, nsplit, chunk, c->part, c->cnt, out)
    if (dt == BE_F16) SPL(__half);
    else if (dt == BE_BF16) SPL(__nv_bfloat16);
    else SPL(float);
#undef SPL
    CU_LAUNCHED(c, "attention (split-K)");
    c->light_prev = 1;
}

/* the attention op's record in r; 0 on failure (the context's status says) */
static int attn_rec(be_ctx *c, const be_attn *a, const float *q, const void *k, const void *v, be_dtype dt, float *out, cu_rec *r) {
    /* flash rounds q and p to f16: not in batch-invariant mode, where a row must not depend on
     * whether its batch's padded length reaches 16 */
    /* softcapped scores (Gemma 2): the split-K kernel only */
    int flash = (a->head_dim == 64 || a->head_dim == 128 || a->head_dim == 256) && a->L >= 16 && !c->batch_inv &&
                !(a->softcap > 0);
    /* split-K geometry from the shape and the bucketed span only (never the position): slices of
     * at least 32 keys, at most ~2048 blocks, at most SPLIT_MAX keys per slice (shared memory) */
    int span = cu_span_bucket(a->max_span), rows = a->B * a->L * a->n_head;
    int nsplit = (span + 31) / 32, most = 2048 / (rows > 0 ? rows : 1);
    if (nsplit > most) nsplit = most > 1 ? most : 1;
    if (nsplit < (span + SPLIT_MAX - 1) / SPLIT_MAX) nsplit = (span + SPLIT_MAX - 1) / SPLIT_MAX;
    int chunk = ((span + nsplit - 1) / nsplit + 31) / 32 * 32;
    /* batch-invariant: a query's slices must not depend on the batch (the merge then adds the
     * same non-empty slices in the same order): slices of 32 keys up to 32k keys */
    if (c->batch_inv) chunk = 32 * ((span + 32 * 1024 - 1) / (32 * 1024));
    nsplit = (span + chunk - 1) / chunk;
    /* decode over a 16-bit pool (attn-decode.cu): its own slices */
    int tc = cu_attn_decode_tc(c, span);
    int decode = !flash && !(a->softcap > 0) && cu_attn_decode_fits(a, dt, span, c->batch_inv ? 0 : c->dec_blocks * c->n_sm,
                                                                     c->batch_inv || !tc ? 0 : c->n_sm, c->slice_real && !c->batch_inv,
                                                                     c->batch_inv ? 0 : c->dec_short, &chunk, &nsplit);
    if (!flash && !cu_split_ws(c, a, nsplit)) return 0;
    memset(r, 0, sizeof *r);
    r->fn = l_attention;
    r->p[0] = q;
    r->p[1] = k;
    r->p[2] = v;
    r->p[3] = out;
    cu_rec_attn(c, r, a, 4);
    r->i[CU_A_OP] = dt;
    r->i[CU_A_OP + 1] = flash ? ATT_FLASH : decode ? ATT_DECODE : ATT_SPLIT;
    r->i[CU_A_OP + 2] = nsplit;
    r->i[CU_A_OP + 3] = tc;
    r->f[0] = a->scale;
    r->f[1] = (float)chunk;
    r->f[2] = a->softcap > 0 ? a->softcap : 0.0f;
    return 1;
}

void cu_op_attention(be_ctx *c, const be_attn *a, const float *q, const void *k, const void *v, be_dtype dt, float *out) {
    cu_rec r;
    if (attn_rec(c, a, q, k, v, dt, out, &r)) cu_submit(c, &r);
}

/* rope_kv_write then attention; where the decode kernel takes the rope and the write (cu_attn_decode_rope: one
 * query a row on the CUDA-core kernel), one launch: q and k stay unrotated in their buffers, which the op
 * leaves as scratch (H100, llama-3-8b 4-bit decode at 128-256 positions: the rope kernel and its hand-off took
 * ~2.5 us a layer) */
void cu_op_rope_kv_attend(be_ctx *c, const be_attn *a, float *q, float *k, const float *v, void *kc, void *vc, be_dtype dt,
                          float *out) {
    cu_rec r;
    if (!attn_rec(c, a, q, kc, vc, dt, out, &r)) return;
    if (r.i[CU_A_OP + 1] == ATT_DECODE && !r.i[CU_A_OP + 3] && cu_attn_decode_rope(c, a, (int)r.i[CU_A_OP + 2])) {
        r.p[9] = k;
        r.p[10] = v;
        r.p[11] = cu_stage(c, a->pos, sizeof(int) * (size_t)a->B);
        r.p[12] = cu_stage(c, a->inv_freq, sizeof(float) * (size_t)(a->rot_dims / 2));
        r.i[CU_A_OP + 4] = a->rot_dims;
        r.i[CU_A_OP + 5] = a->neox;
    } else {
        cu_op_rope_kv_write(c, a, q, k, v, kc, vc, dt);
    }
    cu_submit(c, &r);
}
