/*
 * affine.cu — MLX affine-quantized weights (BE_Q2..BE_Q8, src/quant/affine.h)
 * on the CUDA backend: the upload, the matmul and the embedding gather.
 *
 * Device layout of one matrix (one allocation, m->dev): the packed codes
 * [rows][cols*bits/8], then the scales and the biases [rows][cols/group] in
 * the scale dtype, each part 256-byte aligned (aff_parts).
 *
 * Matmul (same association as the CPU kernels and MLX's quantized_matmul:
 * per group s * sum x*q + b * sum x, f32):
 *   up to AFF_GEMV_N rows, 4 and 8 bits: gemv-affine.cu's k_gemv_aff, inside the
 *     dense GEMV's machinery (persistent grid, q/k/v and gate/up in one launch,
 *     the rmsnorm prologue, the residual add);
 *   up to AFF_GEMV_N rows, 2/3/5/6 bits: k_affine_gemv here, a warp per
 *     weight row, each lane 8 codes at a time (`bits` whole bytes) for every
 *     token, f32 activations;
 *   up to AFF_CHUNKED_N rows: those GEMVs per AFF_GEMV_N rows;
 *   more rows (prefill): the matrix dequantized (s*q + b in f32, rounded to
 *     bf16, or f16 with f16 scales) into a workspace, then the dense cuBLAS
 *     path on activations rounded the same way (what MLX does for a bf16
 *     model: its qmm dequantizes into the activations' dtype).
 * Batch-invariant mode runs every row through the GEMV (cu_op_matmul's chunks
 * of at most GEMV_MAX_N rows).
 */
#include <string.h>
#include "backend/cuda/cuda.cuh"
#include "backend/cuda/kvq.cuh"
#include "backend/cuda/cuda-api.h"
#include "quant/affine.h"

#define AFF_GEMV_N 8      /* rows (tokens) one GEMV launch takes */
#define AFF_CHUNKED_N 32  /* rows up to which the GEMV runs (re-reading the weights per AFF_GEMV_N rows
                             costs less than dequantizing the matrix for cuBLAS: 4 reads of 4.5 bits a
                             weight against one read, a 16-bit write and a 16-bit read) */
#define AFF_WARPS 4       /* weight rows per block */

static size_t up256(size_t x) { return (x + 255) & ~(size_t)255; }

/* bytes of an affine matrix's packed codes and of its scales (as many of biases) */
static void aff_sizes(int64_t rows, int64_t cols, int bits, int group, int sdt, size_t *codes, size_t *scales) {
    *codes = (size_t)rows * aq_row_bytes(cols, bits);
    *scales = (size_t)rows * (size_t)(cols / group) * be_dtype_size((be_dtype)sdt);
}

static void aff_bytes(const be_mat *m, size_t *codes, size_t *scales) {
    aff_sizes(m->rows, m->cols, be_traits(m->dt)->bits, m->group, m->sdt, codes, scales);
}

void cu_affine_parts(const void *base, int64_t rows, int64_t cols, int bits, int group, int sdt, const void **codes,
                     const void **scales, const void **biases) {
    size_t cb, sb;
    aff_sizes(rows, cols, bits, group, sdt, &cb, &sb);
    *codes = base;
    *scales = (const unsigned char *)base + up256(cb);
    *biases = (const unsigned char *)base + up256(cb) + up256(sb);
}

/* the three parts of an affine matrix in one buffer based at base */
static void aff_parts(const be_mat *m, const unsigned char *base, const void **codes, const void **scales, const void **biases) {
    cu_affine_parts(base, m->rows, m->cols, be_traits(m->dt)->bits, m->group, m->sdt, codes, scales, biases);
}

