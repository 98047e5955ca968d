// Where each weight and activation of a W2 tile chunk sits for the tensor-core expert kernels
// (moe_w2.cu, moe_w2_prefill.cu; the tiles themselves: w2_tiles.h). Index arithmetic only, for
// the kernels, the tile conversion and host tests alike.
//
// A lane's 16 code bytes of a chunk are four words; word w holds the A fragments of the two
// m16n8k16 k-steps 2w and 2w + 1 (eight registers j of two BF16 halves h). The MMA's reduction
// index k within a k-step is free to stand for any column as long as the activations (the B
// fragments) use the same map, so every register pairs two scale blocks: its low halves come
// from block w / 2 and its high halves from block w / 2 + 2. The exponent base a register needs
// (w2_mma.cuh) is then one shift and one mask of the row's four scale bytes for two blocks at
// once. Invariant: w2_fragment_pos and w2_split_offset put the same column under the same k of
// the same k-step, and each covers a chunk's 16 x 128 weights (128 columns) exactly once.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace moet::cuda {

struct W2FragmentPos {
  int row, col;  // within the tile (0..15) and the chunk (0..127)
};

// The scale block (0..3) of a chunk whose exponents half h of word w's registers carry.
__host__ __device__ constexpr int w2_half_block(int w, int h) { return w / 2 + 2 * h; }

// Column within its scale block of k-step `step` (0, 1) of word w, lane column c (0..3), A
// register pair r = 0 (k = 2c, 2c + 1) or 1 (k = 2c + 8, 2c + 9): one of 32, each exactly once.
__host__ __device__ constexpr int w2_block_col(int w, int step, int c, int r) {
  return 16 * (w % 2) + 8 * step + 2 * c + r;
}

// Lane `lane`'s word w, register j (0..7: k-step j / 4, A register j % 4), half h of one chunk.
__host__ __device__ inline W2FragmentPos w2_fragment_pos(int lane, int w, int j, int h) {
  const int g = lane >> 2, c = lane & 3, step = j >> 2, i = j & 3;
  return {g + 8 * (i & 1), 32 * w2_half_block(w, h) + w2_block_col(w, step, c, i >> 1)};
}

// Offset (in BF16 elements) of column k inside one split activation plane: per chunk and word,
// four 16-byte groups (one per lane column c), each the B fragments of the word's two k-steps
// (b0 then b1 of step 0, then of step 1; a register's low half first).
__host__ __device__ inline int64_t w2_split_offset(int64_t k) {
  const int in_chunk = int(k & 127), block = in_chunk >> 5, u = in_chunk & 31;
  const int h = block >> 1, w = 2 * (block & 1) + (u >> 4), step = (u >> 3) & 1, c = (u >> 1) & 3, r = u & 1;
  return (((k >> 7) * 16 + w * 4 + c) * 8) + step * 4 + r * 2 + h;
}

// Register j of a code word holds two BF16 weights (w2_mma.cuh: w2_decode); per half, bit 8 is m
// (|level| = 4: exponent + 2) and bit 15 is s (negative). Registers 0..6 take their four bits
// from the word masked by 0x81008100 >> j and shifted left by j; seven is the most that left
// shifts of that mask can tile, so register 7 takes m from bits 0 and 16 (shifted by 8) and s from
// bits 1 and 17 (shifted by 14). Where register j's bit with target position t (8 or 15, + 16 for
// the high half) sits in the word:
__host__ __device__ constexpr int w2_source_bit(int j, int t) {
  return j < 7 ? t - j : (t % 16 == 8 ? t - 8 : t - 14);
}
__host__ __device__ constexpr int w2_m_bit(int j, int h) { return w2_source_bit(j, 8 + 16 * h); }
__host__ __device__ constexpr int w2_s_bit(int j, int h) { return w2_source_bit(j, 15 + 16 * h); }

// The exponent base of word w's registers for one row, whose four scale bytes (blocks 0..3) are
// `bytes`: block w / 2's byte e as a BF16 exponent (bits 7..14) in the low half, block w / 2 + 2's
// in the high half (bits 23..30).
__host__ __device__ constexpr uint32_t w2_word_base(uint32_t bytes, int w) {
  return (w < 2 ? bytes << 7 : bytes >> 1) & 0x7F807F80u;
}

}  // namespace moet::cuda
