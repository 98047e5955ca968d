// Routed experts stored as W2 on tensor cores (moe.h; layout in w2_tiles.h, building blocks in
// w2_mma.cuh). Three launches chained by programmatic dependent launch (like every kernel of a
// step, launch.cuh), then moe.cu's combine:
//   prepare: block 0 groups the items by expert (moe_group.cuh) and cuts each expert's items into
//            passes of at most 2P items (the MMA's eight columns hold two items' three terms, P
//            such pairs per pass); the other blocks split each x row into three BF16 terms in the
//            B-fragment layout and clear the tile counters;
//   gate_up, down: persistent kernels. Their work, the units of (pass, block of R 16-row tiles,
//            128-column chunk) in that order, is cut into one contiguous range per warp of the
//            grid (equal sizes: no tail wave). A warp streams its units' codes and scales from
//            memory into a ring of registers kDepth units deep, decodes them into A fragments
//            (the block's scale in their exponents) and runs two MMAs per tile, scale block and
//            item pair into FP32 accumulators (the R tiles share each load of the activations,
//            fetched a unit ahead at batch <= 2). A tile block that one warp covers alone is
//            written out by that warp; one shared by several warps gets each one's partial sums
//            in a scratch slot, and the warp that finishes last (a per-block counter, counted
//            with release/acquire order) adds them in warp order and writes it. In a decode-like
//            step (MoeArgs::whole_tile_blocks) the ranges are whole tile blocks, so every block
//            is one warp's, its chunks summed in order whatever the batch.
//            gate_up ends with SiLU-and-mul, written already split for down; down writes each
//            item's output rows for moe.cu's fixed-order combine, its first units fetched before
//            it waits for gate_up.
// Every sum has a fixed order (chunks ascending within a warp, warps ascending within a tile,
// then (hi + mid) + lo) and the partition depends only on the grid and the step's passes:
// bit-identical reruns. An item's bits depend on the batch only through where the partition cuts
// its tile blocks (an MMA's output column depends only on its own B column, so neither the pass
// size nor an item's pass-mates change them): with whole tile blocks they do not.
#include "kernels/cuda/moe_w2.h"

#include "kernels/cuda/arrival_count.cuh"
#include "kernels/cuda/launch.cuh"
#include "kernels/cuda/moe_group.cuh"
#include "kernels/cuda/moe_w2_prefill.h"
#include "kernels/cuda/pass_size.h"
#include "kernels/cuda/streaming_load.cuh"
#include "kernels/cuda/w2_mma.cuh"
#include "kernels/cuda/w2_tiles.h"

#include <algorithm>
#include <type_traits>
#include <utility>

