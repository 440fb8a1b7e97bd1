/*
 * attention-amx.c — one query's scores on AMX bf16 tiles (TDPBF16PS), for
 * attention-gemm.c's decode path (one_query) where the CPU grants the tiles
 * (gemm_amx_available), a kv head has at most 8 query heads and head_dim is
 * a multiple of 32 up to ATT_AMX_HD:
 *     st[t][h] = scale * q[h] . k[t]        (keys as rows: st is [key][8])
 * The keys go to the tiles as A's rows, with no transposition: f32 rows split
 * exactly into three bf16 parts, k = k1 + k2 + k3 (each the top 8 significant
 * bits of what is left, by masks); bf16 pages' rows as they are (k = k1), f16
 * ones in two parts (their 11 significant bits).
 * The group's queries, split the same way once a call, are B: columns 0-7
 * q1 and 8-15 q2 of one tile, q3 in columns 0-7 of another. Products kept:
 * (k1 + k2 + k3) (q1 + q2) + k1 q3, the dropped terms below 2^-24 |k||q|: the
 * f32 dot product to rounding, summed in another order (bf16 products are
 * exact in the tiles' f32 sums). What it replaces: the keys transposed a page
 * at a time (16 shuffles a key) and 32 FMAs a key for the 8 heads' scores.
 * Scratch (att_amx_ws_bytes): B [hd/32][2 tiles][16][16][2] bf16, A [3][16][hd]
 * bf16, C [16][16] f32.
 * Many queries (prefill, att_amx_qk): the roles turn, queries as A's rows (16
 * at a time, three parts each) and the item's keys, packed once, as B's
 * columns (three parts), so C is S[16 queries][16 keys] in the scores' own
 * layout; products q1 k1 + q2 k1 + q3 k1 + q1 k2 + q2 k2 + q1 k3.
 */
#include "backend/cpu/gemv.h"

#if defined(__x86_64__)
#include <immintrin.h>
#include <string.h>

#define AMX_TGT "amx-tile,amx-bf16,avx512f,avx512bw,avx512vl,avx512bf16"
#define AMX_FN static inline __attribute__((always_inline, target(AMX_TGT)))

int att_amx_takes(int grp, int hd) { return grp <= 8 && hd % 32 == 0 && hd <= ATT_AMX_HD && gemm_amx_available(); }

size_t att_amx_ws_bytes(int hd) { return 64 * (size_t)hd + 96 * (size_t)hd + 1024 + 64; }

static uint16_t *amx_b(void *ws) { return (uint16_t *)(((uintptr_t)ws + 63) & ~(uintptr_t)63); }
static uint16_t *amx_a(void *ws, int hd) { return amx_b(ws) + 32 * (size_t)hd; }
static float *amx_c(void *ws, int hd) { return (float *)(void *)(amx_a(ws, hd) + 48 * (size_t)hd); }

static uint32_t f32_bits(float x) { uint32_t u; memcpy(&u, &x, 4); return u; }
static float bits_f32(uint32_t u) { float x; memcpy(&x, &u, 4); return x; }

/* the tiles' shapes (0-2: A parts, 16 keys x 32 dims; 3, 4: B, 16 dim pairs x 16 columns x 2; 5: C, 16 x 16 f32)
 * and the group's queries split into q1 + q2 + q3 (B) */
__attribute__((target(AMX_TGT))) void att_amx_begin(const float *q, int grp, int hd, void *ws) {
    amx_tiles_full();
    uint16_t *B = amx_b(ws);
    memset(B, 0, sizeof(uint16_t) * 32 * (size_t)hd);
    for (int h = 0; h < grp; h++)
        for (int d = 0; d < hd; d++) {
            float x = q[(size_t)h * hd + d], p1 = bits_f32(f32_bits(x) & 0xFFFF0000u), r = x - p1;
            float p2 = bits_f32(f32_bits(r) & 0xFFFF0000u), p3 = r - p2;
            uint16_t *b = B + (size_t)(d / 32) * 1024 + (size_t)(d % 32 / 2) * 32 + d % 2;   /* tile, row (dim pair), pair */
            b[2 * h] = (uint16_t)(f32_bits(p1) >> 16);
            b[2 * (8 + h)] = (uint16_t)(f32_bits(p2) >> 16);
            b[512 + 2 * h] = (uint16_t)(f32_bits(p3) >> 16);
        }
}

