/*
 * gemv-affine-body.h — the affine decode kernel (gemv.h's contract for
 * BE_Q2..BE_Q8) written once for both vector widths: gemv-affine.c (AVX2,
 * 8 lanes) and gemv-affine-avx512.c (16 lanes) each define the names below
 * and include this file once.
 *
 *   AFF_INL             static inline with the includer's target attribute
 *   AFF_W               lanes (codes decoded per step)
 *   aff_v               the f32 vector type
 *   aff_zero(), aff_load(p), aff_fma(a, b, c) (= a*b + c), aff_add(a, b), aff_set1(f), aff_hsum(v)
 *   aff_dec_t, aff_dec_init(bits), aff_dec(&d, p, bits, end)   AFF_W codes at p (AFF_W*bits/8 bytes) as floats
 *   aff_sb(p, dt, i)    element i of an f32/f16/bf16 array (a scale or bias)
 *   AFF_NAME(x)         x with the includer's suffix
 *   optional AFF_DEC4: aff_dec4(p, &even, &odd) decodes the 2 AFF_W 4-bit codes of AFF_W bytes at p as the
 *   even-indexed and the odd-indexed codes' floats, aff_xsplit(x, &even, &odd) splits 2 AFF_W floats the same way
 *   (4-bit rows then take one load and no shuffle a byte pair: the decoder's work per code about halves)
 *
 * y[t][r] = sum over groups g of s[r][g] * sum_i x[t][i] q[r][i] + b[r][g] * sum_i x[t][i]
 * (MLX's quantized_matmul association; f32 accumulation, activations stay f32), the group sums of x
 * computed once per call. Decode runs 4 weight rows per pass (4 independent FMA chains, one x load
 * shared), more tokens 2 rows x 2 tokens; a token's arithmetic does not depend on the others
 * (batch invariance). The rows of a pass are gemv_streams' (gemv.h): 4 (or 2) sequential streams h rows
 * apart, each prefetched AFF_PFD bytes ahead once per 64-byte line of codes.
 */
#define AFF_XS_MAX 4096   /* group sums of x kept on the stack: tokens x groups */
#define AFF_PFD 1024      /* software prefetch distance in each stream (bytes) */

/* the R rows r + a h (a < R) x NT tokens: per group, R*NT accumulators of sum(x*q), then scale and bias */
AFF_INL void AFF_NAME(blk)(const float *x, const float *xs, int64_t ng, const be_mat *w, int64_t r, int64_t h, float *y,
                           int64_t ldy, const int bits, const int R, const int NT, const aff_dec_t *d, const uint8_t *end) {
    int64_t k = w->cols;
    const int G = w->group, step = AFF_W * bits / 8;
    size_t rb = aq_row_bytes(k, bits) * (size_t)h;   /* a row to the next of the pass */
    const uint8_t *row = (const uint8_t *)w->data + (size_t)r * aq_row_bytes(k, bits);
    aff_v acc[4][2];
    float bsum[4][2];
    _Pragma("GCC unroll 4") for (int a = 0; a < R; a++)
        _Pragma("GCC unroll 2") for (int t = 0; t < NT; t++) { acc[a][t] = aff_zero(); bsum[a][t] = 0; }
    for (int64_t g = 0; g < ng; g++) {
        aff_v aq[4][2];
        _Pragma("GCC unroll 4") for (int a = 0; a < R; a++)
            _Pragma("GCC unroll 2") for (int t = 0; t < NT; t++) aq[a][t] = aff_zero();
        const uint8_t *p = row + (size_t)(g * G) * (size_t)bits / 8;
        const float *xg = x + g * G;
#ifdef AFF_DEC4
        if (bits == 4) {   /* 2 AFF_W codes a step: the even codes' and the odd codes' sums apart, x split to match */
            aff_v ao[4][2];
            _Pragma("GCC unroll 4") for (int a = 0; a < R; a++)
                _Pragma("GCC unroll 2") for (int t = 0; t < NT; t++) ao[a][t] = aff_zero();
            for (int i = 0; i < G; i += 2 * AFF_W, p += AFF_W) {
                aff_v qe[4], qo[4];
                if ((((size_t)(g * G + i) / 2) & 63) < (size_t)AFF_W)
                    _Pragma("GCC unroll 4") for (int a = 0; a < R; a++) _mm_prefetch((const char *)p + (size_t)a * rb + AFF_PFD, _MM_HINT_T0);
                _Pragma("GCC unroll 4") for (int a = 0; a < R; a++) aff_dec4(p + (size_t)a * rb, &qe[a], &qo[a]);
                _Pragma("GCC unroll 2") for (int t = 0; t < NT; t++) {
                    aff_v xe, xo;
                    aff_xsplit(xg + (int64_t)t * k + i, &xe, &xo);
                    _Pragma("GCC unroll 4") for (int a = 0; a < R; a++) {
                        aq[a][t] = aff_fma(qe[a], xe, aq[a][t]);
                        ao[a][t] = aff_fma(qo[a], xo, ao[a][t]);
                    }
                }
            }
            _Pragma("GCC unroll 4") for (int a = 0; a < R; a++)
                _Pragma("GCC unroll 2") for (int t = 0; t < NT; t++) aq[a][t] = aff_add(aq[a][t], ao[a][t]);
        } else
#endif
        for (int i = 0; i < G; i += AFF_W, p += step) {
            aff_v q[4];
            if ((((size_t)(g * G + i) * (size_t)bits / 8) & 63) < (size_t)step)   /* each stream, AFF_PFD bytes ahead */
                _Pragma("GCC unroll 4") for (int a = 0; a < R; a++) _mm_prefetch((const char *)p + (size_t)a * rb + AFF_PFD, _MM_HINT_T0);
            _Pragma("GCC unroll 4") for (int a = 0; a < R; a++) q[a] = aff_dec(d, p + (size_t)a * rb, bits, end);
            _Pragma("GCC unroll 2") for (int t = 0; t < NT; t++) {
                aff_v xv = aff_load(xg + (int64_t)t * k + i);
                _Pragma("GCC unroll 4") for (int a = 0; a < R; a++) aq[a][t] = aff_fma(q[a], xv, aq[a][t]);
            }
        }
        _Pragma("GCC unroll 4") for (int a = 0; a < R; a++) {
            int64_t gi = (r + a * h) * ng + g;
            aff_v sv = aff_set1(aff_sb(w->scales, w->sdt, gi));
            float b = aff_sb(w->biases, w->sdt, gi);
            _Pragma("GCC unroll 2") for (int t = 0; t < NT; t++) {
                acc[a][t] = aff_fma(aq[a][t], sv, acc[a][t]);
                bsum[a][t] += b * xs[t * ng + g];
            }
        }
    }
    _Pragma("GCC unroll 4") for (int a = 0; a < R; a++)
        _Pragma("GCC unroll 2") for (int t = 0; t < NT; t++) y[(int64_t)t * ldy + r + a * h] = aff_hsum(acc[a][t]) + bsum[a][t];
}

