/*
 * skinny.cu — y[n][m] = x[n][k] . w[m][k]^T for 2..64 rows of x on 16-bit
 * weights: the batched decode step of many sequences, where the weights are
 * read once for all rows and the matmul is bound by that read.
 *
 * cuBLAS runs these shapes at about half the copy bandwidth (decode steps of
 * 8 rows: 6.3 ms against 4.2 for one row on the GEMV, llama-3-8b). This
 * kernel streams the weights as the GEMV does and multiplies on the tensor
 * cores (mma.sync m16n8k16, f32 accumulation): a block of 8 warps owns
 * 16*MT output features and splits k among its warps; a warp loads, per 32
 * columns, one 16-byte run of 8 consecutive weights per lane and row (rows
 * g and g+8 of each 16-row tile, g = lane/4) and the same 8 columns of x for
 * token g of each 8-token tile. A dot product does not depend on the order
 * of its terms, so the lane's 8 columns stand in for the four k indices the
 * mma fragment layout gives the lane (2t, 2t+1, 2t+8, 2t+9; t = lane%4) in
 * two mma steps — A and B use the same stand-ins, which is all the layout
 * requires. The warps' partial sums are added in warp order in shared
 * memory (deterministic), then bias and the residual add (acc) are applied.
 *
 * x arrives rounded to the weights' dtype (act16), exactly what cuBLAS is
 * given, so the two paths differ only in the order of f32 additions.
 * Up to 3 matrices of one k share a launch (q/k/v, gate/up).
 */
#include <string.h>
#include "backend/cuda/cuda.cuh"

#define SK_WARPS 8

typedef struct sk_set {
    const void *w[3];
    const void *bias[3];
    float *y[3];
    int m[3], bdt[3], blocks[3];
    int count, acc;
} sk_set;

__device__ __forceinline__ uint4 sk_ld_stream(const uint4 *p) {
    uint4 r;
    asm("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];" : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w) : "l"(p));
    return r;
}

