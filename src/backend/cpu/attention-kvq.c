/*
 * attention-kvq.c — the CPU backend's be_ops.kvq_attention: attention over
 * affine-quantized K/V pools (be_kvq) straight from the codes, never a
 * dequantized copy. The definitions are be_ref_kvq_attention's two kernels
 * (ref-kvq.c); this computes both within float rounding of them:
 *
 * Work unit = (row b, query i, kv head, block of <= 8 of its query heads, key
 * block). The query heads that share a kv head (GQA) are the 8 lanes of one
 * pass over that head's keys, so each code is decoded once for all of them.
 * Keys are visited in tiles (be_span's ranges cut at every multiple of
 * BE_KVQ_TILE, as the tiled definition does), with an online softmax across
 * tiles; the unfused definition's precise softmax differs from that only in
 * rounding. Per key and group of G values (MLX's qmm association):
 *   score = sum_g s_g * sum_{i in g} qs_i c_i + b_g * sum_{i in g} qs_i
 * and, with e_j = exp(score_j - m), the output accumulates
 *   o += sum_j (e_j s_jg) c_j  (per group)  and  ob_g += sum_j e_j b_jg,
 * out = (o + ob) / l. Long contexts with few units (one sequence, few kv
 * heads) split each query's tiles into key blocks whose partial (m, l, o)
 * are merged afterwards, so every thread has work.
 * Codes are decoded 8 at a time by avx2.h's decoder, specialized for 4 and 8
 * bits, generic for 2, 3, 5, 6; on a CPU with AVX-512 (unless CINFER_ISA caps
 * it) 4- and 8-bit codes go 16 at a time (dec16), halving the FMAs over
 * head_dim (attention-kvq-tiles.h holds the tile kernels, written once for
 * both widths); with AMX-INT8 (Sapphire Rapids on) the scores of 4- and 8-bit
 * pages go to int8 tile products (amx_scores). Without AVX2 (or
 * CINFER_ISA=scalar) the reference runs, one query head per task over the pool.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include "backend/cpu/cpu.h"
#include "backend/cpu/gemv.h"
#include "quant/affine.h"

#define HB 8   /* query heads per pass: the lanes of a vector */

typedef struct kvq_job {
    const be_attn *a;
    const float *q;
    const be_kvq *k, *v;
    int kernel;
    float *out;
    int grp, nhb, nblk;   /* query heads per kv head; head blocks of HB; key blocks per query */
    int wide;             /* 4- and 8-bit codes 16 at a time (AVX-512) */
    int amx;              /* ... and their scores on AMX tiles */
    size_t units;         /* B * L * n_kv * nhb * nblk */
    float *ws;            /* [nth][ws_per] */
    size_t ws_per;
    float *part;          /* [units][2 HB + HB hd]: m, l, o of each key block (nblk > 1) */
} kvq_job;

/* the reference, one query head per task (no AVX2) */
static void ref_task(void *arg, int ith, int nth) {
    const kvq_job *j = arg;
    const be_attn *a = j->a;
    int hd = a->head_dim, span = a->max_span > 0 ? a->max_span : 1;
    float *s = j->ws + (size_t)ith * j->ws_per;
    size_t total = (size_t)a->B * a->L * a->n_head, w0 = total * ith / nth, w1 = total * (ith + 1) / nth;
    for (size_t w = w0; w < w1; w++)
        be_ref_kvq_query(a, j->q, j->k, j->v, j->kernel, (int)(w / a->n_head / a->L), (int)(w / a->n_head % a->L),
                         (int)(w % a->n_head), s, s + span, j->out + w * hd);
}

static int n_tiles(int lo, int hi) { return lo < hi ? (hi - 1) / BE_KVQ_TILE - lo / BE_KVQ_TILE + 1 : 0; }