namespace moet::cuda {
namespace {

// Tuning of the product kernels. The MOET_W2_* macros exist so that variants can be built with
// -D for measurement (docs/gpu-history.md, Run 4); the defaults are the fastest measured on the H200:
// 2 or 4 tiles per warp and 12 to 20 warps per SM were within 4% of each other at batch 1, and
// deeper rings (4 or 8 units per warp) were slower, even with the decode removed.
constexpr int kWarpsPerBlock = 4;
#ifndef MOET_W2_TILES_P1
#define MOET_W2_TILES_P1 4
#endif
#ifndef MOET_W2_BLOCKS_P1
#define MOET_W2_BLOCKS_P1 3
#endif
#ifndef MOET_W2_DEPTH
#define MOET_W2_DEPTH 2
#endif
// Tiles a warp streams side by side, sharing their activation loads (fewer with more item pairs:
// registers run short).
template <int P>
constexpr int kTileBlock = P == 1 ? MOET_W2_TILES_P1 : P == 2 ? 4 : 2;
// Blocks per SM the product kernels are compiled for (registers: about 168, 240 and 235 per thread).
template <int P>
constexpr int kMinBlocksPerSm = P == 1 ? MOET_W2_BLOCKS_P1 : 2;
constexpr int kDepth = MOET_W2_DEPTH;    // units (a tile block's chunk) in flight per warp
constexpr int kPrepareThreads = 256;
constexpr int64_t kPairFloats = 4 * 32;  // a warp's accumulators of one item pair


// Block 0 of prepare, after grouping: cuts each active expert's items into passes of pass_items,
// one thread per expert; `shared` (>= experts ints) holds the pass counts, then their offsets.
__device__ void cut_passes(const MoeArgs& a, int32_t* shared) {
  const int active = a.active_count[0];
  for (int s = threadIdx.x; s < active; s += blockDim.x)
    shared[s] = (a.ranges[s + 1] - a.ranges[s] + a.pass_items - 1) / a.pass_items;
  __syncthreads();
  if (threadIdx.x < 32) {  // exclusive scan of the counts by warp 0, 32 experts at a time
    const int lane = threadIdx.x;
    int carry = 0;
    for (int base = 0; base < active; base += 32) {
      const int n = base + lane < active ? shared[base + lane] : 0;
      int inclusive = n;
      for (int offset = 1; offset < 32; offset <<= 1) {
        const int v = __shfl_up_sync(0xffffffffu, inclusive, offset);
        if (lane >= offset) inclusive += v;
      }
      if (base + lane < active) shared[base + lane] = carry + inclusive - n;
      carry += __shfl_sync(0xffffffffu, inclusive, 31);
    }
    if (lane == 0) a.active_count[1] = carry;
  }
  __syncthreads();
  for (int s = threadIdx.x; s < active; s += blockDim.x) {
    const ExpertPointers expert = a.table[a.active[s]];
    const int end = a.ranges[s + 1];
    int n = shared[s];
    for (int first = a.ranges[s]; first < end; first += a.pass_items) a.passes[n++] = {expert, first, end};
  }
}

__global__ void w2_prepare_kernel(MoeArgs a) {
  pdl_trigger();
  pdl_wait();  // the previous layer's kernels still read the scratch this one rewrites
  if (blockIdx.x == 0) {
    extern __shared__ int32_t count[];
    moe_group_block(a, count);
    cut_passes(a, count);
    return;
  }
  const int64_t id = int64_t(blockIdx.x - 1) * blockDim.x + threadIdx.x, threads = int64_t(gridDim.x - 1) * blockDim.x;
  for (int64_t i = id; i < a.tile_counters; i += threads) a.tile_done[i] = 0;
  if (id >= a.rows * a.hidden_padded) return;
  const int64_t row = id / a.hidden_padded, k = id % a.hidden_padded;
  const float x = k < a.hidden ? a.x[row * a.hidden + k] : 0.0f;
  w2_split_store(x, a.x_split + row * 3 * a.hidden_padded, a.hidden_padded, k);
}

// Columns: lane c holds 2c and 2c + 1. Item pair (first, second) = columns (0, 1, 2) and
// (3, 4, 5), each (hi + mid) + lo; lane c = 0 ends with the first's rows g and g + 8, c = 1 with
// the second's. gate_up: SiLU(gate) * up, stored split for down; down: the item's output rows.
template <bool kGateUp, int P>
__device__ __forceinline__ void write_outputs(const MoeArgs& a, const float (&acc)[P][4], int64_t tile, int p0,
                                              int end, int g, int c) {
#pragma unroll
  for (int p = 0; p < P; ++p) {
    float out[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const float e0 = acc[p][2 * r], e1 = acc[p][2 * r + 1];
      const float n0 = __shfl_down_sync(0xffffffffu, e0, 1), n1 = __shfl_down_sync(0xffffffffu, e1, 1);
      out[r] = c == 0 ? (e0 + e1) + n0 : (e1 + n0) + n1;
    }
    const int pos = p0 + 2 * p + c;
    if (c >= 2 || pos >= end) continue;
    if (kGateUp) {
      const float gate = out[0], up = out[1];
      w2_split_store(moe_swiglu(gate, up, a.swiglu_limit), a.act_split + int64_t(pos) * 3 * a.inner_padded,
                     a.inner_padded, tile * 8 + g);
    } else {
      float* y = a.item_out + int64_t(a.order[pos]) * a.hidden + tile * kW2TileRows + g;
      y[0] = out[0];
      y[8] = out[1];
    }
  }
}

// The split of the flat chunk range [0, units) into `workers` contiguous ranges of whole runs of
// `grain` chunks (1, or a tile block's chunks: MoeArgs::whole_tile_blocks), worker w taking
// [start(w), start(w + 1)); units / grain >= workers, so none is empty.
struct Partition {
  int64_t units, workers, grain;
  __device__ __forceinline__ int64_t runs() const { return units / grain; }
  __device__ __forceinline__ int64_t start(int64_t w) const { return w * runs() / workers * grain; }
  __device__ __forceinline__ int64_t worker_of(int64_t u) const {
    return ((u / grain + 1) * workers + runs() - 1) / runs() - 1;
  }
};

// One unit of work in flight: one chunk of the R tiles of a block, a lane's share.
template <int R>
struct Unit {
  uint4 codes[R];
  uint2 scales[R];
};

// A warp's read-ahead over its unit range: where the next unit to fetch lies. The records of a
// unit's tiles sit side by side (w2_tiles.h), one chunk's records kW2TileBlock apart.
template <bool kGateUp, int R>
struct UnitFetcher {
  const uint8_t* plane;  // the pass's record plane, at this lane's code bytes
  int64_t record;        // the next unit's first record
  int block, chunk, blocks, chunks, left, pass, g;

