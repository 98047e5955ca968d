// Device building blocks of the W2 tensor-core expert kernels (moe_w2.cu) and of the tile
// conversion (w2_tiles.cu): where each code of a tile chunk sits (w2_tiles.h), its decoding into
// BF16 MMA fragments, the three-term BF16 split of FP32 activations and the m16n8k16 MMA.
//
// Activations keep FP32 accuracy: x = hi + mid + lo with hi = bf16(x), mid = bf16(x - hi),
// lo = bf16(x - hi - mid) is exact (24 significand bits in three 8-bit pieces), each W2 weight
// (level / 4) is exact in BF16, products are exact and the MMA accumulates in FP32; the three
// partial sums are added per output as (hi + mid) + lo. One MMA column triple per activation
// row, two rows per MMA (columns 6 and 7 are unused).
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
// Register j of a code word is (shifted(word, j) & 0x81008100) | 0x3E803E80 with five registers
// shifted left (j = 0..4: by 0, 2, 4, 6, 8 bits) and three rotated right (j = 5..7: by 2, 4, 6):
// the most left shifts that tile a 32-bit word, since a shift by a power of two can run as an
// integer multiply on the FMA pipe, while rotations and the LOP3 share the integer ALU pipe (half
// the issue rate), which bounds the decoder.
__host__ __device__ constexpr int w2_shift_of(int j) { return j < 5 ? 2 * j : 2 * (j - 4); }
// Where register j's bit with target position t (8 or 15, + 16 for the high half) sits in the word.
__host__ __device__ constexpr int w2_source_bit(int j, int t) {
  return j < 5 ? t - w2_shift_of(j) : (t + w2_shift_of(j)) & 31;
}
__host__ __device__ constexpr int w2_m_bit(int j, int h) { return w2_source_bit(j, 8 + 16 * h); }
__host__ __device__ constexpr int w2_s_bit(int j, int h) { return w2_source_bit(j, 15 + 16 * h); }

// Register j of a code word: two BF16 values level / 4. One LOP3 computes (bits & mask) | base
// only when the two constants come in registers (a LOP3 takes one immediate; written as & and |,
// the compiler emits two instructions).
__device__ __forceinline__ uint32_t w2_decode(uint32_t word, int j) {
  const uint32_t bits = j < 5 ? word * (1u << w2_shift_of(j)) : __funnelshift_r(word, word, w2_shift_of(j));
  uint32_t out;
  asm("lop3.b32 %0, %1, %2, %3, 0xEA;"  // 0xEA: (a & b) | c
      : "=r"(out)
      : "r"(bits), "r"(0x81008100u), "r"(0x3E803E80u));
  return out;
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
