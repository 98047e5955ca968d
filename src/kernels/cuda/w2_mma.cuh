// Device building blocks of the W2 tensor-core expert kernels (moe_w2.cu) and of the tile
// conversion (w2_tiles.cu): where each code of a tile chunk sits (w2_tiles.h), its decoding into
// BF16 MMA fragments, the three-term BF16 split of FP32 activations and the m16n8k16 MMA.
//
// Activations keep FP32 accuracy: x = hi + mid + lo with hi = bf16(x), mid = bf16(x - hi),
// lo = bf16(x - hi - mid) is exact (24 significand bits in three 8-bit pieces), each W2 weight
// (level times its power-of-two scale) is exact in BF16, products are exact and the MMA
// accumulates in FP32; the three partial sums are added per output as (hi + mid) + lo. One MMA
// column triple per activation row, two rows per MMA (columns 6 and 7 are unused).
#pragma once

#include <cuda_bf16.h>

#include <cstdint>

namespace moet::cuda {

struct W2FragmentPos {
  int row, col;  // within the tile (0..15) and the chunk (0..127)
};

// Lane `lane`'s word q, register j (0..7: k-step j / 4, A register j % 4), half h of one chunk.
__host__ __device__ inline W2FragmentPos w2_fragment_pos(int lane, int q, int j, int h) {
  const int g = lane >> 2, c = lane & 3, step = j >> 2, i = j & 3;
  return {g + 8 * (i & 1), 32 * q + 16 * step + 2 * c + 8 * (i >> 1) + h};
}
// Register j of a code word holds two BF16 weights level * 2^(e - 127) of one row (e: the row's
// UE8M0 scale byte of this block): per BF16 half, bit 8 is m (|level| = 4: exponent + 2) and bit
// 15 is s (negative), added to `base` = the exponent e in both halves. Registers 0..6 take their
// four bits from the word masked by 0x81008100 >> j and shifted left by j (one LOP3 and one
// integer multiply-add: the shift and the base in one IMAD, on the FMA pipe, while the LOP3 uses
// the integer ALU pipe); seven is the most that left shifts of that mask can tile, so register 7
// takes m from bits 0 and 16 (shifted by 8) and s from bits 1 and 17 (shifted by 14). The scale
// rides in the exponent, so the MMAs accumulate scaled products directly (e <= 252 keeps e + 2 a
// finite exponent; e = 0 turns level +-1 into 0 instead of 2^-127).
// Where register j's bit with target position t (8 or 15, + 16 for the high half) sits in the word.
__host__ __device__ constexpr int w2_source_bit(int j, int t) {
  return j < 7 ? t - j : (t % 16 == 8 ? t - 8 : t - 14);
}
__host__ __device__ constexpr int w2_m_bit(int j, int h) { return w2_source_bit(j, 8 + 16 * h); }
__host__ __device__ constexpr int w2_s_bit(int j, int h) { return w2_source_bit(j, 15 + 16 * h); }

// The base of scale block q (byte q of `bytes`): its exponent e in both BF16 halves (bits 7..14
// and 23..30).
__device__ __forceinline__ uint32_t w2_block_base(uint32_t bytes, int q) {
  return __byte_perm(bytes, 0u, 0x4040u | uint32_t(q) | uint32_t(q) << 8) * 128u;
}

// word & mask, opaque to the compiler: written in C, (word & (M >> j)) << j is rewritten as
// (word << j) & M, which costs a separate shift.
__device__ __forceinline__ uint32_t w2_mask(uint32_t word, uint32_t mask) {
  uint32_t out;
  asm("and.b32 %0, %1, %2;" : "=r"(out) : "r"(word), "r"(mask));
  return out;
}

// Register j of a code word, scaled by the block whose base is given.
__device__ __forceinline__ uint32_t w2_decode(uint32_t word, int j, uint32_t base) {
  if (j < 7) return w2_mask(word, 0x81008100u >> j) * (1u << j) + base;
  return w2_mask(word, 0x00010001u) * 256u + base + w2_mask(word, 0x00020002u) * 16384u;
}

// Offset (in BF16 elements) of column k inside one split activation plane: per scale block, four
// 16-byte groups (one per lane column c), each the B fragments of the block's two k-steps.
__host__ __device__ inline int64_t w2_split_offset(int64_t k) {
  const int kk = int(k & 31), step = kk >> 4, r = kk & 15;
  const int c = (r & 7) >> 1, pos = (r >> 3) * 2 + (r & 1);
  return ((k >> 5) * 4 + c) * 8 + step * 4 + pos;
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
