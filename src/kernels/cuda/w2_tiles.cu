// W2 matrices into the tensor-core tile layout (see w2_tiles.h).
#include "kernels/cuda/w2_tiles.h"

#include "kernels/cuda/w2_mma.cuh"

namespace moet::cuda {
namespace {

// The row of a tile's local row `local` in the matrix (gate_up: gate rows 0-7, up rows 8-15).
__device__ __forceinline__ int64_t w2_source_row(int64_t tile, int local, int64_t rows, bool gate_up) {
  if (!gate_up) return tile * kW2TileRows + local;
  return local < 8 ? tile * 8 + local : rows / 2 + tile * 8 + (local - 8);
}

// One thread per (tile, chunk, lane): the lane's four code words; lanes < 16 also write the four
// scale bytes of row `lane` of the tile, next to those of the row 8 apart. Padding rows (tiles
// past rows / 16) and columns get any code and the scale 2^0.
__global__ void w2_tile_kernel(const uint8_t* codes, const uint8_t* scales, int64_t rows, int64_t cols, bool gate_up,
                               W2TileShape shape, uint8_t* tiled, int32_t* bad_scale) {
  const int64_t id = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (id >= shape.tiles * shape.chunks * 32) return;
  const int lane = int(id % 32);
  const int64_t chunk = (id / 32) % shape.chunks, tile = id / 32 / shape.chunks;
  const int64_t row_bytes = cols / 4, row_blocks = cols / 32;
  auto source_row = [&](int local) { return w2_source_row(tile, local, rows, gate_up); };
  uint32_t words[4];
  for (int q = 0; q < 4; ++q) {
    uint32_t w = 0;
    for (int j = 0; j < 8; ++j) {
      for (int h = 0; h < 2; ++h) {
        const W2FragmentPos pos = w2_fragment_pos(lane, q, j, h);
        const int64_t k = chunk * kW2ChunkCols + pos.col;
        int code = 2;  // padding: any level (zero activations; rows never written out)
        if (k < cols && tile * kW2TileRows < rows)
          code = (codes[source_row(pos.row) * row_bytes + k / 4] >> (2 * (k % 4))) & 3;
        const uint32_t s = code < 2, m = code == 0 || code == 3;
        w |= m << w2_m_bit(j, h) | s << w2_s_bit(j, h);
      }
    }
    words[q] = w;
  }
  uint8_t* record = tiled + w2_record(tile, chunk, shape.chunks) * kW2RecordBytes;
  reinterpret_cast<uint4*>(record)[lane] = make_uint4(words[0], words[1], words[2], words[3]);
  if (lane < kW2TileRows) {
    uint8_t* out = record + kW2ChunkCodeBytes + (lane % 8) * 8 + (lane / 8) * 4;
    for (int q = 0; q < 4; ++q) {
      const int64_t block = chunk * 4 + q;
      uint32_t byte = 127;  // padding blocks: 2^0
      if (block < row_blocks && tile * kW2TileRows < rows) byte = scales[source_row(lane) * row_blocks + block];
      if (byte >= 253) *bad_scale = 1;
      out[q] = uint8_t(byte);
    }
  }
}

// One thread per (tile, chunk, lane), as w2_tile_kernel: the lane's four code words back into
// 2-bit codes (OR-ed into their bytes' words: four codes share a byte), the scale bytes of row
// `lane` (lanes < 16) back into the scale plane.
__global__ void w2_untile_kernel(const uint8_t* tiled, int64_t rows, int64_t cols, bool gate_up, W2TileShape shape,
                                 uint8_t* codes, uint8_t* scales) {
  const int64_t id = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (id >= shape.tiles * shape.chunks * 32) return;
  const int lane = int(id % 32);
  const int64_t chunk = (id / 32) % shape.chunks, tile = id / 32 / shape.chunks;
  if (tile * kW2TileRows >= rows) return;  // padding tiles
  const int64_t row_bytes = cols / 4, row_blocks = cols / 32;
  const uint8_t* record = tiled + w2_record(tile, chunk, shape.chunks) * kW2RecordBytes;
  const uint4 words = reinterpret_cast<const uint4*>(record)[lane];
  const uint32_t word[4] = {words.x, words.y, words.z, words.w};
  for (int q = 0; q < 4; ++q) {
    for (int j = 0; j < 8; ++j) {
      for (int h = 0; h < 2; ++h) {
        const W2FragmentPos pos = w2_fragment_pos(lane, q, j, h);
        const int64_t k = chunk * kW2ChunkCols + pos.col;
        if (k >= cols) continue;
        const uint32_t m = (word[q] >> w2_m_bit(j, h)) & 1u, s = (word[q] >> w2_s_bit(j, h)) & 1u;
        const uint32_t code = s ? (m ? 0u : 1u) : (m ? 3u : 2u);  // inverse of s = code < 2, m = code in {0, 3}
        const int64_t byte = w2_source_row(tile, pos.row, rows, gate_up) * row_bytes + k / 4;
        const uint32_t shift = uint32_t(8 * (byte % 4) + 2 * (k % 4));
        atomicOr(reinterpret_cast<unsigned int*>(codes + byte - byte % 4), code << shift);
      }
    }
  }
  if (lane < kW2TileRows) {
    const uint8_t* in = record + kW2ChunkCodeBytes + (lane % 8) * 8 + (lane / 8) * 4;
    for (int q = 0; q < 4; ++q) {
      const int64_t block = chunk * 4 + q;
      if (block < row_blocks) scales[w2_source_row(tile, lane, rows, gate_up) * row_blocks + block] = in[q];
    }
  }
}

}  // namespace

W2TileShape w2_tile_shape(int64_t rows, int64_t cols) {
  const int64_t tiles = rows / kW2TileRows;
  return {(tiles + kW2TileBlock - 1) / kW2TileBlock * kW2TileBlock, (cols + kW2ChunkCols - 1) / kW2ChunkCols};
}

void w2_tile_launch(const uint8_t* codes, const uint8_t* scales, int64_t rows, int64_t cols, bool gate_up,
                    uint8_t* tiled, int32_t* bad_scale, cudaStream_t stream) {
  const W2TileShape shape = w2_tile_shape(rows, cols);
  const int64_t threads = shape.tiles * shape.chunks * 32;
  w2_tile_kernel<<<unsigned((threads + 255) / 256), 256, 0, stream>>>(codes, scales, rows, cols, gate_up, shape,
                                                                      tiled, bad_scale);
}

void w2_untile_launch(const uint8_t* tiled, int64_t rows, int64_t cols, bool gate_up, uint8_t* codes, uint8_t* scales,
                      cudaStream_t stream) {
  const W2TileShape shape = w2_tile_shape(rows, cols);
  cudaMemsetAsync(codes, 0, size_t(rows * cols / 4), stream);
  const int64_t threads = shape.tiles * shape.chunks * 32;
  w2_untile_kernel<<<unsigned((threads + 255) / 256), 256, 0, stream>>>(tiled, rows, cols, gate_up, shape, codes,
                                                                        scales);
}

}  // namespace moet::cuda