__attribute__((target(AMX_TGT))) void att_amx_end(void) { _tile_release(); }

/* x = p[0] + p[1] + p[2] exactly, each part the top 8 significant bits of what is left (so a bf16) */
AMX_FN void split3(__m512 x, __m512 p[3]) {
    const __m512i hi = _mm512_set1_epi32((int)0xFFFF0000u);
    p[0] = _mm512_castsi512_ps(_mm512_and_si512(_mm512_castps_si512(x), hi));
    __m512 rest = _mm512_sub_ps(x, p[0]);
    p[1] = _mm512_castsi512_ps(_mm512_and_si512(_mm512_castps_si512(rest), hi));
    p[2] = _mm512_sub_ps(rest, p[1]);
}

/* 16 elements of a row from element i as f32: f32 (f16 = 0) or f16 */
AMX_FN __m512 ld_row(const void *k, size_t i, int f16) {
    return f16 ? _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)((const uint16_t *)k + i))) : _mm512_loadu_ps((const float *)k + i);
}

/* rows r < nk of k (f32, or f16: hd elements a row) as three bf16 parts into A: [part][16][hd] (f16: two, its 11
 * significant bits); pf (or NULL): each row's lines there prefetched into L2 as the row is read (spread out: a
 * burst of them stalls on the fill buffers) */
AMX_FN void split_rows(const void *k, int f16, int nk, int hd, uint16_t *A, const void *pf) {
    const size_t pst = 16 * (size_t)hd, es = f16 ? 2 : 4;
    for (int r = 0; r < nk; r++)
        for (int c = 0; c < hd; c += 32) {
            for (size_t b = 0; pf && b < 32 * es; b += 64) _mm_prefetch((const char *)pf + ((size_t)r * hd + c) * es + b, _MM_HINT_T1);
            __m512 p0[3], p1[3];
            split3(ld_row(k, (size_t)r * hd + c, f16), p0);
            split3(ld_row(k, (size_t)r * hd + c + 16, f16), p1);
#pragma GCC unroll 3
            for (int j = 0; j < 3 - f16; j++)   /* each part exactly a bf16: the conversion only packs */
                _mm512_storeu_si512(A + j * pst + (size_t)r * hd + c, (__m512i)_mm512_cvtne2ps_pbh(p1[j], p0[j]));
        }
}

/* st[t][h] = scale * (C[t][h] + C[t][8 + h]) for t < nk */
AMX_FN void fold_c(const float *C, int nk, float scale, float *st) {
    const __m256 s = _mm256_set1_ps(scale);
    for (int t = 0; t < nk; t++)
        _mm256_storeu_ps(st + 8 * (size_t)t, _mm256_mul_ps(s, _mm256_add_ps(_mm256_loadu_ps(C + 16 * t), _mm256_loadu_ps(C + 16 * t + 8))));
}

/* st[t][0..8) = scale * q[h] . k[t] for t < n (heads past the group: 0); k: n rows of hd, kdt f32, bf16 or f16 */
__attribute__((target(AMX_TGT))) void att_amx_scores(void *ws, const void *k, be_dtype kdt, int n, int hd, float scale, float *st,
                                                      const void *pf) {
    const int bf16 = kdt == BE_BF16, f16 = kdt == BE_F16;
    const size_t es = be_dtype_size(kdt);
    const uint16_t *B = amx_b(ws);
    uint16_t *A = amx_a(ws, hd);
    float *C = amx_c(ws, hd);
    size_t pst = 16 * (size_t)hd;
    for (int t0 = 0; t0 < n; t0 += 16) {
        int nk = n - t0 < 16 ? n - t0 : 16;
        const uint16_t *A1 = A;
        size_t lda = 2 * (size_t)hd;
        if (!bf16) {
            split_rows((const char *)k + (size_t)t0 * hd * es, f16, nk, hd, A, pf ? (const char *)pf + (size_t)t0 * hd * es : NULL);
        } else if (nk == 16) {
            for (size_t b = 0; pf && b < 32 * (size_t)hd; b += 64) _mm_prefetch((const char *)pf + 2 * (size_t)t0 * hd + b, _MM_HINT_T1);
            A1 = (const uint16_t *)k + (size_t)t0 * hd;   /* the page's own rows */
        } else {   /* the last rows: copied, so that the tile reads nothing past them */
            memcpy(A, (const uint16_t *)k + (size_t)t0 * hd, sizeof(uint16_t) * (size_t)nk * hd);
        }
        _tile_zero(5);
        for (int ks = 0; ks < hd / 32; ks++) {
            _tile_loadd(3, B + (size_t)ks * 1024, 64);
            _tile_loadd(4, B + (size_t)ks * 1024 + 512, 64);
            _tile_loadd(0, A1 + (size_t)ks * 32, lda);
            _tile_dpbf16ps(5, 0, 3);
            _tile_dpbf16ps(5, 0, 4);
            if (!bf16) {
                _tile_loadd(1, A + pst + (size_t)ks * 32, lda);
                _tile_dpbf16ps(5, 1, 3);
            }
            if (!bf16 && !f16) {
                _tile_loadd(2, A + 2 * pst + (size_t)ks * 32, lda);
                _tile_dpbf16ps(5, 2, 3);
            }
        }
        _tile_stored(5, C, 64);
        fold_c(C, nk, scale, st + 8 * (size_t)t0);
    }
}