/* merges the key blocks' partials of every (row, query, kv head, head block) into out */
static void merge(const kvq_job *j) {
    const be_attn *a = j->a;
    int hd = a->head_dim, nb = j->nblk;
    size_t ps = 2 * HB + (size_t)HB * hd, groups = j->units / (size_t)nb;
    for (size_t u = 0; u < groups; u++) {
        int hb = (int)(u % j->nhb), kh = (int)(u / j->nhb % a->n_kv_head);
        size_t bi = u / j->nhb / a->n_kv_head;   /* b * L + i */
        int nh = j->grp - hb * HB < HB ? j->grp - hb * HB : HB;
        const float *p = j->part + u * nb * ps;
        for (int t = 0; t < nh; t++) {
            float *o = j->out + (bi * a->n_head + (size_t)kh * j->grp + (size_t)hb * HB + t) * hd;
            float m = -INFINITY, l = 0;
            for (int k = 0; k < nb; k++) m = p[k * ps + t] > m ? p[k * ps + t] : m;
            memset(o, 0, sizeof(float) * hd);
            if (m == -INFINITY) continue;   /* a padded query */
            for (int k = 0; k < nb; k++) {
                const float *pk = p + k * ps;
                float f = expf(pk[t] - m);
                l += f * pk[HB + t];
                for (int d = 0; d < hd; d++) o[d] += f * pk[2 * HB + t * hd + d];
            }
            for (int d = 0; d < hd; d++) o[d] /= l;
        }
    }
}

#ifdef GEMV_X86
#include <immintrin.h>
#include "backend/cpu/avx2.h"

/* exp of 8 lanes (Cephes' expf: range reduction by ln 2 in two parts, degree-5 polynomial; about
 * 1 ulp); x < -88.38 (and -inf) gives 0 */
INL __m256 exp8(__m256 x) {
    __m256 ok = _mm256_cmp_ps(x, _mm256_set1_ps(-88.3762626647949f), _CMP_GE_OQ);
    x = _mm256_min_ps(_mm256_max_ps(x, _mm256_set1_ps(-88.3762626647949f)), _mm256_set1_ps(88.3762626647949f));
    __m256 fx = _mm256_floor_ps(_mm256_fmadd_ps(x, _mm256_set1_ps(1.44269504088896341f), _mm256_set1_ps(0.5f)));
    x = _mm256_fnmadd_ps(fx, _mm256_set1_ps(0.693359375f), x);
    x = _mm256_fnmadd_ps(fx, _mm256_set1_ps(-2.12194440e-4f), x);
    __m256 y = _mm256_set1_ps(1.9875691500e-4f);
    y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(1.3981999507e-3f));
    y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(8.3334519073e-3f));
    y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(4.1665795894e-2f));
    y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(1.6666665459e-1f));
    y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(5.0000001201e-1f));
    y = _mm256_fmadd_ps(y, _mm256_mul_ps(x, x), _mm256_add_ps(x, _mm256_set1_ps(1.0f)));
    __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvttps_epi32(fx), _mm256_set1_epi32(127)), 23);
    return _mm256_and_ps(_mm256_mul_ps(y, _mm256_castsi256_ps(e)), ok);
}

/* lane h = the sum of the lanes of p[h] */
INL __m256 reduce8(const __m256 *p) {
    __m256 t0 = _mm256_hadd_ps(p[0], p[1]), t1 = _mm256_hadd_ps(p[2], p[3]);
    __m256 t2 = _mm256_hadd_ps(p[4], p[5]), t3 = _mm256_hadd_ps(p[6], p[7]);
    __m256 u0 = _mm256_hadd_ps(t0, t1), u1 = _mm256_hadd_ps(t2, t3);
    return _mm256_add_ps(_mm256_permute2f128_ps(u0, u1, 0x20), _mm256_permute2f128_ps(u0, u1, 0x31));
}

/* what one unit reads: its queries (scaled, zero for pad heads) and the pools */
typedef struct unit_in {
    const float *qs;    /* [HB][hd] */
    const float *sq;    /* [ng][HB] group sums of qs */
    int hd, ng, G;
    const be_kvq *k, *v;
    size_t rb;          /* bytes of one row of codes */
    uint8_t *amx;       /* the AMX instance's scratch (amx_ws_bytes, 64-byte aligned) */
} unit_in;

/* ahead of the scores of key j of a tile of n: its V row (p.V reads it next) and the K row 16 keys on */
static inline __attribute__((always_inline)) void prefetch_rows(const unit_in *x, const int64_t *slot, int j, int n) {
    if (j + 16 < n) _mm_prefetch((const char *)(x->k->codes + (size_t)slot[j + 16] * x->rb), _MM_HINT_T0);
    _mm_prefetch((const char *)(x->v->codes + (size_t)slot[j] * x->rb), _MM_HINT_T0);
}

