// Routed experts stored as W2 on tensor cores (moe.h; layout in w2_tiles.h, building blocks in
// w2_mma.cuh). Three launches chained by programmatic dependent launch, then moe.cu's combine:
//   prepare: block 0 groups the items by expert (moe_group.cuh) and cuts each expert's items into
//            passes of at most 2P items (the MMA's eight columns hold two items' three terms, P
//            such pairs per pass); the other blocks split each x row into three BF16 terms in the
//            B-fragment layout and clear the tile counters;
//   gate_up, down: persistent kernels. Their work, the units of (pass, group of 4 16-row tiles,
//            128-column chunk) in that order, is cut into one contiguous range per block of the
//            grid (equal sizes: no tail wave). A unit's four 576-byte records lie side by side and
//            a pass's units follow each other in memory, so a block streams one contiguous region
//            per pass, like a copy: its producer warp fills a ring of shared-memory stages of one
//            unit per consumer warp (stage_pipe.cuh: bulk asynchronous copies on sm_90), and
//            consumer warp w takes unit w of each stage: decodes the four tiles' codes into A
//            fragments and runs two MMAs per tile, scale block and item pair (the four tiles
//            share each load of the activations), each block's sum scaled into FP32
//            accumulators. When a group's last unit has been read, the consumer warps leave their
//            accumulators in shared memory and warp t adds tile t's in warp order; a group wholly
//            inside the block's range is written out, one shared with neighbouring blocks gets
//            each block's sums in a scratch slot, and the block that finishes last (a per-tile
//            counter) adds them in block order and writes it. gate_up ends with SiLU-and-mul,
//            written already split for down; down writes each item's output rows for moe.cu's
//            fixed-order combine, its producer filling the first stages before the block waits
//            for gate_up.
// Every sum has a fixed order (chunks ascending within a warp, warps then blocks ascending within
// a tile, then (hi + mid) + lo) and the partition depends only on the grid: bit-identical reruns.
#include "kernels/cuda/moe_w2.h"

#include "kernels/cuda/launch.cuh"
#include "kernels/cuda/moe_group.cuh"
#include "kernels/cuda/stage_pipe.cuh"
#include "kernels/cuda/w2_mma.cuh"
#include "kernels/cuda/w2_tiles.h"

#include <algorithm>

namespace moet::cuda {
namespace {

// Tuning of the product kernels. The MOET_W2_* macros exist so that variants can be built with
// -D for measurement (docs/gpu.md); the defaults are the fastest measured on the H200.
#ifndef MOET_W2_CONSUMERS_P1
#define MOET_W2_CONSUMERS_P1 8
#endif
#ifndef MOET_W2_BLOCKS_P1
#define MOET_W2_BLOCKS_P1 2
#endif
#ifndef MOET_W2_MAX_STAGES
#define MOET_W2_MAX_STAGES 8
#endif
constexpr int kTiles = int(kW2TileBlock);                     // tiles per unit
constexpr int64_t kUnitBytes = kW2TileBlock * kW2RecordBytes;  // one chunk of a unit's tiles
// Consumer warps per block (one unit each per stage; fewer with more item pairs, whose
// accumulators take more shared memory to add up).
template <int P>
constexpr int kConsumers = P == 1 ? MOET_W2_CONSUMERS_P1 : 4;
// Blocks per SM the product kernels are sized for (registers and shared memory).
template <int P>
constexpr int kBlocksPerSm = P == 1 ? MOET_W2_BLOCKS_P1 : 1;
constexpr int kMaxStages = MOET_W2_MAX_STAGES;
constexpr int kPrepareThreads = 256;
constexpr int64_t kPairFloats = 4 * 32;  // a warp's accumulators of one tile and item pair
// Floats of one set of every consumer warp's accumulators (the shared memory they are added in).
template <int P>
constexpr int64_t kGroupSumFloats = int64_t(kConsumers<P>) * kTiles * P * kPairFloats;

// Tiles per pass and chunks per tile of the gate_up (true) or down product.
struct ProductShape {
  int64_t tiles, chunks;
};
__host__ __device__ inline ProductShape product_shape(const MoeArgs& a, bool gate_up) {
  return gate_up ? ProductShape{a.inner / 8, a.hidden_padded / kW2ChunkCols}
                 : ProductShape{a.hidden / kW2TileRows, a.inner_padded / kW2ChunkCols};
}

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

__device__ __forceinline__ float scale_of(uint32_t bytes, int q) {
  return __uint_as_float(((bytes >> (8 * q)) & 0xFFu) << 23);
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
      w2_split_store(gate / (1.0f + expf(-gate)) * up, a.act_split + int64_t(pos) * 3 * a.inner_padded,
                     a.inner_padded, tile * 8 + g);
    } else {
      float* y = a.item_out + int64_t(a.order[pos]) * a.hidden + tile * kW2TileRows + g;
      y[0] = out[0];
      y[8] = out[1];
    }
  }
}