/* Many queries (prefill): the item's keys as B tiles, kb[part][T16][hd / 32][16 dim pairs][16 keys][2] bf16 (keys
 * past the item's: 0), packed once an item, so that C = S[16 queries][16 keys] lands in the scores' own layout */
size_t att_amx_kt_bytes(int T, int hd) { return 3 * (size_t)((T + 15) / 16) * 32 * (size_t)hd; }

/* keys [col, col + n) of the item (rows of hd f32) into kb; T16 = ceil(T / 16) */
__attribute__((target(AMX_TGT))) void att_amx_pack_kt(const float *k, int n, int hd, int col, int T, void *kb) {
    const int T16 = (T + 15) / 16;
    const size_t pst = (size_t)T16 * 16 * hd;   /* a part's bf16 */
    uint16_t *B = kb;
    if (col == 0) memset(B, 0, att_amx_kt_bytes(T, hd));   /* the last block's keys past T stay 0 */
    const __m512i rowoff = _mm512_mullo_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
                                              _mm512_set1_epi32(64));
    for (int t = 0; t < n; t++) {
        int kt = col + t, blk = kt / 16, kn = kt % 16;
        for (int c = 0; c < hd; c += 32) {
            __m512 p0[3], p1[3];
            split3(_mm512_loadu_ps(k + (size_t)t * hd + c), p0);
            split3(_mm512_loadu_ps(k + (size_t)t * hd + c + 16), p1);
            for (int j = 0; j < 3; j++) {   /* dword r (dims 2r, 2r + 1) to row r, column kn of the tile */
                __m512i w = (__m512i)_mm512_cvtne2ps_pbh(p1[j], p0[j]);
                char *tile = (char *)(B + j * pst + ((size_t)blk * (hd / 32) + c / 32) * 512) + 4 * kn;
                _mm512_i32scatter_epi32(tile, rowoff, w, 1);
            }
        }
    }
}

/* S[r][c] = scale * q[r] . k[c] for r < rows (<= 16), c < c_end (whole blocks of 16 up to c_end, at most T), from
 * kb (att_amx_pack_kt); ws: att_amx_ws_bytes(hd). The tiles: 0-2 q's parts (16 x 32 dims), 3-5 k's, 6 C. */
