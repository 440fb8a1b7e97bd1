/*
 * attention-kvq-tiles.h — attention-kvq.c's tile kernels, written once and
 * included once per vector width over head_dim (KT_W = 8: AVX2, 16: AVX-512
 * for 4- and 8-bit codes): KT(name) suffixes the names, KT_TGT is the target.
 * The heads stay the 8 lanes of a __m256 at either width (m, l, S, W, the
 * scores' reduction); only the products over head_dim — the codes decoded
 * KT_W at a time against the queries, and p.V into o — take the width, so
 * each output lane sums the same terms in the same key order at both widths
 * (the scores' dot products are split into partial sums differently).
 * An includer may bring its own scores kernel (KT_SCORES) and a prologue and
 * epilogue per tiles call (KT_BEGIN, KT_END): attention-kvq.c's AMX instance.
 */
#define KINL static inline __attribute__((always_inline, target(KT_TGT)))
#ifndef KT_BEGIN   /* per call of a tiles kernel: the AMX instance configures its tiles and packs the queries */
#define KT_BEGIN(x) ((void)(x))
#define KT_END() ((void)0)
#endif

#if KT_W == 16
typedef __m512 KT(vec);
#define KV_ZERO() _mm512_setzero_ps()
#define KV_LOAD(p) _mm512_loadu_ps(p)
#define KV_STORE(p, v) _mm512_storeu_ps(p, v)
#define KV_FMA(a, b, c) _mm512_fmadd_ps(a, b, c)
#define KV_SET1(x) _mm512_set1_ps(x)
#define KV_DEC(dc, p, bits, end) ((void)(dc), dec16(p, bits))
/* 16 lanes folded to 8 (lane i + lane i + 8): the scores' reduction over the heads is 8-wide */
#define KV_HI8(v) _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1))
#define KV_FOLD(v) _mm256_add_ps(_mm512_castps512_ps256(v), KV_HI8(v))
/* 8 lanes twice (the heads of two keys) */
#define KV_DUP8(v) _mm512_castpd_ps(_mm512_insertf64x4(_mm512_castpd256_pd512(_mm256_castps_pd(v)), _mm256_castps_pd(v), 1))
#else
typedef __m256 KT(vec);
#define KV_ZERO() _mm256_setzero_ps()
#define KV_LOAD(p) _mm256_loadu_ps(p)
#define KV_STORE(p, v) _mm256_storeu_ps(p, v)
#define KV_FMA(a, b, c) _mm256_fmadd_ps(a, b, c)
#define KV_SET1(x) _mm256_set1_ps(x)
#define KV_DEC(dc, p, bits, end) dec(dc, p, bits, end)
#define KV_FOLD(v) (v)
#endif
#define KV_CB(bits) ((bits) * KT_W / 8)   /* bytes of KT_W codes */

/* S[jj][HB] = the scores of keys slot[0..n) for the NH heads (pad lanes 0) */
#ifdef KT_SCORES   /* the includer's own scores kernel (AMX tiles) */
KINL void KT(tile_scores)(const unit_in *x, const dec8 *dc, const int64_t *slot, int n, float *S, const int bits,
                          const int NH) {
    (void)dc;
    (void)NH;
    KT_SCORES(x, slot, n, S, bits);
}
#else
KINL void KT(tile_scores)(const unit_in *x, const dec8 *dc, const int64_t *slot, int n, float *S, const int bits,
                          const int NH) {
    const uint8_t *codes = x->k->codes;
    for (int jj = 0; jj < n; jj++) {
        const uint8_t *row = codes + (size_t)slot[jj] * x->rb, *end = row + x->rb;
        if (bits == 8) prefetch_rows(x, slot, jj, n);   /* rows of a cache line or more (4-bit: no gain here) */
        (void)end;   /* read by the 8-wide decoder only */
        int64_t si = slot[jj] * x->ng;
        __m256 sv = _mm256_setzero_ps();
        for (int g = 0; g < x->ng; g++) {
            KT(vec) P[HB];
            __m256 P8[HB];
            _Pragma("GCC unroll 8") for (int h = 0; h < HB; h++) P[h] = KV_ZERO();
            for (int c = g * x->G / KT_W; c < (g + 1) * x->G / KT_W; c++) {
                KT(vec) cv = KV_DEC(dc, row + (size_t)c * KV_CB(bits), bits, end);
                _Pragma("GCC unroll 8") for (int h = 0; h < NH; h++)
                    P[h] = KV_FMA(KV_LOAD(x->qs + (size_t)h * x->hd + c * KT_W), cv, P[h]);
            }
            _Pragma("GCC unroll 8") for (int h = 0; h < HB; h++) P8[h] = KV_FOLD(P[h]);
            __m256 b = _mm256_mul_ps(_mm256_set1_ps(ld_sb(x->k->biases, x->k->sdt, si + g)), _mm256_loadu_ps(x->sq + g * HB));
            sv = _mm256_add_ps(sv, _mm256_fmadd_ps(_mm256_set1_ps(ld_sb(x->k->scales, x->k->sdt, si + g)), reduce8(P8), b));
        }
        _mm256_storeu_ps(S + (size_t)jj * HB, sv);
    }
}
#endif