// The split of the flat unit range [0, units) into `workers` contiguous ranges, worker w taking
// [start(w), start(w + 1)); units >= workers, so none is empty.
struct Partition {
  int64_t units, workers;
  __device__ __forceinline__ int64_t start(int64_t w) const { return w * units / workers; }
  __device__ __forceinline__ int64_t worker_of(int64_t u) const { return ((u + 1) * workers + units - 1) / units - 1; }
};

// The B fragments of scale block q of one chunk for P item pairs (xs[p] points at the pair's
// chunk 0).
template <int P>
__device__ __forceinline__ void load_activations(const uint4* const (&xs)[P], int chunk, int q, uint4 (&xv)[P]) {
#pragma unroll
  for (int p = 0; p < P; ++p) xv[p] = __ldg(xs[p] + chunk * 16 + q * 4);
}

// Activations of a whole chunk are loaded before the unit's codes arrive; with four item pairs
// (registers run short) each scale block's are loaded when it is multiplied.
template <int P>
constexpr int kEarlyBlocks = P <= 2 ? 4 : 0;

// Adds one unit (the four tiles' records of one chunk at `unit`) into acc: word q of a lane's
// codes is scale block q (k-steps 2q and 2q + 1); x[q] holds block q's B fragments for q <
// kEarlyBlocks, the others are loaded here.
template <int P>
__device__ __forceinline__ void multiply_unit(const uint8_t* unit, int lane, const uint4* const (&xs)[P], int chunk,
                                              const uint4 (&x)[kEarlyBlocks<P> > 0 ? kEarlyBlocks<P> : 1][P],
                                              float (&acc)[kTiles][P][4]) {
  uint4 code[kTiles];
  uint2 scale[kTiles];
#pragma unroll
  for (int r = 0; r < kTiles; ++r) {
    code[r] = *reinterpret_cast<const uint4*>(unit + r * kW2RecordBytes + lane * 16);
    scale[r] = *reinterpret_cast<const uint2*>(unit + r * kW2RecordBytes + kW2ChunkCodeBytes + (lane >> 2) * 8);
  }
#pragma unroll
  for (int q = 0; q < 4; ++q) {
    uint4 xv[P];
    if (q < kEarlyBlocks<P>) {
#pragma unroll
      for (int p = 0; p < P; ++p) xv[p] = x[q < kEarlyBlocks<P> ? q : 0][p];
    } else {
      load_activations<P>(xs, chunk, q, xv);
    }
#pragma unroll
    for (int r = 0; r < kTiles; ++r) {
      const uint32_t word = q == 0 ? code[r].x : q == 1 ? code[r].y : q == 2 ? code[r].z : code[r].w;
      uint32_t frag[8];
#pragma unroll
      for (int j = 0; j < 8; ++j) frag[j] = w2_decode(word, j);
      const float top = scale_of(scale[r].x, q), bottom = scale_of(scale[r].y, q);
#pragma unroll
      for (int p = 0; p < P; ++p) {
        float d[4] = {0.0f, 0.0f, 0.0f, 0.0f};
        mma_bf16_16816(d, frag[0], frag[1], frag[2], frag[3], xv[p].x, xv[p].y);
        mma_bf16_16816(d, frag[4], frag[5], frag[6], frag[7], xv[p].z, xv[p].w);
        acc[r][p][0] = fmaf(d[0], top, acc[r][p][0]);
        acc[r][p][1] = fmaf(d[1], top, acc[r][p][1]);
        acc[r][p][2] = fmaf(d[2], bottom, acc[r][p][2]);
        acc[r][p][3] = fmaf(d[3], bottom, acc[r][p][3]);
      }
    }
  }
}

