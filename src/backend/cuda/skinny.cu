/*
 * skinny.cu — y[n][m] = x[n][k] . w[m][k]^T for 2..64 rows of x on 16-bit
 * weights: the batched decode step of many sequences, where the weights are
 * read once for all rows and the matmul is bound by that read.
 *
 * cuBLAS runs these shapes at about half the copy bandwidth (decode steps of
 * 8 rows: 6.3 ms against 4.2 for one row on the GEMV, llama-3-8b). This
 * kernel streams the weights as the GEMV does and multiplies on the tensor
 * cores (mma.sync m16n8k16, f32 accumulation). A block of 8 warps owns 128
 * output features (16 per warp) and a slice of k; x's columns are staged in
 * shared memory 128 at a time (cp.async, double-buffered), so each staged
 * column serves 128 features — staging x per 16 features instead (the first
 * version) read x from L2 twice as often as the weights at 32 rows, and ran
 * at a third of the copy bandwidth. Per 32 columns a lane loads one 16-byte
 * run of 8 consecutive weights of rows g and g+8 (g = lane/4) and the same 8
 * columns of token g of each 8-token tile. A dot product does not depend on
 * the order of its terms, so the lane's 8 columns stand in for the four k
 * indices the mma fragment layout gives the lane (2t, 2t+1, 2t+8, 2t+9;
 * t = lane%4) in two mma steps: A and B use the same stand-ins, which is all
 * the layout requires. When the row tiles alone would not fill the GPU, k is
 * split among blocks; the last slice to finish adds the partial sums in slice
 * order (deterministic) and applies bias and the residual add (acc).
 *
 * x arrives rounded to the weights' dtype (act16), exactly what cuBLAS is
 * given, so the two paths differ only in the order of f32 additions.
 * Up to 3 matrices of one k share a launch (q/k/v, gate/up).
 */
#include <string.h>
#include "backend/cuda/cuda.cuh"

#define SK_WARPS 8
#define SK_ROWS (SK_WARPS * 16)   /* output features per block: 16 per warp */
#define SK_KC 128                 /* columns of x staged in shared memory at a time */
#define SK_XS (SK_KC + 32)        /* staged row stride (elements): 320 bytes, so a quarter-warp's 16-byte reads
                                   * (2 tokens x 4 column runs) fall in distinct banks */

typedef struct sk_set {
    const void *w[3];
    const void *bias[3];
    float *y[3];
    int m[3], bdt[3], tiles[3];
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

/* x columns [col, col + SK_KC) of the n tokens into a staging buffer, 16 bytes per copy, asynchronously */
template <int NT>
__device__ __forceinline__ void sk_stage(uint16_t (*xs)[SK_XS], const uint16_t *x, int n, int k, int col) {
    for (int i = threadIdx.x; i < n * (SK_KC / 8); i += blockDim.x) {
        int tok = i / (SK_KC / 8), seg = i % (SK_KC / 8);
        unsigned dst = (unsigned)__cvta_generic_to_shared(&xs[tok][seg * 8]);
        asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(dst), "l"(x + (size_t)tok * k + col + seg * 8));
    }
    asm volatile("cp.async.commit_group;");
}

/* the 8 16-byte runs a lane multiplies in chunk ci: rows g and g+8, four 32-column steps */
__device__ __forceinline__ void sk_loadw(uint4 (*wv)[2], const uint4 *wr0, const uint4 *wr1, int ci, int active) {
    if (!active) return;
#pragma unroll
    for (int s4 = 0; s4 < 4; s4++) {
        wv[s4][0] = sk_ld_stream(wr0 + (size_t)ci * (SK_KC / 8) + s4 * 4);
        wv[s4][1] = sk_ld_stream(wr1 + (size_t)ci * (SK_KC / 8) + s4 * 4);
    }
}

/* chunk ci of [c0, c1): stage the next chunk's x, wait for this one's, multiply */
template <int NT, bool BF>
__device__ __forceinline__ void sk_chunk(float (*acc)[4], const uint4 (*wv)[2], uint16_t (*xs)[NT * 8][SK_XS], const uint16_t *x, int n,
                                         int k, int ci, int c0, int c1, int g, int t, int active) {
    const int buf = (ci - c0) & 1;
    if (ci + 1 < c1) {
        sk_stage<NT>(xs[buf ^ 1], x, n, k, (ci + 1) * SK_KC);
        asm volatile("cp.async.wait_group 1;" ::: "memory");
    } else {
        asm volatile("cp.async.wait_group 0;" ::: "memory");
    }
    __syncthreads();
    if (active)
#pragma unroll
        for (int s4 = 0; s4 < 4; s4++)
#pragma unroll
            for (int nt = 0; nt < NT; nt++) {
                uint4 xv = *(const uint4 *)&xs[buf][nt * 8 + g][s4 * 32 + 8 * t];
                sk_mma<BF>(acc[nt], wv[s4][0].x, wv[s4][1].x, wv[s4][0].y, wv[s4][1].y, xv.x, xv.y);
                sk_mma<BF>(acc[nt], wv[s4][0].z, wv[s4][1].z, wv[s4][0].w, wv[s4][1].w, xv.z, xv.w);
            }
    __syncthreads();   /* buffer buf is staged again two chunks on */
}