__attribute__((target(AMX_TGT))) void att_amx_qk(const float *q, int ldq, int rows, const void *kb, int T, int c_end, int hd,
                                                  float scale, float *S, int lds, void *ws) {
    amx_tiles_full();
    uint16_t *A = amx_a(ws, hd);
    float *C = amx_c(ws, hd);
    const size_t pst = 16 * (size_t)hd, kpst = (size_t)((T + 15) / 16) * 16 * hd;
    const uint16_t *B = kb;
    for (int r = 0; r < 16; r++)   /* rows past `rows`: zeros */
        if (r < rows) split_rows(q + (size_t)r * ldq, 0, 1, hd, A + (size_t)r * hd, NULL);
        else for (int j = 0; j < 3; j++) memset(A + j * pst + (size_t)r * hd, 0, 2 * (size_t)hd);
    const __m512 s = _mm512_set1_ps(scale);
    for (int c0 = 0; c0 < c_end; c0 += 16) {
        _tile_zero(6);
        for (int ks = 0; ks < hd / 32; ks++) {
            const uint16_t *b = B + ((size_t)(c0 / 16) * (hd / 32) + ks) * 512;
            _tile_loadd(0, A + (size_t)ks * 32, 2 * hd);
            _tile_loadd(1, A + pst + (size_t)ks * 32, 2 * hd);
            _tile_loadd(2, A + 2 * pst + (size_t)ks * 32, 2 * hd);
            _tile_loadd(3, b, 64);
            _tile_loadd(4, b + kpst, 64);
            _tile_loadd(5, b + 2 * kpst, 64);
            _tile_dpbf16ps(6, 0, 3);   /* (q1 + q2 + q3) k1 + (q1 + q2) k2 + q1 k3 */
            _tile_dpbf16ps(6, 1, 3);
            _tile_dpbf16ps(6, 2, 3);
            _tile_dpbf16ps(6, 0, 4);
            _tile_dpbf16ps(6, 1, 4);
            _tile_dpbf16ps(6, 0, 5);
        }
        _tile_stored(6, C, 64);
        int nc = T - c0 < 16 ? T - c0 : 16;
        __mmask16 m = (__mmask16)((1u << nc) - 1);
        for (int r = 0; r < rows; r++) _mm512_mask_storeu_ps(S + (size_t)r * lds + c0, m, _mm512_mul_ps(s, _mm512_loadu_ps(C + 16 * r)));
    }
    _tile_release();
}

/* ... and the item's values as B tiles for p.V, vb[part][T32][hd / 16][16 key pairs][16 dims][2] bf16 (keys past
 * the item's: 0): keys [col, col + n), col 0 first */
size_t att_amx_vt_bytes(int T, int hd) { return 3 * (size_t)((T + 31) / 32) * 64 * (size_t)hd; }

__attribute__((target(AMX_TGT))) void att_amx_pack_v(const float *v, int n, int hd, int col, int T, void *vb) {
    const size_t pst = (size_t)((T + 31) / 32) * 32 * hd;   /* a part's bf16 */
    uint16_t *B = vb;
    if (col == 0) memset(B, 0, att_amx_vt_bytes(T, hd));
    for (int t = 0; t < n; t++) {
        int kt = col + t, e = kt & 1;
        const __mmask32 m = e ? 0xAAAAAAAAu : 0x55555555u;   /* the key's words of its pair's row */
        for (int c = 0; c < hd; c += 16) {
            __m512 p[3];
            split3(_mm512_loadu_ps(v + (size_t)t * hd + c), p);
            for (int j = 0; j < 3; j++) {
                __m512i w = _mm512_cvtepu16_epi32((__m256i)_mm512_cvtneps_pbh(p[j]));
                uint16_t *row = B + j * pst + ((size_t)(kt / 32) * (hd / 16) + c / 16) * 512 + (size_t)(kt % 32 / 2) * 32;
                _mm512_mask_storeu_epi16(row, m, e ? _mm512_slli_epi32(w, 16) : w);
            }
        }
    }
}

/* o[r][d] = sum_{c < c_end} P[r][c] v[c][d] for r < rows (<= 16), d < hd (o written, not added to), from vb
 * (att_amx_pack_v); P's columns from c_end on read as 0. Tiles: 0-3 C (64 dims a pass), 4-6 P's parts (16 x 32
 * keys), 7 B. Products p1 v1 + p2 v1 + p3 v1 + p1 v2 + p2 v2 + p1 v3. */