// A block's share of one product: units [u0, u1) of the flat (pass, group, chunk) range.
struct BlockWork {
  Partition part;
  int64_t u0, u1, per_pass;  // per_pass = groups * chunks
  int chunks, groups, tiles;
};

// Where a product block's parts sit in its dynamic shared memory: the ring of stages (one unit per
// consumer warp each), two sets of group sums (alternating by group), then the full and empty
// barriers.
struct ProductLayout {
  int stages;
  int64_t stage_bytes, sums_bytes;
  __host__ __device__ int64_t bytes() const { return stages * stage_bytes + 2 * sums_bytes + 2 * kMaxStages * 8; }
};
template <int P>
__host__ __device__ ProductLayout product_layout(int stages) {
  return {stages, kConsumers<P> * kUnitBytes, kGroupSumFloats<P> * int64_t(sizeof(float))};
}

// The consumer warps of a block meet (named barrier 1; the producer warp takes no part).
template <int P>
__device__ __forceinline__ void consumers_sync() {
  asm volatile("bar.sync 1, %0;" ::"r"(kConsumers<P> * 32) : "memory");
}

// The producer warp: fills the stages with the block's units in order, one piece per pass the
// stage touches (a pass's units are contiguous in its expert's plane).
template <bool kGateUp, int P>
__device__ __forceinline__ void produce(const MoeArgs& a, const BlockWork& w, int stages, uint8_t* ring, uint64_t* full,
                        uint64_t* empty, int lane) {
  constexpr int64_t kStageUnits = kConsumers<P>;
  int slot = 0;
  uint32_t phase = 0;  // parity of the slot's current use
  for (int64_t first = w.u0; first < w.u1; first += kStageUnits) {
    if (first - w.u0 >= stages * kStageUnits) stage_wait(empty + slot, phase ^ 1);  // its last use released
    const int64_t count = min(kStageUnits, w.u1 - first);
    uint8_t* stage = ring + slot * kStageUnits * kUnitBytes;
    stage_fill_begin(full + slot, uint32_t(count * kUnitBytes), lane);
    for (int64_t u = first; u < first + count;) {
      const int64_t pass = u / w.per_pass, offset = u % w.per_pass;
      const int64_t piece = min(first + count - u, w.per_pass - offset);
      const ExpertPointers& e = a.passes[pass].expert;
      const uint8_t* plane = static_cast<const uint8_t*>(kGateUp ? e.gate_up : e.down);
      stage_fill_piece(stage + (u - first) * kUnitBytes, plane + offset * kUnitBytes, uint32_t(piece * kUnitBytes),
                       full + slot, lane);
      u += piece;
    }
    stage_fill_end(full + slot, lane);
    if (++slot == stages) {
      slot = 0;
      phase ^= 1;
    }
  }
}

// The group is shared with neighbouring blocks: leaves this block's sums of tile r in its scratch
// slot (slot 0 for the block's first group, 1 for its last; a block shares at most those two).
// True, with every block's sums added in block order in `total`, for the block that finishes last
// (a per-tile counter).
template <bool kGateUp, int P>
__device__ __forceinline__ bool merge_blocks(const MoeArgs& a, const BlockWork& w, int64_t group, int r, float (&total)[P][4],
                             int lane) {
  constexpr int64_t kSlotFloats = kTiles * P * kPairFloats;
  auto slot_of = [&](int64_t b) {
    return (b * 2 + (w.part.start(b) / w.chunks == group ? 0 : 1)) * kSlotFloats + r * P * kPairFloats + lane;
  };
  float* own = a.partial + slot_of(blockIdx.x);
#pragma unroll
  for (int p = 0; p < P; ++p)
#pragma unroll
    for (int i = 0; i < 4; ++i) own[(p * 4 + i) * 32] = total[p][i];
  __threadfence();
  const int64_t first = w.part.worker_of(group * w.chunks), last = w.part.worker_of((group + 1) * w.chunks - 1);
  uint32_t done = 0;
  if (lane == 0) done = atomicAdd(a.tile_done + (kGateUp ? 0 : a.tile_counters / 2) + group * kTiles + r, 1u);
  done = __shfl_sync(0xffffffffu, done, 0);
  if (done != uint32_t(last - first)) return false;
  __threadfence();
  for (int64_t b = first; b <= last; ++b) {
    const float* theirs = a.partial + slot_of(b);
#pragma unroll
    for (int p = 0; p < P; ++p)
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const float v = __ldcg(theirs + (p * 4 + i) * 32);
        total[p][i] = b == first ? v : total[p][i] + v;
      }
  }
  return true;
}