/* x: [n][k] 16-bit; k % SK_KC == 0; every m % 16 == 0. Block b: row tile b / nsplit (SK_ROWS
 * features of one matrix), column slice b % nsplit of k. With nsplit > 1 the slices' partial sums
 * go to part and the last slice to finish (a self-resetting counter in cnt) adds them in slice
 * order and writes y. */
template <int NT, bool BF>
__global__ void __launch_bounds__(SK_WARPS * 32) k_skinny(sk_set st, const uint16_t *x, int n, int k, int nsplit, float *part, int *cnt) {
    __shared__ __align__(16) uint16_t xs[2][NT * 8][SK_XS];
    __shared__ int last;
    const int tile = blockIdx.x / nsplit, sp = blockIdx.x % nsplit;
    /* this tile's matrix (fields picked by constant indices: a runtime index would copy st to local memory) */
    int t0 = tile, m = st.m[0], bdt = st.bdt[0];
    const void *wv0 = st.w[0], *bias = st.bias[0];
    float *y = st.y[0];
#pragma unroll
    for (int i = 1; i < 3; i++)
        if (i < st.count && t0 >= st.tiles[i - 1]) {
            t0 -= st.tiles[i - 1];
            m = st.m[i], bdt = st.bdt[i], wv0 = st.w[i], bias = st.bias[i], y = st.y[i];
        } else break;
    const int row0 = t0 * SK_ROWS;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    const int rw = row0 + warp * 16, active = rw < m;   /* m % 16 == 0: a warp's 16 rows exist or none does */
    const uint16_t *w = (const uint16_t *)wv0;
    const uint4 *wr0 = (const uint4 *)(w + (size_t)(active ? rw + g : 0) * k + 8 * t);
    const uint4 *wr1 = wr0 + (size_t)8 * k / 8;
    const int chunks = k / SK_KC, per = (chunks + nsplit - 1) / nsplit, c0 = sp * per, c1 = min(chunks, c0 + per);
    float acc[NT][4];
#pragma unroll
    for (int nt = 0; nt < NT; nt++) acc[nt][0] = acc[nt][1] = acc[nt][2] = acc[nt][3] = 0.0f;
    /* token rows past n read zeros */
    for (int i = threadIdx.x; i < (NT * 8 - n) * SK_XS; i += blockDim.x) {
        xs[0][n + i / SK_XS][i % SK_XS] = 0;
        xs[1][n + i / SK_XS][i % SK_XS] = 0;
    }
    PDL_ENTRY();
    /* the weights of a chunk are loaded into registers while the chunk before it is multiplied */
    uint4 wa[4][2], wb[4][2];
    if (c0 < c1) {
        sk_stage<NT>(xs[0], x, n, k, c0 * SK_KC);
        sk_loadw(wa, wr0, wr1, c0, active);
    }
    for (int ci = c0; ci < c1; ci += 2) {
        if (ci + 1 < c1) sk_loadw(wb, wr0, wr1, ci + 1, active);
        sk_chunk<NT, BF>(acc, wa, xs, x, n, k, ci, c0, c1, g, t, active);
        if (ci + 1 >= c1) break;
        if (ci + 2 < c1) sk_loadw(wa, wr0, wr1, ci + 2, active);
        sk_chunk<NT, BF>(acc, wb, xs, x, n, k, ci + 1, c0, c1, g, t, active);
    }
    if (nsplit == 1) {
        if (!active) return;
#pragma unroll
        for (int nt = 0; nt < NT; nt++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                int row = rw + g + (e >> 1) * 8, tok = nt * 8 + 2 * t + (e & 1);
                if (tok >= n) continue;
                float v = acc[nt][e] + (bias ? cu_mat_get(bias, bdt, row) : 0.0f);
                float *d = y + (size_t)tok * m + row;
                *d = st.acc ? *d + v : v;
            }
        return;
    }
    float *mine = part + (size_t)blockIdx.x * n * SK_ROWS;   /* [n][SK_ROWS] */
    if (active)
#pragma unroll
        for (int nt = 0; nt < NT; nt++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                int r = warp * 16 + g + (e >> 1) * 8, tok = nt * 8 + 2 * t + (e & 1);
                if (tok < n) mine[(size_t)tok * SK_ROWS + r] = acc[nt][e];
            }
    __threadfence();
    __syncthreads();
    if (threadIdx.x == 0) last = atomicAdd(&cnt[tile], 1) == nsplit - 1;
    __syncthreads();
    if (!last) return;
    __threadfence();
    const float *all = part + (size_t)tile * nsplit * n * SK_ROWS;
    for (int i = threadIdx.x; i < n * SK_ROWS; i += blockDim.x) {
        int tok = i / SK_ROWS, row = row0 + i % SK_ROWS;
        if (row >= m) continue;
        float v = 0.0f;
        for (int s2 = 0; s2 < nsplit; s2++) v += __ldcg(all + (size_t)s2 * n * SK_ROWS + i);
        v += bias ? cu_mat_get(bias, bdt, row) : 0.0f;
        float *d = y + (size_t)tok * m + row;
        *d = st.acc ? *d + v : v;
    }
    if (threadIdx.x == 0) cnt[tile] = 0;
}