/* the 16-wide kernels' p.V over 4-bit codes takes 32 dims a pass as two vectors, the block's low nibbles (even dims)
 * and its high nibbles (odd dims), and keeps o's 32-float blocks in that order (groups are 32, 64 or 128: a block
 * never spans two); this restores the dims' order in o [nh][hd] */
static void kvq_unpair(float *o, int hd, int nh) {
    float t[32];
    for (int h = 0; h < nh; h++)
        for (int b = 0; b < hd; b += 32) {
            float *ob = o + (size_t)h * hd + b;
            for (int i = 0; i < 16; i++) {
                t[2 * i] = ob[i];
                t[2 * i + 1] = ob[16 + i];
            }
            memcpy(ob, t, sizeof t);
        }
}

/* slot[j - j0] = be_kv_off's slot of keys j0..j1-1, a page at a time (page is a power of two) */
static void fill_slots(const be_attn *a, const int32_t *pt, int kh, int j0, int j1, int64_t *slot) {
    int sh = __builtin_ctz((unsigned)a->page);
    for (int j = j0; j < j1;) {
        int pg = j >> sh, e = (pg + 1) << sh;
        int64_t base = ((int64_t)pt[pg] * a->n_kv_head + kh) << sh;
        for (e = e < j1 ? e : j1; j < e; j++) slot[j - j0] = base + (j & (a->page - 1));
    }
}

#define KT_TGT TGT
#define KT_W 8
#define KT(name) name##_avx2
#include "backend/cpu/attention-kvq-tiles.h"
#undef KT_TGT
#undef KT_W
#undef KT

#define AVX512_TGT "avx512f,avx512bw,avx512vl,avx2,fma,f16c"

/* 16 codes of 4 or 8 bits (8 or 16 bytes at p) as floats: a 4-bit byte holds codes 2i (low nibble)
 * and 2i + 1 */
static inline __attribute__((always_inline, target(AVX512_TGT))) __m512 dec16(const uint8_t *p, const int bits) {
    __m128i b;
    if (bits == 8) {
        b = _mm_loadu_si128((const __m128i *)p);
    } else {
        __m128i w = _mm_cvtepu8_epi16(_mm_loadl_epi64((const __m128i *)p));
        b = _mm_or_si128(_mm_and_si128(w, _mm_set1_epi16(15)), _mm_slli_epi16(_mm_srli_epi16(w, 4), 8));
    }
    return _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(b));
}

/* exp8 over 16 lanes (the same operations, so the same values) */
static inline __attribute__((always_inline, target(AVX512_TGT))) __m512 exp16(__m512 x) {
    __mmask16 ok = _mm512_cmp_ps_mask(x, _mm512_set1_ps(-88.3762626647949f), _CMP_GE_OQ);
    x = _mm512_min_ps(_mm512_max_ps(x, _mm512_set1_ps(-88.3762626647949f)), _mm512_set1_ps(88.3762626647949f));
    __m512 fx = _mm512_roundscale_ps(_mm512_fmadd_ps(x, _mm512_set1_ps(1.44269504088896341f), _mm512_set1_ps(0.5f)),
                                     _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC);
    x = _mm512_fnmadd_ps(fx, _mm512_set1_ps(0.693359375f), x);
    x = _mm512_fnmadd_ps(fx, _mm512_set1_ps(-2.12194440e-4f), x);
    __m512 y = _mm512_set1_ps(1.9875691500e-4f);
    y = _mm512_fmadd_ps(y, x, _mm512_set1_ps(1.3981999507e-3f));
    y = _mm512_fmadd_ps(y, x, _mm512_set1_ps(8.3334519073e-3f));
    y = _mm512_fmadd_ps(y, x, _mm512_set1_ps(4.1665795894e-2f));
    y = _mm512_fmadd_ps(y, x, _mm512_set1_ps(1.6666665459e-1f));
    y = _mm512_fmadd_ps(y, x, _mm512_set1_ps(5.0000001201e-1f));
    y = _mm512_fmadd_ps(y, _mm512_mul_ps(x, x), _mm512_add_ps(x, _mm512_set1_ps(1.0f)));
    __m512i e = _mm512_slli_epi32(_mm512_add_epi32(_mm512_cvttps_epi32(fx), _mm512_set1_epi32(127)), 23);
    return _mm512_maskz_mov_ps(ok, _mm512_mul_ps(y, _mm512_castsi512_ps(e)));
}