// Every consumer warp has read its last unit of `group` (flat: pass * groups + group): the warps
// leave their accumulators in `sums`, warp r < kTiles adds tile r's in warp order and writes the
// tile out (after merging with the neighbouring blocks' sums if the group is shared).
template <bool kGateUp, int P>
__device__ __forceinline__ void finish_group(const MoeArgs& a, const BlockWork& w, int64_t group, const float (&acc)[kTiles][P][4],
                             float* sums, int warp, int lane) {
  float* mine = sums + int64_t(warp) * kTiles * P * kPairFloats + lane;
#pragma unroll
  for (int r = 0; r < kTiles; ++r)
#pragma unroll
    for (int p = 0; p < P; ++p)
#pragma unroll
      for (int i = 0; i < 4; ++i) mine[((r * P + p) * 4 + i) * 32] = acc[r][p][i];
  consumers_sync<P>();
  const int r = warp;
  const int64_t tile = (group % w.groups) * kTiles + r;
  if (r >= kTiles || tile >= w.tiles) return;
  float total[P][4];
  for (int v = 0; v < kConsumers<P>; ++v) {
    const float* theirs = sums + (int64_t(v) * kTiles + r) * P * kPairFloats + lane;
#pragma unroll
    for (int p = 0; p < P; ++p)
#pragma unroll
      for (int i = 0; i < 4; ++i) total[p][i] = v == 0 ? theirs[(p * 4 + i) * 32] : total[p][i] + theirs[(p * 4 + i) * 32];
  }
  const bool shared = group * w.chunks < w.u0 || (group + 1) * w.chunks > w.u1;
  if (shared && !merge_blocks<kGateUp, P>(a, w, group, r, total, lane)) return;
  const W2Pass& ps = a.passes[group / w.groups];
  write_outputs<kGateUp, P>(a, total, tile, ps.first, ps.end, lane >> 2, lane & 3);
}

// Finishes the groups from `group` (acc's) up to `next`, leaving acc cleared for group `next`.
template <bool kGateUp, int P>
__device__ __forceinline__ void finish_groups_until(const MoeArgs& a, const BlockWork& w, int64_t next, int64_t& group,
                                                    float (&acc)[kTiles][P][4], float* sums, int warp, int lane) {
  for (; group < next; ++group) {
    finish_group<kGateUp, P>(a, w, group, acc, sums + (group & 1) * kGroupSumFloats<P>, warp, lane);
#pragma unroll
    for (int r = 0; r < kTiles; ++r)
#pragma unroll
      for (int p = 0; p < P; ++p)
#pragma unroll
        for (int i = 0; i < 4; ++i) acc[r][p][i] = 0.0f;
  }
}

// Points xs at the B fragments (chunk 0) of pass `pass`'s item pairs: lane column g takes term
// g % 3 of the pair's first item (g < 3, or g >= 6: unused columns) or second item (3 <= g < 6).
template <bool kGateUp, int P>
__device__ __forceinline__ void point_activations(const MoeArgs& a, int64_t pass, int lane, const uint4* (&xs)[P]) {
  const uint16_t* split = kGateUp ? a.x_split : a.act_split;
  const int64_t k_padded = kGateUp ? a.hidden_padded : a.inner_padded;
  const int g = lane >> 2;
  const W2Pass& ps = a.passes[pass];
#pragma unroll
  for (int p = 0; p < P; ++p) {
    const int first = min(ps.first + 2 * p, ps.end - 1), second = min(first + 1, ps.end - 1);
    const int pos = g >= 3 && g < 6 ? second : first;
    const int64_t row = kGateUp ? a.order[pos] / a.top_k : pos;
    xs[p] = reinterpret_cast<const uint4*>(split + (row * 3 + g % 3) * k_padded) + (lane & 3);
  }
}