int cu_affine_upload(be_ctx *c, be_mat *m) {
    size_t code_bytes, sb;
    aff_bytes(m, &code_bytes, &sb);
    if (m->cols % 32 || m->group % 8 || m->cols % m->group)
        return cu_check(c, cudaErrorInvalidValue, "affine matrix shape (cols a multiple of 32 and of the group)");
    void *p = NULL;
    if (cu_check(c, cudaMalloc(&p, up256(code_bytes) + 2 * up256(sb)), "weight allocation")) return 1;
    const void *codes, *scales, *biases;
    aff_parts(m, (const unsigned char *)p, &codes, &scales, &biases);
    if (cu_check(c, cudaMemcpy((void *)codes, m->data, code_bytes, cudaMemcpyHostToDevice), "weight upload") ||
        cu_check(c, cudaMemcpy((void *)scales, m->scales, sb, cudaMemcpyHostToDevice), "weight upload") ||
        cu_check(c, cudaMemcpy((void *)biases, m->biases, sb, cudaMemcpyHostToDevice), "weight upload")) {
        cudaFree(p);
        return 1;
    }
    m->dev = p;
    return 0;
}

/* v[0..8) = values 8*ch .. 8*ch+7 of row r, s*q + b in f32 with two roundings (as aq_dequant_row) */
__device__ __forceinline__ void aff_values8(const unsigned char *codes, const void *scales, const void *biases, int sdt, int bits,
                                            int group, int k, int64_t r, int64_t ch, float *v) {
    int64_t g = ch * 8 / group, ng = k / group;
    uint64_t w = kvq_codes8<0>(codes + (size_t)r * aq_row_bytes(k, bits), (int)ch, bits);
    float s = cu_mat_get(scales, sdt, (size_t)(r * ng + g)), b = cu_mat_get(biases, sdt, (size_t)(r * ng + g));
#pragma unroll
    for (int j = 0; j < 8; j++) v[j] = __fadd_rn(__fmul_rn(s, kvq_code<0>(w, j, bits)), b);
}

