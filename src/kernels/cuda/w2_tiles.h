// The device layout of W2 expert matrices read by the tensor-core expert kernels (moe_w2.cu).
// A W2 matrix [rows, cols] (docs/formats.md: 2-bit codes, levels {-4, -1, +1, +4}, one UE8M0
// scale per 32 columns) is cut into tiles of 16 rows x 128 columns (cols padded to a multiple of
// 128, tiles to a multiple of kW2TileBlock with padding rows). One record of 576 bytes per (tile,
// chunk): 512 code bytes, lane l's 16 bytes being exactly its A fragments of eight m16n8k16 BF16
// MMAs (word w = k-steps 2w and 2w + 1, whose registers pair scale blocks w / 2 and w / 2 + 2:
// w2_layout.h), then 64 scale bytes [8 groups g][rows g, g + 8][4 blocks] (the 8 bytes the lanes
// of group g need). Records run
// (block of kW2TileBlock tiles, chunk, tile in the block): a kernel streaming a block's tiles
// side by side reads one contiguous run of memory.
// Each code becomes two bits of a 32-bit word: m (|level| = 4) and s (negative), placed so that
// a shift and a mask of the word put them at bits 8 and 15 of a BF16 half, and adding the scale
// byte e there as an exponent gives the weight level * 2^(e - 127) exactly (w2_mma.cuh:
// w2_decode). Scale bytes are the UE8M0 bytes as loaded; bytes >= 253 (scales >= 2^126, whose
// level-4 weights would leave the exponent range) are rejected at conversion.
// Rows of gate_up tiles interleave: tile t rows 0-7 = gate rows 8t..8t+7, rows 8-15 = the up rows
// of the same columns, so one lane holds gate and up of its column (SiLU-and-mul in registers).
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

namespace moet::cuda {

constexpr int64_t kW2TileRows = 16, kW2ChunkCols = 128, kW2ChunkCodeBytes = 512, kW2ChunkScaleBytes = 64;
constexpr int64_t kW2RecordBytes = kW2ChunkCodeBytes + kW2ChunkScaleBytes, kW2TileBlock = 4;

struct W2TileShape {
  int64_t tiles = 0, chunks = 0;  // 16-row tiles (rounded up to kW2TileBlock); 128-column chunks
  size_t bytes() const { return size_t(tiles * chunks * kW2RecordBytes); }
};

// rows must be a multiple of 16 (gate_up: 2 * inner with inner % 8 == 0).
W2TileShape w2_tile_shape(int64_t rows, int64_t cols);

// Index of the record of tile t, chunk c in a matrix of `chunks` chunks per tile.
__host__ __device__ inline int64_t w2_record(int64_t t, int64_t c, int64_t chunks) {
  return ((t / kW2TileBlock) * chunks + c) * kW2TileBlock + t % kW2TileBlock;
}

// Converts one W2 matrix (codes [rows, cols / 4], scales [rows, cols / 32], cols % 32 == 0) into
// the tiled layout (w2_tile_shape(rows, cols).bytes() at `tiled`); `gate_up` interleaves gate and
// up rows as above. Sets *bad_scale to 1 when a scale byte is >= 253. Asynchronous on `stream`.
void w2_tile_launch(const uint8_t* codes, const uint8_t* scales, int64_t rows, int64_t cols, bool gate_up,
                    uint8_t* tiled, int32_t* bad_scale, cudaStream_t stream);
// The inverse (exclusive tiering writes an evicted expert back to the host in its row layout):
// the codes and scales planes the tiles were made from, padding left out. `codes` must be 4-byte
// aligned; it is cleared first (the codes of one byte come from several records).
void w2_untile_launch(const uint8_t* tiled, int64_t rows, int64_t cols, bool gate_up, uint8_t* codes, uint8_t* scales,
                      cudaStream_t stream);

}  // namespace moet::cuda