// Consumer warp `warp`: unit `warp` of each stage, accumulating group by group; at the end of
// every group (known to all warps alike from the range) the warps finish it together.
template <bool kGateUp, int P>
__device__ __forceinline__ void consume(const MoeArgs& a, const BlockWork& w, int stages, const uint8_t* ring, float* sums,
                        uint64_t* full, uint64_t* empty, int warp, int lane) {
  constexpr int kStageUnits = kConsumers<P>;
  const int64_t total = w.u1 - w.u0;
  float acc[kTiles][P][4] = {};
  int64_t group = w.u0 / w.chunks;  // the group acc belongs to
  int64_t xs_pass = -1;
  const uint4* xs[P];
  int slot = 0;
  uint32_t phase = 0;
  for (int64_t first = 0; first < total; first += kStageUnits) {
    const int64_t j = first + warp;
    if (j < total) {
      const int64_t u = w.u0 + j, pass = u / w.per_pass;
      finish_groups_until<kGateUp, P>(a, w, u / w.chunks, group, acc, sums, warp, lane);
      if (pass != xs_pass) {
        point_activations<kGateUp, P>(a, pass, lane, xs);
        xs_pass = pass;
      }
      const int chunk = int(u % w.chunks);
      uint4 x[kEarlyBlocks<P> > 0 ? kEarlyBlocks<P> : 1][P];
#pragma unroll
      for (int q = 0; q < kEarlyBlocks<P>; ++q) load_activations<P>(xs, chunk, q, x[q]);
      stage_wait(full + slot, phase);
      multiply_unit<P>(ring + (int64_t(slot) * kStageUnits + warp) * kUnitBytes, lane, xs, chunk, x, acc);
    } else {
      stage_wait(full + slot, phase);  // released only once filled: arrivals stay in their phase
    }
    stage_release(empty + slot, lane);
    const int64_t last = min(first + kStageUnits, total) - 1, u_last = w.u0 + last;
    const int64_t next = u_last / w.chunks + (u_last % w.chunks == w.chunks - 1 || last == total - 1 ? 1 : 0);
    finish_groups_until<kGateUp, P>(a, w, next, group, acc, sums, warp, lane);
    if (++slot == stages) {
      slot = 0;
      phase ^= 1;
    }
  }
}

template <bool kGateUp, int P>
__global__ void __launch_bounds__((kConsumers<P> + 1) * 32, kBlocksPerSm<P>) w2_product_kernel(MoeArgs a, int stages) {
  if (kGateUp) pdl_wait();  // grouping, passes, the split x and cleared counters come from prepare
  pdl_trigger();
  extern __shared__ __align__(128) uint8_t shared[];
  const ProductShape shape = product_shape(a, kGateUp);
  BlockWork w{};
  w.chunks = int(shape.chunks);
  w.tiles = int(shape.tiles);
  w.groups = (w.tiles + kTiles - 1) / kTiles;
  w.per_pass = int64_t(w.groups) * w.chunks;
  const int64_t units = int64_t(a.active_count[1]) * w.per_pass;
  if (int64_t(blockIdx.x) >= units) {  // also no work at all
    pdl_wait();  // every thread waits (launch.cuh), so the next kernel's wait covers the previous
    return;
  }
  w.part = {units, min(units, int64_t(gridDim.x))};
  w.u0 = w.part.start(blockIdx.x);
  w.u1 = w.part.start(blockIdx.x + 1);
  const ProductLayout layout = product_layout<P>(stages);
  uint8_t* ring = shared;
  float* sums = reinterpret_cast<float*>(shared + layout.stages * layout.stage_bytes);
  uint64_t* full = reinterpret_cast<uint64_t*>(sums + 2 * kGroupSumFloats<P>);
  uint64_t* empty = full + kMaxStages;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  if (threadIdx.x == 0) stage_barriers_init(full, empty, stages, kConsumers<P>);
  __syncthreads();
  if (warp == kConsumers<P>) {  // the producer: weights only, so down's starts before gate_up ends
    produce<kGateUp, P>(a, w, stages, ring, full, empty, lane);
    pdl_wait();
    return;
  }
  if (!kGateUp) pdl_wait();  // act comes from gate_up
  consume<kGateUp, P>(a, w, stages, ring, sums, full, empty, warp, lane);
}