template <bool BF>
__device__ __forceinline__ void sk_mma(float *c, unsigned a0, unsigned a1, unsigned a2, unsigned a3, unsigned b0, unsigned b1) {
    if (BF)
        asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
                     : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                     : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
    else
        asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
                     : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                     : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

/* U blocks of 32 columns from column block s on: all weight loads first (U*MT*2 16-byte loads in
 * flight per lane), then per block the x fragments and 2*MT*NT mma */
template <int MT, int NT, bool BF, int U>
__device__ __forceinline__ void sk_steps(float (*acc)[NT][4], const uint4 *const (*wr)[2], const uint4 *const *xr, int nx, int s) {
    uint4 wv[U][MT][2];
#pragma unroll
    for (int u = 0; u < U; u++)
#pragma unroll
        for (int mt = 0; mt < MT; mt++)
#pragma unroll
            for (int h = 0; h < 2; h++) wv[u][mt][h] = sk_ld_stream(wr[mt][h] + (size_t)(s + u) * 4);
#pragma unroll
    for (int u = 0; u < U; u++) {
        uint4 xv[NT];
#pragma unroll
        for (int nt = 0; nt < NT; nt++) xv[nt] = nt < nx ? __ldg(xr[nt] + (size_t)(s + u) * 4) : make_uint4(0, 0, 0, 0);
#pragma unroll
        for (int mt = 0; mt < MT; mt++)
#pragma unroll
            for (int nt = 0; nt < NT; nt++) {
                sk_mma<BF>(acc[mt][nt], wv[u][mt][0].x, wv[u][mt][1].x, wv[u][mt][0].y, wv[u][mt][1].y, xv[nt].x, xv[nt].y);
                sk_mma<BF>(acc[mt][nt], wv[u][mt][0].z, wv[u][mt][1].z, wv[u][mt][0].w, wv[u][mt][1].w, xv[nt].z, xv[nt].w);
            }
    }
}

/* x: [n][k] 16-bit; k % (32 * SK_WARPS) == 0; every m % 16 == 0 */
template <int MT, int NT, bool BF>
__global__ void __launch_bounds__(SK_WARPS * 32) k_skinny(sk_set st, const uint16_t *x, int n, int k) {
    constexpr int R = MT * 16, U = MT == 4 ? 1 : 8 / MT;
    __shared__ float red[NT * 8 * R];   /* [token][row] */
    /* this block's matrix (fields picked by constant indices: a runtime index would copy st to local memory) */
    int b = blockIdx.x, m = st.m[0], bdt = st.bdt[0];
    const void *wv0 = st.w[0], *bias = st.bias[0];
    float *y = st.y[0];
#pragma unroll
    for (int i = 1; i < 3; i++)
        if (i < st.count && b >= st.blocks[i - 1]) {
            b -= st.blocks[i - 1];
            m = st.m[i], bdt = st.bdt[i], wv0 = st.w[i], bias = st.bias[i], y = st.y[i];
        } else break;
    const int row0 = b * R;
    const uint16_t *w = (const uint16_t *)wv0;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    const int ks = k / SK_WARPS, kb = warp * ks + 8 * t;
    const uint4 *wr[MT][2];
#pragma unroll
    for (int mt = 0; mt < MT; mt++)
#pragma unroll
        for (int h = 0; h < 2; h++) {
            int row = row0 + mt * 16 + h * 8 + g;
            wr[mt][h] = (const uint4 *)(w + (size_t)(row < m ? row : m - 1) * k + kb);
        }
    const uint4 *xr[NT];
    int nx = 0;   /* the token tiles whose row g exists: tile nt reads x only when nt < nx... */
#pragma unroll
    for (int nt = 0; nt < NT; nt++) {
        int tok = nt * 8 + g;
        xr[nt] = (const uint4 *)(x + (size_t)(tok < n ? tok : 0) * k + kb);
        if (tok < n) nx = nt + 1;
    }
    float acc[MT][NT][4];
#pragma unroll
    for (int mt = 0; mt < MT; mt++)
#pragma unroll
        for (int nt = 0; nt < NT; nt++) acc[mt][nt][0] = acc[mt][nt][1] = acc[mt][nt][2] = acc[mt][nt][3] = 0.0f;
    PDL_ENTRY();
    const int steps = ks / 32;
    int s = 0;
    for (; s + U <= steps; s += U) sk_steps<MT, NT, BF, U>(acc, wr, xr, nx, s);
    for (; s < steps; s++) sk_steps<MT, NT, BF, 1>(acc, wr, xr, nx, s);
    /* ...rows of a tile past n read token 0 and are never stored */
    for (int wi = 0; wi < SK_WARPS; wi++) {
        if (warp == wi) {
#pragma unroll
            for (int mt = 0; mt < MT; mt++)
#pragma unroll
                for (int nt = 0; nt < NT; nt++)
#pragma unroll
                    for (int e = 0; e < 4; e++) {
                        int row = mt * 16 + g + (e >> 1) * 8, tok = nt * 8 + 2 * t + (e & 1);
                        float *d = &red[tok * R + row];
                        *d = wi ? *d + acc[mt][nt][e] : acc[mt][nt][e];
                    }
        }
        __syncthreads();
    }
    for (int i = threadIdx.x; i < n * R; i += blockDim.x) {
        int tok = i / R, r = i % R, row = row0 + r;
        if (row >= m) continue;
        float v = red[i] + (bias ? cu_mat_get(bias, bdt, row) : 0.0f);
        float *d = y + (size_t)tok * m + row;
        *d = st.acc ? *d + v : v;
    }
}

int cu_skinny_ok(const be_ctx *c, int n, int count, const be_mat *const *w) {
    if (!c->skinny || c->batch_inv || n < 2 || n > 64 || count < 1 || count > 3) return 0;
    for (int i = 0; i < count; i++)
        if (w[i]->dt == BE_F32 || w[i]->cols != w[0]->cols || w[i]->dt != w[0]->dt || w[i]->rows % 16 || !w[i]->dev) return 0;
    return w[0]->cols % (32 * SK_WARPS) == 0;
}

template <int MT, int NT>
static void sk_launch(be_ctx *c, int bf, sk_set st, const uint16_t *x, int n, int k) {
    int total = 0;
    for (int i = 0; i < st.count; i++) total += st.blocks[i] = (st.m[i] + MT * 16 - 1) / (MT * 16);
    if (bf) cu_launch(c, k_skinny<MT, NT, true>, dim3(total), dim3(SK_WARPS * 32), 0, st, x, n, k);
    else cu_launch(c, k_skinny<MT, NT, false>, dim3(total), dim3(SK_WARPS * 32), 0, st, x, n, k);
}

template <int NT>
static void sk_pick_mt(be_ctx *c, int bf, sk_set st, const uint16_t *x, int n, int k, int rows) {
    /* more features per block reuse each x fragment more; fewer keep enough blocks in flight.
     * MT * NT <= 16 keeps the accumulators in 64 registers. */
    int want = c->skinny_blocks > 0 ? c->skinny_blocks : 2 * c->n_sm;
    if (NT <= 4 && rows / 64 >= want) sk_launch<4, NT>(c, bf, st, x, n, k);
    else if (rows / 32 >= want) sk_launch<2, NT>(c, bf, st, x, n, k);
    else sk_launch<1, NT>(c, bf, st, x, n, k);
}

/* record: p[0] x (f32), p[1..3] w, p[4..6] bias, p[7..9] y, p[10] act16; i[0] n, i[1] k, i[2] dt,
 * i[3] count, i[4..6] m, i[7..9] bias dt, i[10] acc, i[11] act16 already holds x rounded */
void cu_skinny_launcher(be_ctx *c, const cu_rec *r) {
    int n = (int)r->i[0], k = (int)r->i[1], bf = r->i[2] == BE_BF16, rows = 0;
    sk_set st;
    memset(&st, 0, sizeof st);
    st.count = (int)r->i[3];
    st.acc = (int)r->i[10];
    for (int i = 0; i < st.count; i++) {
        st.w[i] = r->p[1 + i];
        st.bias[i] = r->p[4 + i];
        st.y[i] = (float *)r->p[7 + i];
        st.m[i] = (int)r->i[4 + i];
        st.bdt[i] = (int)r->i[7 + i];
        rows += st.m[i];
    }
    if (!r->i[11] && cu_round16(c, (const float *)r->p[0], (void *)r->p[10], bf, (size_t)n * k)) return;
    const uint16_t *x = (const uint16_t *)r->p[10];
    if (n <= 8) sk_pick_mt<1>(c, bf, st, x, n, k, rows);
    else if (n <= 16) sk_pick_mt<2>(c, bf, st, x, n, k, rows);
    else if (n <= 32) sk_pick_mt<4>(c, bf, st, x, n, k, rows);
    else sk_pick_mt<8>(c, bf, st, x, n, k, rows);
    CU_LAUNCHED(c, "skinny matmul");
}