__attribute__((target(AMX_TGT))) void att_amx_pv(const float *P, int lds, int rows, int c_end, const void *vb, int T, int hd,
                                                  float *o, int ldo, void *ws) {
    amx_tiles_full();
    uint16_t *A = amx_a(ws, hd);   /* [3][16][32] */
    float *C = amx_c(ws, hd);
    const size_t pst = (size_t)((T + 31) / 32) * 32 * hd;
    const uint16_t *B = vb;
    for (int d0 = 0; d0 < hd; d0 += 64) {
        int nd = (hd - d0 < 64 ? hd - d0 : 64) / 16;
        _tile_zero(0);
        _tile_zero(1);
        _tile_zero(2);
        _tile_zero(3);
        for (int c0 = 0; c0 < c_end; c0 += 32) {
            for (int r = 0; r < 16; r++) {   /* P's rows as three parts; rows past `rows` and keys past c_end: 0 */
                int left = r < rows ? c_end - c0 : 0;
                __mmask16 m0 = (__mmask16)(left >= 16 ? 0xffff : left <= 0 ? 0 : (1u << left) - 1);
                __mmask16 m1 = (__mmask16)(left >= 32 ? 0xffff : left <= 16 ? 0 : (1u << (left - 16)) - 1);
                __m512 p0[3], p1[3];
                split3(_mm512_maskz_loadu_ps(m0, P + (size_t)(r < rows ? r : 0) * lds + c0), p0);
                split3(_mm512_maskz_loadu_ps(m1, P + (size_t)(r < rows ? r : 0) * lds + c0 + 16), p1);
                for (int j = 0; j < 3; j++) _mm512_storeu_si512(A + j * 512 + r * 32, (__m512i)_mm512_cvtne2ps_pbh(p1[j], p0[j]));
            }
            _tile_loadd(4, A, 64);
            _tile_loadd(5, A + 512, 64);
            _tile_loadd(6, A + 1024, 64);
            const uint16_t *b = B + ((size_t)(c0 / 32) * (hd / 16) + d0 / 16) * 512;
#define PV_TILE(t)                                                   \
            if (t < nd) {                                            \
                _tile_loadd(7, b + (t) * 512, 64);                   \
                _tile_dpbf16ps(t, 4, 7);                             \
                _tile_dpbf16ps(t, 5, 7);                             \
                _tile_dpbf16ps(t, 6, 7);                             \
                _tile_loadd(7, b + (t) * 512 + pst, 64);             \
                _tile_dpbf16ps(t, 4, 7);                             \
                _tile_dpbf16ps(t, 5, 7);                             \
                _tile_loadd(7, b + (t) * 512 + 2 * pst, 64);         \
                _tile_dpbf16ps(t, 4, 7);                             \
            }
            PV_TILE(0)
            PV_TILE(1)
            PV_TILE(2)
            PV_TILE(3)
#undef PV_TILE
        }
#define PV_OUT(t)                                                                                         \
        if (t < nd) {                                                                                     \
            _tile_stored(t, C, 64);                                                                       \
            for (int r = 0; r < rows; r++) _mm512_storeu_ps(o + (size_t)r * ldo + d0 + 16 * (t), _mm512_loadu_ps(C + 16 * r)); \
        }
        PV_OUT(0)
        PV_OUT(1)
        PV_OUT(2)
        PV_OUT(3)
#undef PV_OUT
    }
    _tile_release();
}
#else
size_t att_amx_vt_bytes(int T, int hd) { (void)T; (void)hd; return 0; }
void att_amx_pack_v(const float *v, int n, int hd, int col, int T, void *vb) { (void)v; (void)n; (void)hd; (void)col; (void)T; (void)vb; }
void att_amx_pv(const float *P, int lds, int rows, int c_end, const void *vb, int T, int hd, float *o, int ldo, void *ws) {
    (void)P; (void)lds; (void)rows; (void)c_end; (void)vb; (void)T; (void)hd; (void)o; (void)ldo; (void)ws;
}
size_t att_amx_kt_bytes(int T, int hd) { (void)T; (void)hd; return 0; }
void att_amx_pack_kt(const float *k, int n, int hd, int col, int T, void *kb) { (void)k; (void)n; (void)hd; (void)col; (void)T; (void)kb; }
void att_amx_qk(const float *q, int ldq, int rows, const void *kb, int T, int c_end, int hd, float scale, float *S, int lds,
                void *ws) {
    (void)q; (void)ldq; (void)rows; (void)kb; (void)T; (void)c_end; (void)hd; (void)scale; (void)S; (void)lds; (void)ws;
}
int att_amx_takes(int grp, int hd) { (void)grp; (void)hd; return 0; }
size_t att_amx_ws_bytes(int hd) { (void)hd; return 0; }
void att_amx_begin(const float *q, int grp, int hd, void *ws) { (void)q; (void)grp; (void)hd; (void)ws; }
void att_amx_end(void) {}
void att_amx_scores(void *ws, const void *k, be_dtype kdt, int n, int hd, float scale, float *st, const void *pf) {
    (void)ws; (void)k; (void)kdt; (void)n; (void)hd; (void)scale; (void)st; (void)pf;
}
#endif