/* y[t][r] (+= when acc) = sum over chunks of s * sum x*q + b * sum x (+ bias) for NT tokens; a warp per row */
template <int NT>
__global__ void __launch_bounds__(AFF_WARPS * 32) k_affine_gemv(const float *x, const unsigned char *codes, const void *scales,
                                                               const void *biases, int sdt, int bits, int group, int rows, int k,
                                                               const void *bias, int bdt, float *y, int acc) {
    PDL_ENTRY();
    int r = blockIdx.x * AFF_WARPS + threadIdx.x / 32, lane = threadIdx.x & 31;
    if (r >= rows) return;
    const unsigned char *row = codes + (size_t)r * aq_row_bytes(k, bits);
    int ng = k / group;
    float a[NT];
#pragma unroll
    for (int t = 0; t < NT; t++) a[t] = 0.0f;
    for (int64_t ch = lane; ch < k / 8; ch += 32) {
        uint64_t w = kvq_codes8<0>(row, (int)ch, bits);
        int64_t i0 = ch * 8, g = i0 / group;
        float s = cu_mat_get(scales, sdt, (size_t)r * ng + g), b = cu_mat_get(biases, sdt, (size_t)r * ng + g);
        float q[8];
#pragma unroll
        for (int j = 0; j < 8; j++) q[j] = kvq_code<0>(w, j, bits);
#pragma unroll
        for (int t = 0; t < NT; t++) {
            const float4 *xv = (const float4 *)(x + (size_t)t * k + i0);
            float4 x0 = xv[0], x1 = xv[1];
            float sq = x0.x * q[0] + x0.y * q[1] + x0.z * q[2] + x0.w * q[3] + x1.x * q[4] + x1.y * q[5] + x1.z * q[6] + x1.w * q[7];
            float sx = x0.x + x0.y + x0.z + x0.w + x1.x + x1.y + x1.z + x1.w;
            a[t] += s * sq + b * sx;
        }
    }
#pragma unroll
    for (int t = 0; t < NT; t++) {
        float v = a[t];
#pragma unroll
        for (int o = 16; o; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
        if (lane == 0) {
            if (bias) v += cu_mat_get(bias, bdt, r);
            float *yo = y + (size_t)t * rows + r;
            *yo = acc ? *yo + v : v;
        }
    }
}

/* out[rows][k] (bf16, or f16 when f16) = s*q + b, one thread per 8 values (one 16-byte store) */
__global__ void k_affine_dequant(const unsigned char *codes, const void *scales, const void *biases, int sdt, int bits, int group,
                                 int rows, int k, void *out, int f16) {
    PDL_ENTRY();
    int64_t nch = (int64_t)rows * (k / 8);
    for (int64_t e = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; e < nch; e += (int64_t)gridDim.x * blockDim.x) {
        float v[8];
        aff_values8(codes, scales, biases, sdt, bits, group, k, e / (k / 8), e % (k / 8), v);
        __align__(16) unsigned short h[8];
#pragma unroll
        for (int j = 0; j < 8; j++) {
            if (f16) { __half hv = __float2half_rn(v[j]); memcpy(&h[j], &hv, 2); }
            else { __nv_bfloat16 bv = __float2bfloat16_rn(v[j]); memcpy(&h[j], &bv, 2); }
        }
        ((uint4 *)out)[e] = *(const uint4 *)h;
    }
}

/* out[t][0..k) = row ids[t] of the matrix, s*q + b in f32 */
__global__ void k_affine_embed(const unsigned char *codes, const void *scales, const void *biases, int sdt, int bits, int group, int k,
                               const void *ids, int keys, int n, float *out) {
    PDL_ENTRY();
    int64_t nch = (int64_t)n * (k / 8);
    for (int64_t e = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; e < nch; e += (int64_t)gridDim.x * blockDim.x) {
        int64_t t = e / (k / 8), ch = e % (k / 8);
        aff_values8(codes, scales, biases, sdt, bits, group, k, cu_id_at(ids, keys, t), ch, out + t * k + ch * 8);
    }
}

/* records: p[0] x or ids, p[1..3] codes/scales/biases, p[4] y/out, p[5] bias; i[0] n, i[1] rows, i[2] k,
 * i[3] bits, i[4] group, i[5] sdt, i[6] bias dtype, i[7] acc / f16 */
static void l_affine_gemv(be_ctx *c, const cu_rec *r) {
    int n = (int)r->i[0], rows = (int)r->i[1], k = (int)r->i[2], bits = (int)r->i[3], group = (int)r->i[4], sdt = (int)r->i[5];
    dim3 grid((unsigned)((rows + AFF_WARPS - 1) / AFF_WARPS)), block(AFF_WARPS * 32);
#define AG(NT) cu_launch(c, k_affine_gemv<NT>, grid, block, 0, (const float *)r->p[0], (const unsigned char *)r->p[1], r->p[2], \
                         r->p[3], sdt, bits, group, rows, k, r->p[5], (int)r->i[6], (float *)r->p[4], (int)r->i[7])
    switch (n) {
    case 1: AG(1); break;
    case 2: AG(2); break;
    case 3: AG(3); break;
    case 4: AG(4); break;
    case 5: AG(5); break;
    case 6: AG(6); break;
    case 7: AG(7); break;
    default: AG(8); break;
    }
#undef AG
    CU_LAUNCHED(c, "gemv (affine)");
}

static void l_affine_dequant(be_ctx *c, const cu_rec *r) {
    int64_t nch = r->i[1] * (r->i[2] / 8);
    unsigned g = (unsigned)((nch + 255) / 256);
    cu_launch(c, k_affine_dequant, dim3(g > 132 * 32 ? 132 * 32 : g), dim3(256), 0, (const unsigned char *)r->p[1], r->p[2], r->p[3],
              (int)r->i[5], (int)r->i[3], (int)r->i[4], (int)r->i[1], (int)r->i[2], (void *)r->p[4], (int)r->i[7]);
    CU_LAUNCHED(c, "dequantize (affine)");
}

