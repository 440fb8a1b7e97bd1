/*
 * gemv-sweep.cu — decode GEMV variants on the H200, to choose the layout of
 * src/backend/cuda/gemm.cu's k_gemv from measurements rather than guesses.
 *
 * y[m] = W[m][k] . x[k], W bf16 row-major, x/y f32. Every variant streams W
 * with 16-byte non-allocating loads; they differ in loads in flight per lane
 * (U), warps per row (KS, partial sums meet in shared memory), blocks per SM
 * of a persistent grid (BPS) and whether a grid-dependent launch prefetches
 * its first rows into L2 before waiting on the kernel before it (PRE).
 * Each shape is timed over NCOPY copies of W taken in turn (as the layers of
 * a model are), so a matrix that fits in L2 is not served from it.
 * Also measured: a pure read kernel and a device-to-device copy (the
 * bandwidth ceilings), and a "layer sequence" — the four GEMVs of each of 32
 * llama-3-8b layers, with a small dependent kernel between them, captured as
 * a graph with programmatic dependent launch — the shape of a decode step.
 *
 * build: nvcc -O3 -arch=sm_90a -o gemv-sweep bench/gpu/gemv-sweep.cu
 * usage: gemv-sweep   (prints one line per shape and variant: us, GB/s)
 */
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>
#include <vector>

#define CK(x) do { cudaError_t e_ = (x); if (e_ != cudaSuccess) { fprintf(stderr, "%s:%d %s\n", __FILE__, __LINE__, cudaGetErrorString(e_)); exit(1); } } while (0)

__device__ __forceinline__ uint4 ld_stream(const uint4 *p) {
    uint4 r;
    asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];" : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w) : "l"(p));
    return r;
}
__device__ __forceinline__ float dot8(uint4 q, const float *x) {
    float4 a = *(const float4 *)x, b = *(const float4 *)(x + 4);
    return __uint_as_float(q.x << 16) * a.x + __uint_as_float(q.x & 0xffff0000u) * a.y + __uint_as_float(q.y << 16) * a.z +
           __uint_as_float(q.y & 0xffff0000u) * a.w + __uint_as_float(q.z << 16) * b.x + __uint_as_float(q.z & 0xffff0000u) * b.y +
           __uint_as_float(q.w << 16) * b.z + __uint_as_float(q.w & 0xffff0000u) * b.w;
}
__device__ __forceinline__ void pdl_wait() { asm volatile("griddepcontrol.wait;" ::: "memory"); }
__device__ __forceinline__ void pdl_trigger() { asm volatile("griddepcontrol.launch_dependents;" ::: "memory"); }

/* persistent grid over groups of 8/KS rows; KS warps share a row */
template <int U, int KS, int BPS, int PRE>
__global__ void __launch_bounds__(256, BPS) k_gemv(const __nv_bfloat16 *W, const float *x, float *y, int m, int k, int trig_first) {
    __shared__ float part[2][8];
    if (trig_first) pdl_trigger();
    int warp = threadIdx.x / 32, lane = threadIdx.x & 31, rpg = 8 / KS, seg = warp % KS;
    int nv = k / 8, slice = nv / KS, ngroups = (m + rpg - 1) / rpg;
    uint4 pre[U];   /* PRE 2: the first U loads of the block's first row, into registers, before the wait */
    int have = 0;
    if (PRE == 2) {
        int row = blockIdx.x * rpg + warp / KS, j = seg * slice + lane;
        if (blockIdx.x < ngroups && row < m && j + 32 * (U - 1) < (seg + 1) * slice) {
            const uint4 *wr = (const uint4 *)(W + (size_t)row * k);
#pragma unroll
            for (int u = 0; u < U; u++) pre[u] = ld_stream(wr + j + 32 * u);
            have = 1;
        }
    }
    if (PRE == 1) {   /* this block's first group, into L2, before the inputs are ready */
        int row = blockIdx.x * rpg + warp / KS;
        if (row < m) {
            const char *p = (const char *)(W + (size_t)row * k) + (size_t)seg * slice * 16;
            for (int o = lane * 128; o < slice * 16; o += 32 * 128) asm volatile("prefetch.global.L2 [%0];" ::"l"(p + o));
        }
    }
    pdl_wait();
    if (!trig_first) pdl_trigger();
    int buf = 0;
    for (int grp = blockIdx.x; grp < ngroups; grp += gridDim.x, buf ^= 1) {
        int row = grp * rpg + warp / KS;
        float acc = 0.0f;
        if (row < m) {
            const uint4 *wr = (const uint4 *)(W + (size_t)row * k);
            int j = seg * slice + lane, jend = (seg + 1) * slice;
            for (; j + 32 * (U - 1) < jend; j += 32 * U) {
                uint4 q[U];
#pragma unroll
                for (int u = 0; u < U; u++) q[u] = have ? pre[u] : ld_stream(wr + j + 32 * u);
                have = 0;
#pragma unroll
                for (int u = 0; u < U; u++) acc += dot8(q[u], x + (size_t)(j + 32 * u) * 8);
            }
            for (; j < jend; j += 32) acc += dot8(ld_stream(wr + j), x + (size_t)j * 8);
        }
#pragma unroll
        for (int o = 16; o; o >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, o);
        if (KS > 1) {
            if (lane == 0) part[buf][warp] = acc;
            __syncthreads();
            if (seg == 0 && lane == 0)
                for (int s = 1; s < KS; s++) acc += part[buf][warp + s];
        }
        if (row < m && seg == 0 && lane == 0) y[row] = acc;
    }
}