#define KT_TGT AVX512_TGT
#define KT_W 16
#define KT(name) name##_avx512
#include "backend/cpu/attention-kvq-tiles.h"
#undef KT_TGT
#undef KT_W
#undef KT

/* AMX (Sapphire Rapids and later, where gemm_amx_int8_available): the scores of 16 keys at a time as int8 tile
 * products (TDPBUSD) over 64 dims (a group of 32: 32), A = the keys' codes as unsigned bytes (exact), B = each of
 * the 8 query heads' qs as three signed 8-bit digits, qs = sg (d1 + d2 / 254 + d3 / 254^2) with sg = max |qs| / 127,
 * to within 2^-24 of max |qs| (columns 0-7 d1, 8-15 d2 of one tile; d3 in 0-7 of another): the integer sums are exact
 * and the three are combined per key in f32, so the scores are the f32 dot product's to rounding. The bf16 form
 * before it (A the codes as bf16, qs in three bf16 parts) built 16 key rows of bf16 a pass and did two products per
 * 32 dims; an 8-bit page's rows now go to the tiles straight from the pool. p.V stays on AVX-512 (p.V on AMX was
 * tried four ways, bf16 and int8: BENCHMARKS run 10). Scratch: B [hd/KS][2][KS/4][16][4] s8 (32 hd bytes) then sg
 * [8] f32, A [16 keys][hd] u8, C [2][16][16] s32. */
#define AMX_TGT AVX512_TGT ",amx-tile,amx-int8"
static size_t amx_b_bytes(int hd) { return 32 * (size_t)hd + 64; }   /* B, then sg */
static size_t amx_ws_bytes(int hd) { return amx_b_bytes(hd) + 16 * (size_t)hd + 2 * 1024; }   /* then A, C */
static float *amx_sg(const unit_in *x) { return (float *)(void *)(x->amx + 32 * (size_t)x->hd); }
static int8_t amx_s8(float d) { return (int8_t)(d > 127 ? 127 : d < -127 ? -127 : d); }

/* the tiles' shapes (A: 16 keys x KS codes; B 1, 2: KS / 4 rows of 16 columns x 4 digits; C 3, 4: 16 x 16 int32)
 * and the queries' digits (B) and scales (sg) */
static __attribute__((target(AMX_TGT))) void amx_begin(const unit_in *x) {
    int hd = x->hd, KS = x->G < 64 ? x->G : 64;   /* dims a product takes: 64, or a group of 32 */
    const uint8_t rows[5] = {16, (uint8_t)(KS / 4), (uint8_t)(KS / 4), 16, 16};   /* A: 16 keys x KS codes, then B, C */
    const uint16_t colsb[5] = {(uint16_t)KS, 64, 64, 64, 64};
    amx_tiles(5, rows, colsb);
    int8_t *B = (int8_t *)x->amx;
    float *sig = amx_sg(x);
    for (int h = 0; h < HB; h++) {
        const float *q = x->qs + (size_t)h * hd;
        float mx = 0.0f;
        for (int d = 0; d < hd; d++) mx = fabsf(q[d]) > mx ? fabsf(q[d]) : mx;
        float sg = mx > 0.0f ? mx / 127.0f : 1.0f;
        sig[h] = sg;
        for (int d = 0; d < hd; d++) {   /* q / sg = d1 + d2 / 254 + d3 / 254^2 to within 0.5 / 254^2 */
            float t = q[d] / sg, d1 = rintf(t), e = (t - d1) * 254.0f, d2 = rintf(e), d3 = rintf((e - d2) * 254.0f);
            int8_t *b1 = B + (size_t)(d / KS) * 2 * 16 * KS + (size_t)(d % KS / 4) * 64 + d % 4, *b2 = b1 + 16 * KS;
            b1[4 * h] = amx_s8(d1);
            b1[4 * (HB + h)] = amx_s8(d2);
            b2[4 * h] = amx_s8(d3);
            b2[4 * (HB + h)] = 0;
        }
    }
}

/* the scores of 16 keys at a time as int8 tile products (TDPBUSD): A = the keys' codes as bytes (8-bit: the pool's
 * own rows where the 16 keys lie in one page, else copied; 4-bit: unpacked), B = each head's scaled query as three
 * signed 8-bit digits, q = sg (d1 + d2 / 254 + d3 / 254^2) to within 2^-24 of max |q| (columns 0-7 d1, 8-15 d2 of one
 * tile, d3 in 0-7 of another); the integer sums are exact, the digits combined per key in f32 */