static void l_affine_embed(be_ctx *c, const cu_rec *r) {
    int64_t nch = r->i[0] * (r->i[2] / 8);
    unsigned g = (unsigned)((nch + 255) / 256);
    cu_launch(c, k_affine_embed, dim3(g > 65535 ? 65535 : g), dim3(256), 0, (const unsigned char *)r->p[1], r->p[2], r->p[3],
              (int)r->i[5], (int)r->i[3], (int)r->i[4], (int)r->i[2], r->p[0], (int)r->i[8], (int)r->i[0], (float *)r->p[4]);
    CU_LAUNCHED(c, "embed (affine)");
}

static void aff_rec(cu_rec *r, const be_mat *w, int n) {
    memset(r, 0, sizeof *r);
    aff_parts(w, (const unsigned char *)w->dev, &r->p[1], &r->p[2], &r->p[3]);
    r->i[0] = n;
    r->i[1] = w->rows;
    r->i[2] = w->cols;
    r->i[3] = be_traits(w->dt)->bits;
    r->i[4] = w->group;
    r->i[5] = w->sdt;
}

void cu_affine_matmul(be_ctx *c, const float *x, int n, const be_mat *w, const be_mat *bias, float *y, int acc) {
    cu_rec r;
    if (n > AFF_GEMV_N && n <= AFF_CHUNKED_N) {   /* a few decode rows: the GEMV per AFF_GEMV_N of them */
        for (int r0 = 0; r0 < n; r0 += AFF_GEMV_N)
            cu_matmul_op(c, x + (size_t)r0 * w->cols, n - r0 < AFF_GEMV_N ? n - r0 : AFF_GEMV_N, w, bias, y + (size_t)r0 * w->rows, acc);
        return;
    }
    if (n <= AFF_GEMV_N) {
        aff_rec(&r, w, n);
        r.fn = l_affine_gemv;
        r.p[0] = x;
        r.p[4] = y;
        r.p[5] = bias ? bias->dev : NULL;
        r.i[6] = bias ? bias->dt : 0;
        r.i[7] = acc;
        cu_submit(c, &r);
        return;
    }
    /* prefill: dequantize into the workspace, then the dense 16-bit path */
    int f16 = w->sdt == BE_F16;
    if (!cu_ensure(c, &c->deq, &c->deq_n, (size_t)w->rows * w->cols * 2)) return;
    aff_rec(&r, w, n);
    r.fn = l_affine_dequant;
    r.p[4] = c->deq;
    r.i[7] = f16;
    cu_submit(c, &r);
    be_mat d = *w;
    d.dev = c->deq;
    d.dt = f16 ? BE_F16 : BE_BF16;
    d.scales = d.biases = NULL;
    d.group = 0;
    cu_matmul_op(c, x, n, &d, bias, y, acc);
}

void cu_affine_embed(be_ctx *c, const be_mat *tab, const int32_t *ids, int n, float *out) {
    cu_rec r;
    aff_rec(&r, tab, n);
    r.fn = l_affine_embed;
    int keys;
    r.p[0] = cu_ids(c, ids, n, &keys);
    r.p[4] = out;
    r.i[8] = keys;
    if (r.p[0]) cu_submit(c, &r);
}

/* random affine weights for benchmarks (cuda-api.h): random code bits, scales and biases that give
 * weights of mean about 0 and standard deviation about std */
extern "C" int cuda_fill_random_affine(const be_mat *m, uint64_t seed, float std) {
    size_t cb, sb;
    aff_bytes(m, &cb, &sb);
    const void *codes, *scales, *biases;
    aff_parts(m, (const unsigned char *)m->dev, &codes, &scales, &biases);
    float top = (float)((1 << be_traits(m->dt)->bits) - 1), s = std * 3.4641016f / top;   /* codes uniform: sd top / sqrt(12) */
    size_t ns = sb / be_dtype_size(m->sdt);
    return cuda_fill_random((void *)codes, BE_F32, cb / 4, seed, 0.0f, 1.0f) ||
           cuda_fill_random((void *)scales, m->sdt, ns, seed + 7919, s, 0.1f * s) ||
           cuda_fill_random((void *)biases, m->sdt, ns, seed + 104729, -0.5f * top * s, 0.05f * top * s);
}