/* the pure read ceiling: every byte once, 16-byte loads, U in flight */
__global__ void k_read(const uint4 *p, size_t n, unsigned *sink) {
    unsigned a = 0;
    size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x, st = (size_t)gridDim.x * blockDim.x;
    for (; i + 3 * st < n; i += 4 * st) {
        uint4 q0 = ld_stream(p + i), q1 = ld_stream(p + i + st), q2 = ld_stream(p + i + 2 * st), q3 = ld_stream(p + i + 3 * st);
        a ^= q0.x ^ q1.y ^ q2.z ^ q3.w;
    }
    for (; i < n; i += st) a ^= ld_stream(p + i).x;
    if (a == 0x12345678u) *sink = a;
}

/* a small dependent op between GEMVs (as rmsnorm/rope/attention are) */
__global__ void k_small(float *x, int n, int trig_first) {
    if (trig_first) pdl_trigger();
    pdl_wait();
    if (!trig_first) pdl_trigger();
    for (int i = threadIdx.x; i < n; i += blockDim.x) x[i] = x[i] * 0.999f + 1e-6f;
}

typedef void (*gemv_fn)(const __nv_bfloat16 *, const float *, float *, int, int, int);
struct variant { const char *name; gemv_fn fn; int bps; };
#define V(U, KS, BPS, PRE) {"U" #U " KS" #KS " BPS" #BPS " PRE" #PRE, k_gemv<U, KS, BPS, PRE>, BPS}
static const variant VARIANTS[] = {
    V(4, 2, 4, 0),   /* the kernel in the backend today (k 4096: 2 warps per row) */
    V(4, 1, 4, 0), V(8, 1, 2, 0), V(8, 1, 3, 0), V(8, 1, 4, 0), V(16, 1, 1, 0), V(16, 1, 2, 0),
    V(8, 2, 2, 0), V(8, 2, 4, 0), V(4, 4, 4, 0), V(8, 4, 2, 0), V(2, 1, 8, 0), V(4, 1, 8, 0),
};

static int n_sm;