static inline __attribute__((always_inline, target(AMX_TGT))) void amx_scores(const unit_in *x, const int64_t *slot, int n,
                                                                              float *S, const int bits) {
    int hd = x->hd, KS = x->G < 64 ? x->G : 64, ksg = x->G / KS;
    const uint8_t *codes = x->k->codes, *B = x->amx;
    uint8_t *A = x->amx + amx_b_bytes(hd);
    int32_t *C = (int32_t *)(void *)(A + 16 * (size_t)hd);
    const __m256 sg = _mm256_loadu_ps(amx_sg(x));
    const __m256 i1 = _mm256_set1_ps(1.0f / 254.0f), i2 = _mm256_set1_ps(1.0f / (254.0f * 254.0f));
    for (int jb = 0; jb < n; jb += 16) {
        int nk = n - jb < 16 ? n - jb : 16;
        const uint8_t *At = A;
        size_t lda = (size_t)hd;
        for (int r = 0; r < nk; r++) prefetch_rows(x, slot, jb + r, n);
        int run = bits == 8 && nk == 16;   /* the 16 keys' rows one after another in the pool (one page) */
        for (int r = 1; run && r < 16; r++) run = slot[jb + r] == slot[jb] + r;
        if (run) {
            At = codes + (size_t)slot[jb] * x->rb;
            lda = x->rb;
        } else {
            for (int r = 0; r < nk; r++) {   /* rows past nk stay as they were: their scores are not read */
                const uint8_t *row = codes + (size_t)slot[jb + r] * x->rb;
                uint8_t *ar = A + (size_t)r * hd;
                for (int c = 0; c < hd; c += 32) {   /* 32 codes a step (head_dim is a multiple of the group, >= 32) */
                    if (bits == 8) {
                        _mm256_storeu_si256((__m256i *)(ar + c), _mm256_loadu_si256((const __m256i *)(row + c)));
                    } else {   /* byte i: codes 2i (low nibble), 2i + 1 */
                        __m256i w = _mm256_cvtepu8_epi16(_mm_loadu_si128((const __m128i *)(row + c / 2)));
                        _mm256_storeu_si256((__m256i *)(ar + c), _mm256_and_si256(_mm256_or_si256(w, _mm256_slli_epi16(w, 4)), _mm256_set1_epi16(0x0F0F)));
                    }
                }
            }
        }
        for (int g = 0; g < x->ng; g++) {
            _tile_zero(3);
            _tile_zero(4);
            for (int ks = g * ksg; ks < (g + 1) * ksg; ks++) {
                _tile_loadd(0, At + (size_t)ks * KS, lda);
                _tile_loadd(1, B + (size_t)ks * 32 * KS, 64);
                _tile_loadd(2, B + (size_t)ks * 32 * KS + 16 * KS, 64);
                _tile_dpbusd(3, 0, 1);
                _tile_dpbusd(4, 0, 2);
            }
            _tile_stored(3, C, 64);
            _tile_stored(4, C + 256, 64);
            __m256 sq = _mm256_loadu_ps(x->sq + g * HB);
            for (int r = 0; r < nk; r++) {
                int64_t si = slot[jb + r] * x->ng + g;
                const __m256i *cr = (const __m256i *)(const void *)(C + r * 16);
                __m256 v = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_loadu_si256(cr + 1)), i1, _mm256_cvtepi32_ps(_mm256_loadu_si256(cr)));
                v = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_loadu_si256((const __m256i *)(const void *)(C + 256 + r * 16))), i2, v);
                __m256 sv = _mm256_fmadd_ps(_mm256_mul_ps(_mm256_set1_ps(ld_sb(x->k->scales, x->k->sdt, si)), sg), v,
                                            _mm256_mul_ps(_mm256_set1_ps(ld_sb(x->k->biases, x->k->sdt, si)), sq));
                float *Sr = S + (size_t)(jb + r) * HB;
                _mm256_storeu_ps(Sr, g ? _mm256_add_ps(_mm256_loadu_ps(Sr), sv) : sv);
            }
        }
    }
}