int cu_skinny_ok(const be_ctx *c, int n, int count, const be_mat *const *w) {
    if (!c->skinny || c->batch_inv || n < 2 || n > 64 || count < 1 || count > 3) return 0;
    for (int i = 0; i < count; i++)
        if (w[i]->dt == BE_F32 || w[i]->cols != w[0]->cols || w[i]->dt != w[0]->dt || w[i]->rows % 16 || !w[i]->dev) return 0;
    return w[0]->cols % SK_KC == 0;
}

template <int NT>
static void sk_launch(be_ctx *c, int bf, sk_set st, const uint16_t *x, int n, int k, int nsplit) {
    int tiles = 0;
    for (int i = 0; i < st.count; i++) tiles += st.tiles[i];
    dim3 grid((unsigned)(tiles * nsplit)), block(SK_WARPS * 32);
    if (bf) cu_launch(c, k_skinny<NT, true>, grid, block, 0, st, x, n, k, nsplit, c->part, c->cnt);
    else cu_launch(c, k_skinny<NT, false>, grid, block, 0, st, x, n, k, nsplit, c->part, c->cnt);
}

/* the column slices per row tile: enough blocks to fill the GPU (CINFER_CUDA_SKINNY_BLOCKS, default
 * 2 per SM), at most one per staged chunk */
static int sk_nsplit(const be_ctx *c, int tiles, int k) {
    int want = c->skinny_blocks > 0 ? c->skinny_blocks : 2 * c->n_sm, chunks = k / SK_KC;
    int ns = (want + tiles - 1) / tiles;
    ns = ns < 1 ? 1 : ns > chunks ? chunks : ns;
    int per = (chunks + ns - 1) / ns;
    return (chunks + per - 1) / per;   /* no empty slice */
}

/* record: p[0] x (f32), p[1..3] w, p[4..6] bias, p[7..9] y, p[10] act16; i[0] n, i[1] k, i[2] dt,
 * i[3] count, i[4..6] m, i[7..9] bias dt, i[10] acc, i[11] act16 already holds x rounded, i[12] column slices */
void cu_skinny_launcher(be_ctx *c, const cu_rec *r) {
    int n = (int)r->i[0], k = (int)r->i[1], bf = r->i[2] == BE_BF16;
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
        st.tiles[i] = (st.m[i] + SK_ROWS - 1) / SK_ROWS;
    }
    int nsplit = (int)r->i[12];
    if (!r->i[11] && cu_round16(c, (const float *)r->p[0], (void *)r->p[10], bf, (size_t)n * k)) return;
    const uint16_t *x = (const uint16_t *)r->p[10];
    if (n <= 8) sk_launch<1>(c, bf, st, x, n, k, nsplit);
    else if (n <= 16) sk_launch<2>(c, bf, st, x, n, k, nsplit);
    else if (n <= 32) sk_launch<4>(c, bf, st, x, n, k, nsplit);
    else sk_launch<8>(c, bf, st, x, n, k, nsplit);
    CU_LAUNCHED(c, "skinny matmul");
}

/* the workspace a launch of count matrices over n rows needs (split partials, counters), grown
 * now (outside a graph's capture); the column slices it will use, or 0 on an allocation failure */
int cu_skinny_prepare(be_ctx *c, int n, int count, const be_mat *const *w) {
    int tiles = 0, k = (int)w[0]->cols;
    for (int i = 0; i < count; i++) tiles += (int)((w[i]->rows + SK_ROWS - 1) / SK_ROWS);
    int ns = sk_nsplit(c, tiles, k);
    if (ns > 1) {
        size_t had = c->cnt_n;
        if (!cu_ensure(c, (void **)&c->part, &c->part_n, (size_t)tiles * ns * n * SK_ROWS * sizeof(float))) return 0;
        if (!cu_ensure(c, (void **)&c->cnt, &c->cnt_n, (size_t)tiles * sizeof(int))) return 0;
        if (c->cnt_n != had && cu_check(c, cudaMemsetAsync(c->cnt, 0, c->cnt_n, c->stream), "counter reset")) return 0;
    }
    return ns;
}
