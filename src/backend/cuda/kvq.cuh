/*
 * kvq.cuh — reading a quantized KV pool (be_kvq) on the device: the one place
 * the CUDA kernels (kvquant.cu's write and split attention, attention.cu's
 * flash tile loader, affine.cu's weights) know MLX's code packing
 * (src/quant/affine.h).
 *
 * Eight consecutive codes of a row, starting at a multiple of 8, fill exactly
 * `bits` whole bytes of its little-endian bit stream: code m of the eight is
 * bits [m*bits, (m+1)*bits) of those bytes read as one little-endian integer.
 * A row of hd codes is hd*bits/8 bytes, a multiple of 4 (hd % 32 == 0), so
 * rows (and the 2-, 4- and 8-byte runs of 2-, 4- and 8-bit codes) are aligned.
 */
#ifndef CINFER_KVQ_CUH
#define CINFER_KVQ_CUH
#include "backend/cuda/cuda.cuh"

/* the `bits` bytes of codes 8*i .. 8*i+7 of a packed row; BITS > 0: bits known at compile time */
template <int BITS>
__device__ __forceinline__ uint64_t kvq_codes8(const uint8_t *row, int i, int bits) {
    const int nb = BITS ? BITS : bits;
    const uint8_t *p = row + (size_t)i * nb;
    if (nb == 8) { uint2 v = *(const uint2 *)p; return (uint64_t)v.x | ((uint64_t)v.y << 32); }
    if (nb == 4) return *(const uint32_t *)p;
    if (nb == 2) return *(const uint16_t *)p;
    uint64_t v = 0;
    for (int k = 0; k < nb; k++) v |= (uint64_t)p[k] << (8 * k);
    return v;
}

/* the runs of codes 32*blk .. 32*blk+31 (w[u]: codes 8u .. 8u+7 of them), 16-byte loads for 4 and 8 bits */
template <int BITS>
__device__ __forceinline__ void kvq_codes32(const uint8_t *row, int blk, int bits, uint64_t *w) {
    if (BITS == 4) {
        uint4 v = *(const uint4 *)(row + (size_t)blk * 16);
        w[0] = v.x; w[1] = v.y; w[2] = v.z; w[3] = v.w;
    } else if (BITS == 8) {
        const uint4 *p = (const uint4 *)(row + (size_t)blk * 32);
        uint4 a = p[0], b = p[1];
        w[0] = (uint64_t)a.x | (uint64_t)a.y << 32; w[1] = (uint64_t)a.z | (uint64_t)a.w << 32;
        w[2] = (uint64_t)b.x | (uint64_t)b.y << 32; w[3] = (uint64_t)b.z | (uint64_t)b.w << 32;
    } else {
#pragma unroll
        for (int u = 0; u < 4; u++) w[u] = kvq_codes8<BITS>(row, blk * 4 + u, bits);
    }
}

/* code m (0..7) of such a run as a float: the integer's bits under 2^23's exponent, minus 2^23
 * (exact, and cheaper than an integer-to-float conversion) */
template <int BITS>
__device__ __forceinline__ float kvq_code(uint64_t w, int m, int bits) {
    const int nb = BITS ? BITS : bits;
    uint32_t c = (uint32_t)(w >> (m * nb)) & ((1u << nb) - 1u);
    return __uint_as_float(c | 0x4B000000u) - 8388608.0f;
}
#endif