#define KT_TGT AMX_TGT
#define KT_W 16
#define KT(name) name##_amx
#define KT_SCORES amx_scores
#define KT_BEGIN(x) amx_begin(x)
#define KT_END() _tile_release()
#include "backend/cpu/attention-kvq-tiles.h"
#undef KT_TGT
#undef KT_W
#undef KT
#undef KT_SCORES

typedef void (*tiles_fn)(const unit_in *, const be_attn *, const int32_t *, int, const int *, int, int, float *,
                         float *, int64_t *, float *, float *, __m256 *, __m256 *, int);

static __attribute__((target(TGT))) void unit_task(void *arg, int ith, int nth) {
    const kvq_job *j = arg;
    const be_attn *a = j->a;
    int hd = a->head_dim, G = j->k->group, ng = hd / G, bits = j->k->bits;
    float *qs = j->ws + (size_t)ith * j->ws_per, *sq = qs + HB * hd, *o = sq + ng * HB, *ob = o + HB * hd;
    float *S = ob + ng * HB, *W = S + BE_KVQ_TILE * HB;
    int64_t *slot = (int64_t *)(W + BE_KVQ_TILE * HB);
    uint8_t *amx = (uint8_t *)(((uintptr_t)(slot + BE_KVQ_TILE) + 63) & ~(uintptr_t)63);
    unit_in x = {qs, sq, hd, ng, G, j->k, j->v, aq_row_bytes(hd, bits), amx};
    size_t u0 = j->units * ith / nth, u1 = j->units * (ith + 1) / nth;
    for (size_t u = u0; u < u1; u++) {
        int blk = (int)(u % j->nblk), hb = (int)(u / j->nblk % j->nhb);
        int kh = (int)(u / j->nblk / j->nhb % a->n_kv_head);
        size_t bi = u / j->nblk / j->nhb / a->n_kv_head;
        int b = (int)(bi / a->L), i = (int)(bi % a->L), nh = j->grp - hb * HB < HB ? j->grp - hb * HB : HB;
        int h0 = kh * j->grp + hb * HB;
        float *po = j->nblk > 1 ? j->part + u * (2 * HB + (size_t)HB * hd) : NULL;
        if (i >= a->len[b]) {   /* a padded query: zeros (merge: m = -inf) */
            if (po) { for (int t = 0; t < HB; t++) po[t] = -INFINITY; }
            else memset(j->out + (bi * a->n_head + h0) * hd, 0, sizeof(float) * hd * nh);
            continue;
        }
        int p = a->pos0[b] + i, r[4];
        be_span(p, a->window, a->keep, a->run0[b], &r[0], &r[1], &r[2]);
        r[3] = p + 1;
        int nt = n_tiles(r[0], r[1]) + n_tiles(r[2], r[3]);
        int t0 = (int)((int64_t)nt * blk / j->nblk), t1 = (int)((int64_t)nt * (blk + 1) / j->nblk);
        memset(qs, 0, sizeof(float) * HB * hd);
        memset(sq, 0, sizeof(float) * ng * HB);
        for (int t = 0; t < nh; t++) {
            const float *qq = j->q + (bi * a->n_head + h0 + t) * hd;
            for (int d = 0; d < hd; d++) {
                qs[t * hd + d] = qq[d] * a->scale;
                sq[d / G * HB + t] += qs[t * hd + d];
            }
        }
        memset(o, 0, sizeof(float) * HB * hd);
        memset(ob, 0, sizeof(float) * ng * HB);
        __m256 m = _mm256_set1_ps(-INFINITY), l = _mm256_setzero_ps();
        int NH = nh > 4 ? 8 : nh > 1 ? 4 : 1, bk = bits == 4 ? 0 : bits == 8 ? 1 : 2;
        static const tiles_fn fns[7][3] = {{tiles_q4_h1_avx2, tiles_q4_h4_avx2, tiles_q4_h8_avx2},
                                           {tiles_q8_h1_avx2, tiles_q8_h4_avx2, tiles_q8_h8_avx2},
                                           {tiles_qn_h1_avx2, tiles_qn_h4_avx2, tiles_qn_h8_avx2},
                                           {tiles_q4_h1_avx512, tiles_q4_h4_avx512, tiles_q4_h8_avx512},
                                           {tiles_q8_h1_avx512, tiles_q8_h4_avx512, tiles_q8_h8_avx512},
                                           {tiles_q4_h1_amx, tiles_q4_h4_amx, tiles_q4_h8_amx},
                                           {tiles_q8_h1_amx, tiles_q8_h4_amx, tiles_q8_h8_amx}};
        if (t0 < t1)
            fns[bk < 2 && j->wide ? bk + 3 + 2 * j->amx : bk][NH == 1 ? 0 : NH == 4 ? 1 : 2](&x, a, a->pt_host + (size_t)a->seq[b] * a->n_pt, kh, r, t0, t1, S, W,
                                                   slot, o, ob, &m, &l, bits);
        if (bk == 0 && j->wide) kvq_unpair(o, hd, nh);
        float ms[HB], ls[HB];
        _mm256_storeu_ps(ms, m);
        _mm256_storeu_ps(ls, l);
        for (int t = 0; t < nh; t++)   /* fold the bias sums in: o = sum e (s c + b) */
            for (int d = 0; d < hd; d++) o[t * hd + d] += ob[d / G * HB + t];
        if (po) {
            memcpy(po, ms, sizeof ms);
            memcpy(po + HB, ls, sizeof ls);
            memcpy(po + 2 * HB, o, sizeof(float) * HB * hd);
        } else {
            for (int t = 0; t < nh; t++) {
                float *out = j->out + (bi * a->n_head + h0 + t) * hd, inv = 1.0f / ls[t];
                for (int d = 0; d < hd; d++) out[d] = o[t * hd + d] * inv;
            }
        }
    }
}
#endif