/* o[h][hd] += sum_jj E[jj][h] s_jg c_j, ob[g][h] += sum_jj E[jj][h] b_jg; W[n][HB] scratch */
KINL void KT(tile_pv)(const unit_in *x, const dec8 *dc, const int64_t *slot, int n, const float *E, float *W, float *o,
                      float *ob, const int bits, const int NH) {
    const uint8_t *codes = x->v->codes;
    for (int g = 0; g < x->ng; g++) {
        __m256 obv = _mm256_loadu_ps(ob + g * HB);
        for (int jj = 0; jj < n; jj++) {
            int64_t si = slot[jj] * x->ng + g;
            __m256 e = _mm256_loadu_ps(E + (size_t)jj * HB);
            _mm256_storeu_ps(W + (size_t)jj * HB, _mm256_mul_ps(e, _mm256_set1_ps(ld_sb(x->v->scales, x->v->sdt, si))));
            obv = _mm256_fmadd_ps(e, _mm256_set1_ps(ld_sb(x->v->biases, x->v->sdt, si)), obv);
        }
        _mm256_storeu_ps(ob + g * HB, obv);
#if KT_W == 16
        if (bits == 4) {   /* 32 dims a pass, o's block in kvq_pair order (the 4-bit decode without its interleave) */
            for (int cb = g * x->G / 32; cb < (g + 1) * x->G / 32; cb++) {
                __m512 lo[HB], hi[HB];
                _Pragma("GCC unroll 8") for (int h = 0; h < NH; h++) {
                    lo[h] = _mm512_loadu_ps(o + (size_t)h * x->hd + 32 * cb);
                    hi[h] = _mm512_loadu_ps(o + (size_t)h * x->hd + 32 * cb + 16);
                }
                for (int jj = 0; jj < n; jj++) {
                    __m512 cl, ch;
                    dec4x32(codes + (size_t)slot[jj] * x->rb + 16 * cb, &cl, &ch);
                    _Pragma("GCC unroll 8") for (int h = 0; h < NH; h++) {
                        __m512 wh = _mm512_set1_ps(W[(size_t)jj * HB + h]);
                        lo[h] = _mm512_fmadd_ps(wh, cl, lo[h]);
                        hi[h] = _mm512_fmadd_ps(wh, ch, hi[h]);
                    }
                }
                _Pragma("GCC unroll 8") for (int h = 0; h < NH; h++) {
                    _mm512_storeu_ps(o + (size_t)h * x->hd + 32 * cb, lo[h]);
                    _mm512_storeu_ps(o + (size_t)h * x->hd + 32 * cb + 16, hi[h]);
                }
            }
            continue;
        }
#endif
        for (int c = g * x->G / KT_W; c < (g + 1) * x->G / KT_W; c++) {
            KT(vec) acc[HB];
            _Pragma("GCC unroll 8") for (int h = 0; h < NH; h++) acc[h] = KV_LOAD(o + (size_t)h * x->hd + c * KT_W);
            for (int jj = 0; jj < n; jj++) {
                const uint8_t *row = codes + (size_t)slot[jj] * x->rb;
                KT(vec) cv = KV_DEC(dc, row + (size_t)c * KV_CB(bits), bits, row + x->rb);
                _Pragma("GCC unroll 8") for (int h = 0; h < NH; h++)
                    acc[h] = KV_FMA(KV_SET1(W[(size_t)jj * HB + h]), cv, acc[h]);
            }
            _Pragma("GCC unroll 8") for (int h = 0; h < NH; h++) KV_STORE(o + (size_t)h * x->hd + c * KT_W, acc[h]);
        }
    }
}

