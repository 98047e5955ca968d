// The W2 expert products for prefill-sized batches (moe_w2_prefill.h). prepare (moe_w2.cu) has
// grouped the items by expert, cut each expert's items into passes of up to kW2PrefillPassItems
// and split the activations into three BF16 terms; here a block takes units of (pass, group of
// kGroupTiles 16-row tiles) in turn (a persistent grid). Per 128-column chunk it stages the
// pass's activations (items x 3 terms x 128 columns, BF16) in shared memory, two chunks in
// flight (cp.async), while each warp loads its two tiles' codes and scales of the next chunk from
// the tiled planes (w2_tiles.h) and decodes this chunk's into A fragments once, for every item and
// term of the pass: m16n8k16 MMAs whose eight columns are eight items, the three terms
// accumulated into the same FP32 accumulators. So a weight is decoded once per 64 items, where
// the decode-oriented kernels (moe_w2.cu) decode it once per 2 to 8. gate_up ends with
// SiLU-and-mul written split for down; down writes each item's output rows for the combine.
// Sums have a fixed order (chunks ascending; within a chunk its four code words ascending, each
// the terms hi, mid, lo over the word's two k-steps): bit-identical reruns. The bits differ
// from the decode kernels' (which add the three terms' sums at the end); both are FP32
// accumulations of exact products.
#include "kernels/cuda/moe_w2_prefill.h"

#include "kernels/cuda/moe_group.cuh"

#include "kernels/cuda/cp_async.cuh"
#include "kernels/cuda/launch.cuh"
#include "kernels/cuda/moe_w2.h"
#include "kernels/cuda/w2_mma.cuh"
#include "kernels/cuda/w2_tiles.h"