// A product kernel's grid: every SM filled to kBlocksPerSm blocks (one if their shared memory
// does not fit), each with as many stages as its share of the SM's shared memory holds.
struct ProductLaunch {
  int64_t blocks;
  int stages;
  size_t shared;
};
template <bool kGateUp, int P>
const ProductLaunch& product_launch() {
  static const ProductLaunch launch = [] {
    int device = 0, sms = 0, per_sm = 0, per_block = 0;
    cudaGetDevice(&device);
    cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device);
    cudaDeviceGetAttribute(&per_sm, cudaDevAttrMaxSharedMemoryPerMultiprocessor, device);
    cudaDeviceGetAttribute(&per_block, cudaDevAttrMaxSharedMemoryPerBlockOptin, device);
    const ProductLayout no_ring = product_layout<P>(0);
    auto stages_in = [&](int64_t budget) {
      return int(std::min<int64_t>(kMaxStages, (budget - no_ring.bytes()) / no_ring.stage_bytes));
    };
    int stages = stages_in(std::min<int64_t>(per_block, per_sm / kBlocksPerSm<P> - 1024));
    if (stages < 2) stages = stages_in(per_block);
    const size_t shared = size_t(product_layout<P>(stages).bytes());
    cudaFuncSetAttribute(w2_product_kernel<kGateUp, P>, cudaFuncAttributeMaxDynamicSharedMemorySize, int(shared));
    int blocks = 0;
    cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, w2_product_kernel<kGateUp, P>, (kConsumers<P> + 1) * 32,
                                                  shared);
    return ProductLaunch{int64_t(sms) * std::max(blocks, 1), stages, shared};
  }();
  return launch;
}

template <int P>
int64_t partial_floats() {
  const int64_t blocks = std::max(product_launch<true, P>().blocks, product_launch<false, P>().blocks);
  return blocks * 2 * kTiles * P * kPairFloats;
}

template <bool kGateUp, int P>
void launch_product(const MoeArgs& a, cudaStream_t stream) {
  const ProductLaunch& l = product_launch<kGateUp, P>();
  launch_dependent_kernel<w2_product_kernel<kGateUp, P>>(dim3(unsigned(l.blocks)), dim3((kConsumers<P> + 1) * 32),
                                                         l.shared, 1, stream, a, l.stages);
}

template <int P>
void w2_products(const MoeArgs& a, cudaStream_t stream) {
  launch_product<true, P>(a, stream);
  launch_product<false, P>(a, stream);
}

// Item pairs per pass: the batch rounded up to a power of two pairs (at most 4); an expert gets
// at most one item per row, so decode takes one pass per expert.
int pairs_per_pass(int64_t rows) { return rows <= 2 ? 1 : rows <= 4 ? 2 : 4; }

}  // namespace

W2Scratch moe_w2_scratch(int64_t rows, int64_t top_k, int64_t experts, int64_t hidden, int64_t inner) {
  const int64_t items = rows * top_k, pairs = pairs_per_pass(rows);
  const int64_t passes = std::min(items, experts) + items / (2 * pairs) + 1;
  const int64_t partial = pairs == 1 ? partial_floats<1>() : pairs == 2 ? partial_floats<2>() : partial_floats<4>();
  const int64_t groups = (std::max(inner / 8, hidden / kW2TileRows) + kTiles - 1) / kTiles;
  return {passes, 2 * passes * groups * kTiles, partial, int(2 * pairs)};  // a counter per tile
}

void moe_w2_launch(const MoeArgs& a, cudaStream_t stream) {
  if (a.inner % kW2ChunkCols != 0)  // padding columns of act must read as zero
    cudaMemsetAsync(a.act_split, 0, size_t(a.rows * a.top_k * 3 * a.inner_padded) * sizeof(uint16_t), stream);
  const int64_t split_threads = std::max(a.rows * a.hidden_padded, a.tile_counters);
  w2_prepare_kernel<<<unsigned(1 + (split_threads + kPrepareThreads - 1) / kPrepareThreads), kPrepareThreads,
                      size_t(moe_group_shared_ints(a.experts, kPrepareThreads)) * sizeof(int32_t), stream>>>(a);
  switch (a.pass_items) {
    case 2: w2_products<1>(a, stream); break;
    case 4: w2_products<2>(a, stream); break;
    default: w2_products<4>(a, stream); break;
  }
}

}  // namespace moet::cuda