template <typename... K, typename... A>
static void pdl_launch(void (*fn)(K...), unsigned grid, cudaStream_t s, int pdl, A... args) {
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = dim3(grid);
    cfg.blockDim = dim3(256);
    cfg.stream = s;
    cudaLaunchAttribute at[1];
    at[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    at[0].val.programmaticStreamSerializationAllowed = 1;
    cfg.attrs = at;
    cfg.numAttrs = pdl;
    CK(cudaLaunchKernelEx(&cfg, fn, args...));
}

static void launch(const variant &v, const __nv_bfloat16 *W, const float *x, float *y, int m, int k, cudaStream_t s, int pdl, int trig = 1) {
    pdl_launch(v.fn, (unsigned)(n_sm * v.bps), s, pdl, W, x, y, m, k, trig);
}

static void launch_small(float *x, cudaStream_t s, int trig) { pdl_launch(k_small, 1, s, 1, x, 4096, trig); }

int main(int argc, char **argv) {
    int only_seq = argc > 1;
    CK(cudaDeviceGetAttribute(&n_sm, cudaDevAttrMultiProcessorCount, 0));
    cudaStream_t s;
    CK(cudaStreamCreate(&s));
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    float ms;
    /* ceilings */
    size_t big = (size_t)4 << 30;
    void *a, *b;
    unsigned *sink;
    CK(cudaMalloc(&a, 4 * big));   /* 16 GiB: 32 layers of 8b weights (14 GB) for the sequence */
    CK(cudaMalloc(&b, big));
    CK(cudaMalloc(&sink, 4));
    CK(cudaMemset(a, 0x3c, 4 * big));
    for (int r = 0; r < 3; r++) {
        CK(cudaEventRecord(e0, s));
        CK(cudaMemcpyAsync(b, a, big, cudaMemcpyDeviceToDevice, s));
        CK(cudaEventRecord(e1, s));
        CK(cudaEventSynchronize(e1));
        CK(cudaEventElapsedTime(&ms, e0, e1));
        printf("ceiling copy 4 GiB: %.0f GB/s (read + written)\n", 2.0 * big / ms / 1e6);
    }
    for (int g = 1; g <= 8; g *= 2)
        for (int r = 0; r < 2; r++) {
            CK(cudaEventRecord(e0, s));
            k_read<<<n_sm * g * 2, 512, 0, s>>>((const uint4 *)a, big / 16, sink);
            CK(cudaEventRecord(e1, s));
            CK(cudaEventSynchronize(e1));
            CK(cudaEventElapsedTime(&ms, e0, e1));
            printf("ceiling read 4 GiB (%d blocks of 512): %.0f GB/s\n", n_sm * g * 2, (double)big / ms / 1e6);
        }
    CK(cudaFree(b));
    /* shapes: m x k, copies so that NCOPY * size >= 256 MB */
    struct { const char *name; int m, k; } shapes[] = {
        {"8b qkv", 6144, 4096}, {"8b o", 4096, 4096}, {"8b gate+up", 28672, 4096}, {"8b down", 4096, 14336}, {"8b head", 128256, 4096},
        {"1b qkv", 3072, 2048}, {"1b o", 2048, 2048}, {"1b gate+up", 16384, 2048}, {"1b down", 2048, 8192},
    };
    float *x, *y;
    CK(cudaMalloc(&x, 16384 * 4 * 4));
    CK(cudaMalloc(&y, 131072 * 4));
    CK(cudaMemset(x, 0, 16384 * 16));
    for (auto &sh : shapes) {
        if (only_seq) break;
        size_t bytes = (size_t)sh.m * sh.k * 2;
        int ncopy = (int)((((size_t)512 << 20) + bytes - 1) / bytes);
        if ((size_t)ncopy * bytes > big) ncopy = (int)(big / bytes);
        const __nv_bfloat16 *W = (const __nv_bfloat16 *)a;
        for (const variant &v : VARIANTS) {
            int reps = ncopy * (bytes < (64u << 20) ? 8 : 2);
            for (int i = 0; i < ncopy; i++) launch(v, W + (size_t)i * sh.m * sh.k, x, y, sh.m, sh.k, s, 0);
            CK(cudaEventRecord(e0, s));
            for (int i = 0; i < reps; i++) launch(v, W + (size_t)(i % ncopy) * sh.m * sh.k, x, y, sh.m, sh.k, s, 0);
            CK(cudaEventRecord(e1, s));
            CK(cudaEventSynchronize(e1));
            CK(cudaEventElapsedTime(&ms, e0, e1));
            double us = ms * 1e3 / reps;
            printf("%-11s %-18s %8.1f us %6.0f GB/s\n", sh.name, v.name, us, bytes / us / 1e3);
        }
    }
    /* the layer sequence: 32 x (small, qkv, small, o, small, gate+up, small, down), graph + PDL */
    struct { int m, k; } seq[4] = {{6144, 4096}, {4096, 4096}, {28672, 4096}, {4096, 14336}};
    size_t layer = 0;
    for (auto &q : seq) layer += (size_t)q.m * q.k;
    float *xs;
    CK(cudaMalloc(&xs, 4096 * 4));
    CK(cudaMemset(xs, 0, 4096 * 4));
    const variant seqv[] = {V(8, 1, 2, 0), V(8, 1, 2, 2), V(16, 1, 2, 0), V(16, 1, 2, 2), V(8, 1, 3, 2), V(4, 1, 4, 2)};
    for (int trig = 0; trig < 1; trig++)
    for (int small = 0; small < 4; small += 1 + (small > 0))
        for (const variant &v : seqv) {
            cudaGraph_t g;
            cudaGraphExec_t ge;
            CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
            for (int l = 0; l < 32; l++) {
                const __nv_bfloat16 *W = (const __nv_bfloat16 *)a + (size_t)l * layer;
                for (auto &q : seq) {
                    for (int i = 0; i < small; i++) launch_small(xs, s, trig);
                    launch(v, W, x, y, q.m, q.k, s, 1, trig);
                    W += (size_t)q.m * q.k;
                }
            }
            CK(cudaStreamEndCapture(s, &g));
            CK(cudaGraphInstantiate(&ge, g, 0));
            CK(cudaGraphLaunch(ge, s));
            CK(cudaEventRecord(e0, s));
            for (int r = 0; r < 5; r++) CK(cudaGraphLaunch(ge, s));
            CK(cudaEventRecord(e1, s));
            CK(cudaEventSynchronize(e1));
            CK(cudaEventElapsedTime(&ms, e0, e1));
            double us = ms * 1e3 / 5;
            printf("sequence 8b x32 trigger-%s +%d small %-18s %8.1f us %6.0f GB/s\n", trig ? "first" : "after", small, v.name, us, 32.0 * layer * 2 / us / 1e3);
            CK(cudaGraphExecDestroy(ge));
            CK(cudaGraphDestroy(g));
        }
    CK(cudaDeviceSynchronize());
    return 0;
}