  __device__ __forceinline__ void point_at_block() {
    record = w2_record(int64_t(block) * R, chunk, chunks);
  }
  __device__ __forceinline__ void point_at_pass(const MoeArgs& a, int lane) {
    const ExpertPointers& e = a.passes[pass].expert;
    plane = static_cast<const uint8_t*>(kGateUp ? e.gate_up : e.down) + lane * 16;
  }
  __device__ __forceinline__ void next(const MoeArgs& a, int lane, Unit<R>& unit) {
    if (left == 0) return;
    const uint8_t* at = plane + record * kW2RecordBytes;
#pragma unroll
    for (int r = 0; r < R; ++r) {
      unit.codes[r] = load_streaming(reinterpret_cast<const uint4*>(at + r * kW2RecordBytes));
      unit.scales[r] = load_streaming(
          reinterpret_cast<const uint2*>(at + r * kW2RecordBytes + kW2ChunkCodeBytes - lane * 16 + g * 8));
    }
    if (--left == 0) return;
    record += kW2TileBlock;
    if (++chunk < chunks) return;
    chunk = 0;
    if (++block == blocks) {
      block = 0;
      ++pass;
      point_at_pass(a, lane);
    }
    point_at_block();
  }
};

// The B fragments of one chunk for P item pairs (xs[p] points at the pair's chunk 0).
template <int P>
__device__ __forceinline__ void load_activations(const uint4* const (&xs)[P], int chunk, uint4 (&xv)[P][4]) {
#pragma unroll
  for (int p = 0; p < P; ++p)
#pragma unroll
    for (int q = 0; q < 4; ++q) xv[p][q] = __ldg(xs[p] + chunk * 16 + q * 4);
}

// Adds one chunk's products into acc: word q of the lane's codes is k-steps 2q and 2q + 1
// (w2_layout.h); even registers hold row g (scale bytes scale.x), odd ones row g + 8 (scale.y).
template <int P>
__device__ __forceinline__ void multiply_chunk(const uint4& code, const uint2& scale, const uint4 (&xv)[P][4],
                                               float (&acc)[P][4]) {
  const uint32_t words[4] = {code.x, code.y, code.z, code.w};
#pragma unroll
  for (int q = 0; q < 4; ++q) {
    const uint32_t top = w2_word_base(scale.x, q), bottom = w2_word_base(scale.y, q);
    uint32_t frag[8];
#pragma unroll
    for (int j = 0; j < 8; ++j) frag[j] = w2_decode(words[q], j, j % 2 ? bottom : top);
#pragma unroll
    for (int p = 0; p < P; ++p) {
      mma_bf16_16816(acc[p], frag[0], frag[1], frag[2], frag[3], xv[p][q].x, xv[p][q].y);
      mma_bf16_16816(acc[p], frag[4], frag[5], frag[6], frag[7], xv[p][q].z, xv[p][q].w);
    }
  }
}

template <bool kGateUp, int P, int R>
__device__ __forceinline__ void write_block(const MoeArgs& a, const float (&acc)[R][P][4], int block, int tiles,
                                            const W2Pass& ps, int lane) {
#pragma unroll
  for (int r = 0; r < R; ++r)
    if (block * R + r < tiles) write_outputs<kGateUp, P>(a, acc[r], block * R + r, ps.first, ps.end, lane >> 2, lane & 3);
}

// The warp (units [u0, u1)) has finished its part of flat block `block_id` (= pass * blocks +
// block): writes the block if the warp covered it alone, else leaves its partial sums and, if it
// is the block's last warp to finish, adds every warp's partial sums in warp order and writes it.
template <bool kGateUp, int P, int R>
__device__ __forceinline__ void finish_block(const MoeArgs& a, const Partition& part, int64_t warp, int64_t u0,
                                             int64_t u1, int chunks, int64_t block_id, int block, int tiles,
                                             const W2Pass& ps, float (&acc)[R][P][4], int lane) {
  const int64_t begin = block_id * chunks, end = begin + chunks;
  if (begin >= u0 && end <= u1) {
    write_block<kGateUp, P, R>(a, acc, block, tiles, ps, lane);
    return;
  }
  // Slot 0 holds a warp's first block, slot 1 its last (a warp shares at most those two).
  constexpr int64_t kSlotFloats = R * P * kPairFloats;
  auto slot_of = [&](int64_t w) { return (w * 2 + (part.start(w) / chunks == block_id ? 0 : 1)) * kSlotFloats; };
  float* own = a.partial + slot_of(warp) + lane;
#pragma unroll
  for (int r = 0; r < R; ++r)
#pragma unroll
    for (int p = 0; p < P; ++p)
#pragma unroll
      for (int i = 0; i < 4; ++i) own[((r * P + p) * 4 + i) * 32] = acc[r][p][i];
  __syncwarp();  // every lane's partials before lane 0's arrival (arrival_count.cuh)
  const int64_t first = part.worker_of(begin), last = part.worker_of(end - 1);
  uint32_t done = 0;
  const int64_t counter = (kGateUp ? 0 : a.tile_counters / 2) + block_id;
  if (lane == 0) done = count_arrival(a.tile_done + counter);
  done = __shfl_sync(0xffffffffu, done, 0);
  if (done != uint32_t(last - first)) return;
  __syncwarp();
  for (int64_t w = first; w <= last; ++w) {
    const float* theirs = a.partial + slot_of(w) + lane;
#pragma unroll
    for (int r = 0; r < R; ++r)
#pragma unroll
      for (int p = 0; p < P; ++p)
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          const float v = __ldcg(theirs + ((r * P + p) * 4 + i) * 32);
          acc[r][p][i] = w == first ? v : acc[r][p][i] + v;
        }
  }
  write_block<kGateUp, P, R>(a, acc, block, tiles, ps, lane);
}

// f(slot 0), f(slot 1), ... (slots as compile-time constants) until one returns true.
template <int... S, typename F>
__device__ __forceinline__ bool in_slot_order(std::integer_sequence<int, S...>, F&& f) {
  return (f(std::integral_constant<int, S>{}) || ...);
}

template <bool kGateUp, int P>
__global__ void __launch_bounds__(kWarpsPerBlock * 32, kMinBlocksPerSm<P>) w2_product_kernel(MoeArgs a) {
  if (kGateUp) pdl_wait();  // grouping, passes, the split x and clear counters come from prepare
  pdl_trigger();
  constexpr int R = kTileBlock<P>;
  const int lane = threadIdx.x & 31, g = lane >> 2, c = lane & 3;
  const W2ProductShape shape = w2_product_shape(a, kGateUp);
  const int tiles = int(shape.tiles), chunks = int(shape.chunks), blocks = (tiles + R - 1) / R;
  const int per_pass = blocks * chunks;
  const int64_t units = int64_t(a.active_count[1]) * per_pass, grain = a.whole_tile_blocks ? chunks : 1;
  const int64_t launched = int64_t(gridDim.x) * kWarpsPerBlock;
  const Partition part{units, units / grain < launched ? units / grain : launched, grain};
  const int64_t warp = int64_t(blockIdx.x) * kWarpsPerBlock + (threadIdx.x >> 5);
  if (warp >= part.workers) return;
  const int64_t u0 = part.start(warp), u1 = part.start(warp + 1);
  const int count = int(u1 - u0);  // a few hundred units at most per warp
  int pass = int(u0 / per_pass), block = int(u0 % per_pass) / chunks, chunk = int(u0 % chunks);

  UnitFetcher<kGateUp, R> fetcher{nullptr, 0, block, chunk, blocks, chunks, count, pass, g};
  fetcher.point_at_pass(a, lane);
  fetcher.point_at_block();
  Unit<R> ring[kDepth];
#pragma unroll
  for (int s = 0; s < kDepth; ++s) fetcher.next(a, lane, ring[s]);
  if (!kGateUp) pdl_wait();  // act comes from gate_up; the first units are already on their way

  const uint16_t* split = kGateUp ? a.x_split : a.act_split;
  const int64_t k_padded = kGateUp ? a.hidden_padded : a.inner_padded;
  W2Pass ps{};
  const uint4* xs[P];
  auto enter_pass = [&] {
    ps = a.passes[pass];
#pragma unroll
    for (int p = 0; p < P; ++p) {
      const int first = min(ps.first + 2 * p, ps.end - 1), second = min(first + 1, ps.end - 1);
      const int pos = g >= 3 && g < 6 ? second : first;
      const int64_t row = kGateUp ? a.order[pos] / a.top_k : pos;
      xs[p] = reinterpret_cast<const uint4*>(split + (row * 3 + g % 3) * k_padded) + c;
    }
  };
  enter_pass();
  // One pair's activations are fetched a unit ahead (double-buffered in registers); larger
  // batches load theirs at the start of each unit (registers run short).
  constexpr bool kPrefetchX = P == 1;
  uint4 xv[2][P][4];
  if (kPrefetchX) load_activations<P>(xs, chunk, xv[0]);
  float acc[R][P][4] = {};

  int left = count;
  // One unit: multiply, refill its ring slot, finish the block at its end. True when done.
  auto step = [&](Unit<R>& unit, uint4 (&x_now)[P][4], uint4 (&x_next)[P][4]) {
    if (!kPrefetchX) {
      load_activations<P>(xs, chunk, x_now);
    } else if (left > 1 && (chunk + 1 < chunks || block + 1 < blocks)) {  // the next unit, same pass
      load_activations<P>(xs, chunk + 1 < chunks ? chunk + 1 : 0, x_next);
    }
#pragma unroll
    for (int r = 0; r < R; ++r) multiply_chunk<P>(unit.codes[r], unit.scales[r], x_now, acc[r]);
    fetcher.next(a, lane, unit);
    --left;
    if (++chunk < chunks && left > 0) return false;
    finish_block<kGateUp, P, R>(a, part, warp, u0, u1, chunks, int64_t(pass) * blocks + block, block, tiles, ps, acc,
                                lane);
    if (left == 0) return true;
#pragma unroll
    for (int r = 0; r < R; ++r)
#pragma unroll
      for (int p = 0; p < P; ++p)
#pragma unroll
        for (int i = 0; i < 4; ++i) acc[r][p][i] = 0.0f;
    chunk = 0;
    if (++block == blocks) {
      block = 0;
      ++pass;
      enter_pass();
      if (kPrefetchX) load_activations<P>(xs, 0, x_next);
    }
    return false;
  };
  // The ring's slots in turn (indices known at compile time, so the ring stays in registers); the
  // activation buffers alternate, hence an even depth.
  static_assert(kDepth % 2 == 0, "the activation buffers alternate with the ring slots");
  auto slot_step = [&](auto slot) {
    constexpr int s = decltype(slot)::value;
    return step(ring[s], xv[kPrefetchX ? s % 2 : 0], xv[kPrefetchX ? (s + 1) % 2 : 0]);
  };
  while (!in_slot_order(std::make_integer_sequence<int, kDepth>{}, slot_step)) {
  }
}

// Warps in the grid of one product kernel: every SM filled to the kernel's occupancy.
template <bool kGateUp, int P>
int64_t product_warps() {
  static const int64_t warps = [] {
    int device = 0, sms = 0, blocks = 0;
    cudaGetDevice(&device);
    cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device);
    cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, w2_product_kernel<kGateUp, P>, kWarpsPerBlock * 32, 0);
    return int64_t(sms) * (blocks > 0 ? blocks : 1) * kWarpsPerBlock;
  }();
  return warps;
}