namespace moet::cuda {
namespace {

// Warps per block and 16-row tiles per warp; the MOET_W2P_* macros exist so that variants can be
// built with -D for measurement (docs/gpu.md, "Variants"). On the H200 at 2048 rows: 8 warps of
// 2 tiles 69.3 TFLOP/s at DeepSeek-V3's expert shape, 4 x 2 58.0, 8 x 1 47.7, 4 x 1 32.0 (fewer
// rows per block re-stage the activations more often; bench/results/cuda_h200_session13.txt).
#ifndef MOET_W2P_WARPS
#define MOET_W2P_WARPS 8
#endif
#ifndef MOET_W2P_TILES
#define MOET_W2P_TILES 2
#endif
constexpr int kWarps = MOET_W2P_WARPS;
constexpr int kTilesPerWarp = MOET_W2P_TILES;
constexpr int kGroupTiles = kWarps * kTilesPerWarp;  // 256 weight rows per unit
constexpr int kItems = int(kW2PrefillPassItems);
constexpr int kColumnTiles = kItems / 8;  // MMA column tiles of a pass
constexpr int kTerms = 3;
// One staged row: an item's term over the chunk's 128 columns (256 bytes) + 16 bytes of padding,
// so the 8 items a warp's 128-bit loads touch at once fall in distinct banks.
constexpr int kRowElems = int(kW2ChunkCols) + 8;
constexpr int kStageElems = kTerms * kItems * kRowElems;
constexpr size_t kSharedBytes = 2 * kStageElems * sizeof(uint16_t);  // two chunks: 104448 bytes
static_assert(kItems % 8 == 0, "a pass fills whole MMA column tiles");

// The end of a pass's items: W2Pass::end is its expert's, of which a pass takes kItems.
__device__ __forceinline__ int pass_end(const W2Pass& ps) { return min(ps.end, ps.first + kItems); }

// Issues the copies of chunk `chunk` of the pass's items (x rows for gate_up, act rows for down)
// into `stage` ([term][item][kRowElems]); each thread copies whole 16-byte pieces.
template <bool kGateUp>
__device__ __forceinline__ void stage_chunk(const MoeArgs& a, const W2Pass& ps, int chunk, uint16_t* stage) {
  const uint16_t* split = kGateUp ? a.x_split : a.act_split;
  const int64_t padded = kGateUp ? a.hidden_padded : a.inner_padded;
  const int items = pass_end(ps) - ps.first;
  constexpr int kPieces = int(kW2ChunkCols) * 2 / 16;  // 16-byte pieces per row
  for (int i = threadIdx.x; i < kTerms * kItems * kPieces; i += kWarps * 32) {
    const int piece = i % kPieces, row = i / kPieces, item = row % kItems, term = row / kItems;
    if (item >= items) continue;
    const int pos = ps.first + item;
    const int64_t src_row = kGateUp ? a.order[pos] / a.top_k : pos;
    const uint16_t* src = split + (src_row * kTerms + term) * padded + int64_t(chunk) * kW2ChunkCols + piece * 8;
    cp_async16(stage + (term * kItems + item) * kRowElems + piece * 8, src);
  }
}

// acc[t][j] += tile t's chunk (codes, scales) times column tile j of every term in `stage`.
__device__ __forceinline__ void multiply_chunk(const uint4 (&codes)[kTilesPerWarp],
                                               const uint2 (&scales)[kTilesPerWarp], const uint16_t* stage, int lane,
                                               float (&acc)[kTilesPerWarp][kColumnTiles][4]) {
  const int g = lane >> 2, c = lane & 3;
#pragma unroll
  for (int q = 0; q < 4; ++q) {
    uint32_t frag[kTilesPerWarp][8];
#pragma unroll
    for (int t = 0; t < kTilesPerWarp; ++t) {
      const uint32_t word = q == 0 ? codes[t].x : q == 1 ? codes[t].y : q == 2 ? codes[t].z : codes[t].w;
      const uint32_t top = w2_word_base(scales[t].x, q), bottom = w2_word_base(scales[t].y, q);
#pragma unroll
      for (int j = 0; j < 8; ++j) frag[t][j] = w2_decode(word, j, j % 2 ? bottom : top);
    }
#pragma unroll
    for (int term = 0; term < kTerms; ++term)
#pragma unroll
      for (int j = 0; j < kColumnTiles; ++j) {
        const uint4 b =
            *reinterpret_cast<const uint4*>(stage + (term * kItems + j * 8 + g) * kRowElems + q * 32 + c * 8);
#pragma unroll
        for (int t = 0; t < kTilesPerWarp; ++t) {
          mma_bf16_16816(acc[t][j], frag[t][0], frag[t][1], frag[t][2], frag[t][3], b.x, b.y);
          mma_bf16_16816(acc[t][j], frag[t][4], frag[t][5], frag[t][6], frag[t][7], b.z, b.w);
        }
      }
  }
}

// Column tile j's accumulators of tile `tile`: lane (g, c) holds rows g and g + 8, items 2c and
// 2c + 1 of the tile. gate_up: rows g and g + 8 are gate and up of inner index tile * 8 + g;
// down: output rows tile * 16 + g and + 8.
template <bool kGateUp>
__device__ __forceinline__ void write_tile(const MoeArgs& a, const W2Pass& ps, int tile,
                                           const float (&acc)[kColumnTiles][4], int lane) {
  const int g = lane >> 2, c = lane & 3, end = pass_end(ps);
#pragma unroll
  for (int j = 0; j < kColumnTiles; ++j)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int pos = ps.first + j * 8 + 2 * c + h;
      if (pos >= end) continue;
      const float top = acc[j][h], bottom = acc[j][2 + h];
      if (kGateUp) {
        w2_split_store(moe_swiglu(top, bottom, a.swiglu_limit), a.act_split + int64_t(pos) * kTerms * a.inner_padded,
                       a.inner_padded, int64_t(tile) * 8 + g);
      } else {
        float* y = a.item_out + int64_t(a.order[pos]) * a.hidden + int64_t(tile) * kW2TileRows + g;
        y[0] = top;
        y[8] = bottom;
      }
    }
}

template <bool kGateUp>
__global__ void __launch_bounds__(kWarps * 32) w2_prefill_kernel(MoeArgs a) {
  pdl_wait();  // gate_up: the passes and split x from prepare; down: act from gate_up
  pdl_trigger();
  extern __shared__ uint4 shared_raw[];
  uint16_t* const stages = reinterpret_cast<uint16_t*>(shared_raw);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const W2ProductShape product = w2_product_shape(a, kGateUp);
  const int tiles = int(product.tiles), chunks = int(product.chunks), groups = (tiles + kGroupTiles - 1) / kGroupTiles;
  const int64_t units = int64_t(a.active_count[1]) * groups;
  for (int64_t unit = blockIdx.x; unit < units; unit += gridDim.x) {
    const W2Pass ps = a.passes[unit / groups];
    const int first_tile = int(unit % groups) * kGroupTiles + warp * kTilesPerWarp;
    const uint8_t* plane = static_cast<const uint8_t*>(kGateUp ? ps.expert.gate_up : ps.expert.down);
    float acc[kTilesPerWarp][kColumnTiles][4] = {};
    // This lane's codes and scales of the warp's tiles in chunk `chunk` (tiles past the last, which
    // the storage pads to kW2TileBlock at most, read tile 0 and are not written).
    uint4 codes[kTilesPerWarp];
    uint2 scales[kTilesPerWarp];
    const auto load_codes = [&](int chunk) {
#pragma unroll
      for (int t = 0; t < kTilesPerWarp; ++t) {
        const int tile = first_tile + t < tiles ? first_tile + t : 0;
        const uint8_t* at = plane + w2_record(tile, chunk, chunks) * kW2RecordBytes;
        codes[t] = *reinterpret_cast<const uint4*>(at + lane * 16);
        scales[t] = *reinterpret_cast<const uint2*>(at + kW2ChunkCodeBytes + (lane >> 2) * 8);
      }
    };
    load_codes(0);
    stage_chunk<kGateUp>(a, ps, 0, stages);
    cp_async_commit();
    for (int chunk = 0; chunk < chunks; ++chunk) {
      uint16_t* const stage = stages + (chunk & 1) * kStageElems;
      if (chunk + 1 < chunks) stage_chunk<kGateUp>(a, ps, chunk + 1, stages + ((chunk + 1) & 1) * kStageElems);
      cp_async_commit();
      uint4 now_codes[kTilesPerWarp];
      uint2 now_scales[kTilesPerWarp];
#pragma unroll
      for (int t = 0; t < kTilesPerWarp; ++t) now_codes[t] = codes[t], now_scales[t] = scales[t];
      if (chunk + 1 < chunks) load_codes(chunk + 1);  // in flight during this chunk's MMAs
      cp_async_wait_all_but_newest();
      __syncthreads();  // the chunk's activations have landed
      multiply_chunk(now_codes, now_scales, stage, lane, acc);
      __syncthreads();  // this stage is free for chunk + 2
    }
    cp_async_wait_all();
#pragma unroll
    for (int t = 0; t < kTilesPerWarp; ++t)
      if (first_tile + t < tiles) write_tile<kGateUp>(a, ps, first_tile + t, acc[t], lane);
  }
}

// Blocks of a persistent grid: every SM filled to the kernel's occupancy.
template <bool kGateUp>
unsigned grid_blocks() {
  static const unsigned blocks = [] {
    cudaFuncSetAttribute(w2_prefill_kernel<kGateUp>, cudaFuncAttributeMaxDynamicSharedMemorySize, int(kSharedBytes));
    int device = 0, sms = 0, per_sm = 0;
    cudaGetDevice(&device);
    cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device);
    cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, w2_prefill_kernel<kGateUp>, kWarps * 32, kSharedBytes);
    return unsigned(sms * (per_sm > 0 ? per_sm : 1));
  }();
  return blocks;
}

}  // namespace

bool w2_prefill_fits() {
  static const bool fits = [] {
    int device = 0, limit = 0;
    cudaGetDevice(&device);
    cudaDeviceGetAttribute(&limit, cudaDevAttrMaxSharedMemoryPerBlockOptin, device);
    return size_t(limit) >= kSharedBytes;
  }();
  return fits;
}

void w2_prefill_products(const MoeArgs& a, cudaStream_t stream) {
  launch_dependent_kernel<w2_prefill_kernel<true>>(dim3(grid_blocks<true>()), dim3(kWarps * 32), kSharedBytes, 1,
                                                   stream, a);
  launch_dependent_kernel<w2_prefill_kernel<false>>(dim3(grid_blocks<false>()), dim3(kWarps * 32), kSharedBytes, 1,
                                                    stream, a);
}

}  // namespace moet::cuda