void cpu_kvq_attention(be_ctx *c, const be_attn *a, const float *q, const be_kvq *k, const be_kvq *v, int kernel,
                       float *out) {
    int hd = a->head_dim, span = a->max_span > 0 ? a->max_span : 1, nth = c->n_threads;
    kvq_job j = {a, q, k, v, kernel, out, a->n_head / a->n_kv_head, 0, 1, 0, 0, 0, NULL, 0, NULL};
    j.nhb = (j.grp + HB - 1) / HB;
    double work = (double)a->B * a->L * a->n_head * hd * span;
    int fast = 0;
#ifdef GEMV_X86
    fast = strcmp(gemv_pick()->isa, "scalar") != 0 && hd % 8 == 0 && k->group == v->group && k->bits == v->bits &&
           k->sdt == v->sdt;
    j.wide = fast && att_avx512_available() && k->group % 16 == 0;
    j.amx = j.wide && k->group % 32 == 0 && hd <= 256 && gemm_amx_int8_available();
#endif
    size_t need;
    if (fast) {
        size_t base = (size_t)a->B * a->L * a->n_kv_head * j.nhb;
        int max_tiles = span / BE_KVQ_TILE + 2;
        if (work >= 65536.0 && base < 2 * (size_t)nth && !c->batch_inv) {   /* few units: split the keys too */
            j.nblk = (int)((2 * (size_t)nth + base - 1) / base);
            if (j.nblk > max_tiles) j.nblk = max_tiles;
        }
        j.units = base * j.nblk;
        int ng = hd / k->group;
        j.ws_per = (2 * (size_t)HB * hd + 2 * (size_t)ng * HB + 2 * (size_t)BE_KVQ_TILE * HB + 2 * BE_KVQ_TILE + 15) / 16 * 16;
#ifdef GEMV_X86
        if (j.amx) j.ws_per += (amx_ws_bytes(hd) + 64) / sizeof(float);
#endif
        need = (size_t)nth * j.ws_per + (j.nblk > 1 ? j.units * (2 * HB + (size_t)HB * hd) : 0);
    } else {
        j.ws_per = ((size_t)span + 2 * hd + 15) / 16 * 16;
        need = (size_t)nth * j.ws_per;
    }
    if (c->att_n < need) {
        float *p = realloc(c->att, need * sizeof(float));
        if (!p) { be_ref_kvq_attention(a, q, k, v, kernel, out); return; }
        c->att = p;
        c->att_n = need;
    }
    j.ws = c->att;
    j.part = c->att + (size_t)nth * j.ws_per;
    cpu_task_fn fn = ref_task;
#ifdef GEMV_X86
    if (fast) fn = unit_task;
#endif
    if (work < 65536.0) fn(&j, 0, 1);
    else cpu_pool_run(c->pool, fn, &j);
    if (fast && j.nblk > 1) merge(&j);
}
