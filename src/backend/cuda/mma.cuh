/*
 * mma.cuh — the tensor-core and asynchronous-copy building blocks the
 * kernels share (flash attention, the folded LM head of the score op):
 * 16-byte cp.async into shared memory, ldmatrix of four 8x8 b16 tiles, and
 * mma.sync m16n8k16 with f32 accumulation on f16 or bf16 operands.
 * Fragment layouts: PTX ISA, "Matrix fragments for mma.m16n8k16".
 */
#ifndef CINFER_CUDA_MMA_CUH
#define CINFER_CUDA_MMA_CUH
#include <stdint.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>

__device__ __forceinline__ void mma16816(float *d, const uint32_t *a, uint32_t b0, uint32_t b1) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
__device__ __forceinline__ void mma16816_bf16(float *d, const uint32_t *a, uint32_t b0, uint32_t b1) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

/* d = a b (the accumulator's first product: no zeroing pass) */
__device__ __forceinline__ void mma16816_bf16_z(float *d, const uint32_t *a, uint32_t b0, uint32_t b1) {
    const float z = 0.0f;
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%10,%10,%10,%10};"
                 : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1), "f"(z));
}

__device__ __forceinline__ void cp_async16(void *smem, const void *gmem) {
    uint32_t a = (uint32_t)__cvta_generic_to_shared(smem);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(a), "l"(gmem) : "memory");
}
/* ok 0: the 16 bytes are zeros (nothing read from gmem) */
__device__ __forceinline__ void cp_async16_zf(void *smem, const void *gmem, int ok) {
    uint32_t a = (uint32_t)__cvta_generic_to_shared(smem);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(a), "l"(gmem), "r"(ok ? 16 : 0) : "memory");
}
/* N = 4, 8 or 16 bytes through L1 (sizes under 16 need .ca); ok 0: zeros */
template <int N>
__device__ __forceinline__ void cp_async_ca(void *smem, const void *gmem, int ok) {
    uint32_t a = (uint32_t)__cvta_generic_to_shared(smem);
    asm volatile("cp.async.ca.shared.global [%0], [%1], %2, %3;" ::"r"(a), "l"(gmem), "n"(N), "r"(ok ? N : 0) : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
template <int N> __device__ __forceinline__ void cp_async_wait() { asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory"); }

/* four 8x8 tiles of 16-bit values: lanes 8i..8i+7 give the row addresses of tile i */
__device__ __forceinline__ void ldsm_x4(uint32_t *r, const void *p) {
    uint32_t a = (uint32_t)__cvta_generic_to_shared(p);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(a));
}
__device__ __forceinline__ void ldsm_x4_t(uint32_t *r, const void *p) {
    uint32_t a = (uint32_t)__cvta_generic_to_shared(p);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(a));
}
/* f32 values as sums of 16-bit operands (decode attention's exact-to-f32 products on tensor cores): */
template <typename KT> struct mma_t;
template <> struct mma_t<__nv_bfloat16> {
    static __device__ __forceinline__ uint32_t bits(float x, float *r) {
        __nv_bfloat16 h = __float2bfloat16_rn(x);
        *r = __bfloat162float(h);
        return __bfloat16_as_ushort(h);
    }
    static __device__ __forceinline__ void mma(float *d, const uint32_t *a, uint32_t b0, uint32_t b1) { mma16816_bf16(d, a, b0, b1); }
};
template <> struct mma_t<__half> {
    static __device__ __forceinline__ uint32_t bits(float x, float *r) {
        __half h = __float2half_rn(x);
        *r = __half2float(h);
        return __half_as_ushort(h);
    }
    static __device__ __forceinline__ void mma(float *d, const uint32_t *a, uint32_t b0, uint32_t b1) { mma16816(d, a, b0, b1); }
};
/* x = hi + mid + lo (each of KT) */
template <typename KT>
__device__ __forceinline__ void mma_split3(float x, uint32_t *hi, uint32_t *mid, uint32_t *lo) {
    float r;
    *hi = mma_t<KT>::bits(x, &r);
    x -= r;
    *mid = mma_t<KT>::bits(x, &r);
    x -= r;
    *lo = mma_t<KT>::bits(x, &r);
}
/* the three parts of values v[4] of row r (cols 2c, 2c+1, 2c+8, 2c+9) as packed pairs: p[0] hi, p[1] mid,
 * p[2] lo; p[i][0] cols 2c, 2c+1, p[i][1] cols 2c+8, 2c+9 */
template <typename KT>
__device__ __forceinline__ void mma_a_parts(const float *v, uint32_t (*p)[2]) {
    uint32_t x[3][4];
#pragma unroll
    for (int t = 0; t < 4; t++) mma_split3<KT>(v[t], &x[0][t], &x[1][t], &x[2][t]);
#pragma unroll
    for (int i = 0; i < 3; i++) {
        p[i][0] = x[i][0] | x[i][1] << 16;
        p[i][1] = x[i][2] | x[i][3] << 16;
    }
}
/* A operands of v[4]: a[] = hi in rows 0-7 and mid in rows 8-15, al[] = lo in rows 0-7 and zeros */
template <typename KT>
__device__ __forceinline__ void mma_a_split(const float *v, uint32_t *a, uint32_t *al) {
    uint32_t p[3][2];
    mma_a_parts<KT>(v, p);
    a[0] = p[0][0]; a[1] = p[1][0]; a[2] = p[0][1]; a[3] = p[1][1];
    al[0] = p[2][0]; al[1] = 0; al[2] = p[2][1]; al[3] = 0;
}
/* ... all three in one operand for rows of at most 4 values (decode's g <= 4): a lane of rows 0-3 gives hi
 * (rows 0-3) and mid (rows 8-11), one of rows 4-7 (lo_rows) the lo of row r - 4 (rows 4-7) and zeros */
template <typename KT>
__device__ __forceinline__ void mma_a_pack(const float *v, int lo_rows, uint32_t *a) {
    uint32_t p[3][2];
    mma_a_parts<KT>(v, p);
    a[0] = lo_rows ? p[2][0] : p[0][0];
    a[1] = lo_rows ? 0u : p[1][0];
    a[2] = lo_rows ? p[2][1] : p[0][1];
    a[3] = lo_rows ? 0u : p[1][1];
}

/* wgmma (sm_90a): a warpgroup (4 warps) computes a 64 x N tile asynchronously. A comes from registers:
 * each warp's 16 rows as the m16n8k16 A fragment (a[0]: row g, k 2t..2t+1; a[1]: row g + 8; a[2], a[3]: k + 8;
 * g = lane / 4, t = lane % 4); B (N rows of 16 k, k contiguous) through a shared-memory descriptor of the
 * 128-byte swizzle: rows of 128 bytes (64 bf16), 16-byte chunk c of row r at chunk c ^ (r % 8), the
 * 8-row atoms 1024 bytes apart, the atom 1024-byte aligned; a k step of 16 within the row advances the
 * start by 32 bytes. The accumulator of n8 block j: d[4j], d[4j+1] row g cols 8j + 2t, +1; d[4j+2], d[4j+3]
 * row g + 8 (the m16n8 layout, warp w's rows 16w..16w+15). PTX ISA, "Asynchronous Warpgroup Level Matrix
 * Multiply-Accumulate". */
__device__ __forceinline__ uint64_t wg_desc_sw128(const void *smem) {
    uint32_t a = (uint32_t)__cvta_generic_to_shared(smem);
    return (uint64_t)((a & 0x3FFFFu) >> 4) | (uint64_t)1 << 16 | (uint64_t)(1024 >> 4) << 32 | (uint64_t)1 << 62;
}
__device__ __forceinline__ void wg_fence() { asm volatile("wgmma.fence.sync.aligned;" ::: "memory"); }
__device__ __forceinline__ void wg_commit() { asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory"); }
template <int N> __device__ __forceinline__ void wg_wait() { asm volatile("wgmma.wait_group.sync.aligned %0;" ::"n"(N) : "memory"); }
/* cp.async / st.shared writes made visible to the async proxy (wgmma's operand reads) */
__device__ __forceinline__ void fence_proxy_async() { asm volatile("fence.proxy.async.shared::cta;" ::: "memory"); }
/* the compiler may not move reads or writes of v across this point (an accumulator of a wgmma in flight) */
__device__ __forceinline__ void wg_reg_fence(float &v) { asm volatile("" : "+f"(v)::"memory"); }

/* d[N / 2] = a b (acc 0) or d + a b, m64nNk16, bf16 in, f32 accumulation (N = 32, 64) */
template <int N> __device__ __forceinline__ void wgmma_bf16(float *d, const uint32_t *a, uint64_t bdesc, int acc);
template <> __device__ __forceinline__ void wgmma_bf16<32>(float *d, const uint32_t *a, uint64_t bdesc, int acc) {
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %21, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 {%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15}, "
                 "{%16,%17,%18,%19}, %20, p, 1, 1, 0;\n}\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(bdesc), "r"(acc));
}
template <> __device__ __forceinline__ void wgmma_bf16<64>(float *d, const uint32_t *a, uint64_t bdesc, int acc) {
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31}, "
                 "{%32,%33,%34,%35}, %36, p, 1, 1, 0;\n}\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(bdesc), "r"(acc));
}

#endif