/* one tile: scores, the online-softmax update of m, l, o, ob (vectors over the HB lanes), p.V */
KINL void KT(tile_run)(const unit_in *x, const dec8 *dc, const int64_t *slot, int n, float softcap, float *S, float *W,
                       float *o, float *ob, __m256 *m, __m256 *l, const int bits, const int NH) {
    KT(tile_scores)(x, dc, slot, n, S, bits, NH);
    if (softcap > 0)
        for (int t = 0; t < n * HB; t++) S[t] = be_softcap(S[t], softcap);
    __m256 tm = *m, sum = _mm256_setzero_ps();
    int j2 = 0;   /* 16 lanes: two keys' heads a vector for the max and the exps, the odd key last */
#if KT_W == 16
    __m512 t2 = KV_DUP8(tm);
    for (; j2 + 2 <= n; j2 += 2) t2 = _mm512_max_ps(t2, _mm512_loadu_ps(S + (size_t)j2 * HB));
    tm = _mm256_max_ps(_mm512_castps512_ps256(t2), KV_HI8(t2));
#endif
    for (int jj = j2; jj < n; jj++) tm = _mm256_max_ps(tm, _mm256_loadu_ps(S + (size_t)jj * HB));
    __m256 f = exp8(_mm256_sub_ps(*m, tm));   /* 0 on the first tile (m = -inf) */
    float fs[HB];
    _mm256_storeu_ps(fs, f);
    _Pragma("GCC unroll 8") for (int h = 0; h < NH; h++) {
        __m256 fh = _mm256_set1_ps(fs[h]);
        for (int d = 0; d < x->hd; d += 8)
            _mm256_storeu_ps(o + (size_t)h * x->hd + d, _mm256_mul_ps(fh, _mm256_loadu_ps(o + (size_t)h * x->hd + d)));
    }
    for (int g = 0; g < x->ng; g++) _mm256_storeu_ps(ob + g * HB, _mm256_mul_ps(f, _mm256_loadu_ps(ob + g * HB)));
#if KT_W == 16
    __m512 tm2 = KV_DUP8(tm), s2 = _mm512_setzero_ps();
    for (int jj = 0; jj < j2; jj += 2) {
        __m512 e = exp16(_mm512_sub_ps(_mm512_loadu_ps(S + (size_t)jj * HB), tm2));
        _mm512_storeu_ps(S + (size_t)jj * HB, e);
        s2 = _mm512_add_ps(s2, e);
    }
    sum = KV_FOLD(s2);
#endif
    for (int jj = j2; jj < n; jj++) {
        __m256 e = exp8(_mm256_sub_ps(_mm256_loadu_ps(S + (size_t)jj * HB), tm));
        _mm256_storeu_ps(S + (size_t)jj * HB, e);
        sum = _mm256_add_ps(sum, e);
    }
    *l = _mm256_fmadd_ps(*l, f, sum);
    *m = tm;
    KT(tile_pv)(x, dc, slot, n, S, W, o, ob, bits, NH);
}

/* the kernel for (bits, NH) as a function: the tiles [t0, t1) of one query's ranges r[4] */
#define TILES_FN(name, BITS, NHC)                                                                                 \
    static __attribute__((target(KT_TGT), noinline)) void KT(name)(const unit_in *x, const be_attn *a,           \
        const int32_t *pt, int kh, const int *r, int t0, int t1, float *S, float *W, int64_t *slot, float *o,     \
        float *ob, __m256 *m, __m256 *l, int bits_rt) {                                                          \
        const int bits = BITS ? BITS : bits_rt;                                                                  \
        dec8 dc = dec_init(bits);                                                                                \
        KT_BEGIN(x);                                                                                             \
        for (int g = 0, t = 0; g < 4 && t < t1; g += 2)                                                          \
            for (int j0 = r[g], j1; j0 < r[g + 1] && t < t1; j0 = j1, t++) {                                     \
                j1 = (j0 / BE_KVQ_TILE + 1) * BE_KVQ_TILE;                                                       \
                if (j1 > r[g + 1]) j1 = r[g + 1];                                                                \
                if (t < t0) continue;                                                                            \
                fill_slots(a, pt, kh, j0, j1, slot);                                                             \
                KT(tile_run)(x, &dc, slot, j1 - j0, a->softcap, S, W, o, ob, m, l, bits, NHC);                   \
            }                                                                                                    \
        KT_END();                                                                                                \
    }
TILES_FN(tiles_q4_h8, 4, 8)
TILES_FN(tiles_q4_h4, 4, 4)
TILES_FN(tiles_q4_h1, 4, 1)
TILES_FN(tiles_q8_h8, 8, 8)
TILES_FN(tiles_q8_h4, 8, 4)
TILES_FN(tiles_q8_h1, 8, 1)
#if KT_W == 8   /* other widths: 8 codes are `bits` whole bytes, not 16 */
TILES_FN(tiles_qn_h8, 0, 8)
TILES_FN(tiles_qn_h4, 0, 4)
TILES_FN(tiles_qn_h1, 0, 1)
#endif
#undef TILES_FN
#undef KV_ZERO
#undef KV_LOAD
#undef KV_STORE
#undef KV_FMA
#undef KV_SET1
#undef KV_DEC
#undef KV_FOLD
#undef KV_HI8
#undef KV_DUP8
#undef KV_CB
#undef KINL
#undef KT_BEGIN
#undef KT_END
