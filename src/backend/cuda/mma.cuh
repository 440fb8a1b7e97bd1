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
/* A operands of values v[4] of row r: cols 2c, 2c+1 (v[0], v[1]) and 2c+8, 2c+9 (v[2], v[3]):
 * a[] = hi in rows 0-7 and mid in rows 8-15, al[] = lo in rows 0-7 and zeros */
template <typename KT>
__device__ __forceinline__ void mma_a_split(const float *v, uint32_t *a, uint32_t *al) {
    uint32_t h[4], m[4], l[4];
#pragma unroll
    for (int t = 0; t < 4; t++) mma_split3<KT>(v[t], &h[t], &m[t], &l[t]);
    a[0] = h[0] | h[1] << 16;
    a[1] = m[0] | m[1] << 16;
    a[2] = h[2] | h[3] << 16;
    a[3] = m[2] | m[3] << 16;
    al[0] = l[0] | l[1] << 16;
    al[1] = 0;
    al[2] = l[2] | l[3] << 16;
    al[3] = 0;
}

#endif