/* tokens in ones (4 rows at a time: gemv_streams' 4 streams) or pairs (2 rows at a time, 2 streams);
 * xs[t][g] = group sums of x */
AFF_INL void AFF_NAME(rows)(const float *x, const float *xs, int64_t ng, const be_mat *w, int64_t r0, int64_t r1, float *y,
                            int64_t ldy, const int bits, const int NT) {
    const uint8_t *end = (const uint8_t *)w->data + (size_t)w->rows * aq_row_bytes(w->cols, bits);
    aff_dec_t d = aff_dec_init(bits);
    const int S = NT == 1 ? 4 : 2;
    const int64_t h = gemv_streams(r0, r1, S);
    for (int64_t r = r0; r < r0 + h; r++)
        AFF_NAME(blk)(x, xs, ng, w, r, h, y, ldy, bits, S, NT, &d, end);
    for (int64_t r = r0 + S * h; r < r1; r++) AFF_NAME(blk)(x, xs, ng, w, r, 0, y, ldy, bits, 1, NT, &d, end);
}

AFF_INL void AFF_NAME(gemv)(const float *x, int n, const be_mat *w, int64_t r0, int64_t r1, float *y, int64_t ldy, int bits) {
    int64_t k = w->cols, ng = k / w->group;
    if (ng * 2 > AFF_XS_MAX || w->group % AFF_W) {   /* (MLX's groups are 32, 64, 128) */
        gemv_scalar_kernels.gemv[w->dt](x, n, w, r0, r1, y, ldy);
        return;
    }
    float xs[AFF_XS_MAX];
    for (int t0 = 0; t0 < n; t0 += 2) {
        int nt = n - t0 < 2 ? n - t0 : 2;
        const float *xt = x + (int64_t)t0 * k;
        for (int t = 0; t < nt; t++)
            for (int64_t g = 0; g < ng; g++) {
                aff_v a = aff_zero();
                for (int i = 0; i < w->group; i += AFF_W) a = aff_add(a, aff_load(xt + t * k + g * w->group + i));
                xs[t * ng + g] = aff_hsum(a);
            }
        float *yt = y + (int64_t)t0 * ldy;
        if (nt == 1) AFF_NAME(rows)(xt, xs, ng, w, r0, r1, yt, ldy, bits, 1);
        else AFF_NAME(rows)(xt, xs, ng, w, r0, r1, yt, ldy, bits, 2);
    }
}