template <int P>
int64_t partial_floats() {
  const int64_t warps = std::max(product_warps<true, P>(), product_warps<false, P>());
  return warps * 2 * kTileBlock<P> * P * kPairFloats;
}

template <int P>
void w2_products(const MoeArgs& a, cudaStream_t stream) {
  launch_dependent_kernel<w2_product_kernel<true, P>>(dim3(unsigned(product_warps<true, P>() / kWarpsPerBlock)),
                                                      dim3(kWarpsPerBlock * 32), 0, 1, stream, a);
  launch_dependent_kernel<w2_product_kernel<false, P>>(dim3(unsigned(product_warps<false, P>() / kWarpsPerBlock)),
                                                       dim3(kWarpsPerBlock * 32), 0, 1, stream, a);
}

}  // namespace

int w2_pairs_per_pass(int64_t rows, int64_t top_k, int64_t experts) {
  // Relative time of one pass with 1, 2 or 4 item pairs (the product kernels' MMAs and scaling
  // grow with the pairs, their loads and decode do not), measured at batch 1 on the H200 with
  // the pair count forced: DeepSeek-V3 experts 1 : 1.30 : 1.95, Qwen3-235B's 1 : 1.23 : 1.81
  // (bench/results/cuda_h200_session6_pairs.txt).
  static constexpr PassSize kOptions[] = {{2, 1.0}, {4, 1.3}, {8, 1.9}};
  return best_pass_items(rows, top_k, experts, kOptions) / 2;
}

