// Device building blocks of the W2 tensor-core expert kernels (moe_w2.cu) and of the tile
// conversion (w2_tiles.cu): where each code of a tile chunk sits (w2_layout.h), its decoding into
// BF16 MMA fragments, the three-term BF16 split of FP32 activations and the m16n8k16 MMA.
//
// Activations keep FP32 accuracy: x = hi + mid + lo with hi = bf16(x), mid = bf16(x - hi),
// lo = bf16(x - hi - mid) is exact (24 significand bits in three 8-bit pieces), each W2 weight
// (level times its power-of-two scale) is exact in BF16, products are exact and the MMA
// accumulates in FP32; the three partial sums are added per output as (hi + mid) + lo. One MMA
// column triple per activation row, two rows per MMA (columns 6 and 7 are unused).
#pragma once

#include "kernels/cuda/w2_layout.h"

#include <cuda_bf16.h>

#include <cstdint>

namespace moet::cuda {

// word & mask, opaque to the compiler: written in C, (word & (M >> j)) << j is rewritten as
// (word << j) & M, which costs a separate shift.
__device__ __forceinline__ uint32_t w2_mask(uint32_t word, uint32_t mask) {
  uint32_t out;
  asm("and.b32 %0, %1, %2;" : "=r"(out) : "r"(word), "r"(mask));
  return out;
}

// Register j of a code word (bits as in w2_layout.h), with `base` = the exponent base of its
// halves' scale blocks (w2_word_base) added: the shift and the base in one integer multiply-add
// (on the FMA pipe, while the mask's LOP3 uses the integer ALU pipe). The scale rides in the
// exponent, so the MMAs accumulate scaled products directly (e <= 252 keeps e + 2 a finite
// exponent; e = 0 turns level +-1 into 0 instead of 2^-127).
__device__ __forceinline__ uint32_t w2_decode(uint32_t word, int j, uint32_t base) {
  if (j < 7) return w2_mask(word, 0x81008100u >> j) * (1u << j) + base;
  return w2_mask(word, 0x00010001u) * 256u + base + w2_mask(word, 0x00020002u) * 16384u;
}

// Writes x as three BF16 terms into planes [3][padded] at w2_split_offset(k).
__device__ __forceinline__ void w2_split_store(float x, uint16_t* planes, int64_t padded, int64_t k) {
  const __nv_bfloat16 hi = __float2bfloat16_rn(x);
  const float r1 = x - __bfloat162float(hi);
  const __nv_bfloat16 mid = __float2bfloat16_rn(r1);
  const __nv_bfloat16 lo = __float2bfloat16_rn(r1 - __bfloat162float(mid));
  const int64_t at = w2_split_offset(k);
  planes[at] = __bfloat16_as_ushort(hi);
  planes[padded + at] = __bfloat16_as_ushort(mid);
  planes[2 * padded + at] = __bfloat16_as_ushort(lo);
}

// d += A (16 x 16, BF16) * B (16 x 8, BF16), FP32 accumulators.
__device__ __forceinline__ void mma_bf16_16816(float (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                               uint32_t b0, uint32_t b1) {
  asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

}  // namespace moet::cuda
