// How the split-K decode kernels (splitk_attention.cu: GQA, splitk_mla_attention.cu: MLA) cut a
// step: the splits of a row's keys and the rows of one launch. A row of n keys has
// min(kMaxSplits, ceil(n / kMinChunk)) splits of ceil(n / splits) keys rounded up to whole tiles
// of kSplitTileKeys (the last split may be short): functions of the row's own key count only, so a
// row's reduction tree, and its bits, depend neither on the other rows, nor on the batch, nor on
// the launches the rows are cut into. A launch's grid is (head groups, rows, splits of max_keys);
// blocks past a row's splits exit; the splits' partials are folded by a second kernel
// (splitk_fold.cu). One launch holds at most kMaxPartialFloats floats of partials.
#pragma once

#include "kernels/cuda/attention.h"
#include "kernels/cuda/launch.cuh"

#include <algorithm>
#include <cstdint>

namespace moet::cuda {

constexpr int kSplitTileKeys = 64;                       // keys of one block step
constexpr int64_t kMinChunk = 128;                       // keys per split, at least
constexpr int64_t kMaxSplits = 64;
constexpr int64_t kMaxPartialFloats = int64_t(1) << 26;  // scratch per launch (256 MiB)

__host__ __device__ constexpr int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

__host__ __device__ inline int64_t split_count(int64_t keys) {
  const int64_t n = ceil_div(keys, kMinChunk);
  return n < kMaxSplits ? n : kMaxSplits;
}
__host__ __device__ inline int64_t chunk_keys(int64_t keys) {
  return ceil_div(ceil_div(keys, split_count(keys)), kSplitTileKeys) * kSplitTileKeys;
}

struct SplitPlan {
  int heads;                // query heads per block
  int scale_offset;         // FP8 / NVFP4: byte offset of a slot's scales
  int64_t groups;           // blocks per row along x: head groups
  int64_t splits;           // blocks per (row, head group) along z: splits of a.max_keys keys
  int64_t width;            // floats per partial: m, l, 2 unused, O
  int64_t rows_per_launch;  // rows of one launch (partials within the cap)
  int64_t first_row;        // this launch's first row (of a.rows)
};

// The plan of a step whose blocks serve `heads` query heads each (the last group may be short).
inline SplitPlan split_plan(const AttentionArgs& a, int heads) {
  SplitPlan p{};
  p.heads = heads;
  p.scale_offset = int(kv_slot_layout(paged_kv_layout(a.cache)).scale_offset);
  p.groups = ceil_div(a.q_heads, heads);
  p.splits = split_count(std::max<int64_t>(a.max_keys, 1));
  p.width = a.cache.v_dim + 4;
  p.rows_per_launch = std::max<int64_t>(a.rows, 1);
  if (p.splits > 1) {
    const int64_t per_row = a.q_heads * p.splits * p.width;
    p.rows_per_launch = std::min(p.rows_per_launch, std::max<int64_t>(kMaxPartialFloats / per_row, 1));
  }
  return p;
}

// Scratch floats of a step's partials (0: no row of a.max_keys keys splits).
inline int64_t split_partial_floats(const AttentionArgs& a, const SplitPlan& p) {
  return p.splits == 1 ? 0 : std::min(p.rows_per_launch, a.rows) * a.q_heads * p.splits * p.width;
}

// Folds the partials the split kernel of launch p (its first `rows` rows) stored, into the rows'
// outputs (splitk_fold.cu); launched after it when p.splits > 1.
void splitk_fold_launch(const AttentionArgs& a, const SplitPlan& p, int64_t rows, cudaStream_t stream);

// The launches of a step, rows_per_launch rows each: Kernel(a, p) with p.first_row set, over
// `threads` threads and `shared` bytes of dynamic shared memory (opted in once per kernel), each
// followed by the fold of its split rows.
template <auto Kernel>
void launch_split(const AttentionArgs& a, SplitPlan p, int threads, size_t shared, cudaStream_t stream) {
  static const cudaError_t opt_in =  // once per kernel
      cudaFuncSetAttribute(Kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(shared));
  (void)opt_in;
  const int64_t per_launch = p.rows_per_launch;
  for (p.first_row = 0; p.first_row < a.rows; p.first_row += per_launch) {
    const int64_t rows = std::min(per_launch, a.rows - p.first_row);
    const dim3 grid(unsigned(p.groups), unsigned(rows), unsigned(p.splits));
    launch_dependent_kernel<Kernel>(grid, dim3(unsigned(threads)), shared, 1, stream, a, p);
    if (p.splits > 1) splitk_fold_launch(a, p, rows, stream);
  }
}

// Whether the device gives a block `bytes` of shared memory.
inline bool shared_memory_fits(size_t bytes) {
  int device = 0, shared = 0;
  return cudaGetDevice(&device) == cudaSuccess &&
         cudaDeviceGetAttribute(&shared, cudaDevAttrMaxSharedMemoryPerBlockOptin, device) == cudaSuccess &&
         size_t(shared) >= bytes;
}

inline bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15) == 0; }

}  // namespace moet::cuda