W2Scratch moe_w2_scratch(int64_t rows, int64_t top_k, int64_t experts, int64_t hidden, int64_t inner,
                         bool row_invariant) {
  const int64_t items = rows * top_k;
  if (!row_invariant && items >= kW2PrefillMinItemsPerExpert * experts && w2_prefill_fits())
    return {std::min(items, experts) + items / kW2PrefillPassItems + 1, 0, 0, kW2PrefillPassItems};
  const int64_t pairs = w2_pairs_per_pass(rows, top_k, experts);
  const int64_t passes = std::min(items, experts) + items / (2 * pairs) + 1;
  const int64_t partial = pairs == 1 ? partial_floats<1>() : pairs == 2 ? partial_floats<2>() : partial_floats<4>();
  const int64_t blocks = std::max(inner / 8, hidden / kW2TileRows) / 2 + 1;  // tile blocks of at least 2
  return {passes, 2 * passes * blocks, partial, int(2 * pairs)};
}

void moe_w2_launch(const MoeArgs& a, cudaStream_t stream) {
  if (a.inner % kW2ChunkCols != 0)  // padding columns of act must read as zero
    cudaMemsetAsync(a.act_split, 0, size_t(a.rows * a.top_k * 3 * a.inner_padded) * sizeof(uint16_t), stream);
  const int64_t split_threads = std::max(a.rows * a.hidden_padded, a.tile_counters);
  launch_dependent_kernel<w2_prepare_kernel>(dim3(unsigned(1 + (split_threads + kPrepareThreads - 1) / kPrepareThreads)),
                                             dim3(kPrepareThreads),
                                             size_t(moe_group_shared_ints(a.experts, kPrepareThreads)) * sizeof(int32_t),
                                             1, stream, a);
  switch (a.pass_items) {
    case kW2PrefillPassItems: w2_prefill_products(a, stream); break;
    case 2: w2_products<1>(a, stream); break;
    case 4: w2_products<2>(a, stream); break;
    default: w2_products<4>(a, stream); break;
  }
}

}  // namespace moet::cuda
