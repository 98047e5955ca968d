// How one GEMV launch (gemv.h) lays its parts out over the grid, shared by the CUDA-core kernel
// (gemv.cu) and the tensor-core one (gemv_mma.cu): the parts in launch order (smaller first, so
// they finish early instead of forming the launch's tail; equal ones keep their order), each
// with a contiguous range of blocks per problem and its own split of k (S = 1 << split_shift,
// picked from the part's own shape only, so a part's bits never depend on what else its launch
// holds). A block finds its part with constant indices only (no dynamic index into the
// parameters, which would copy them to local memory).
#pragma once

#include "kernels/cuda/gemv.h"

#include <cstdint>
#include <utility>

namespace moet::cuda {

struct GemvPlan {
  int split_shift[kGemvMaxParts];
  uint32_t blocks[kGemvMaxParts];       // per problem
  uint32_t first_block[kGemvMaxParts];  // of the part's first problem
};

// The plan (the kernel's parameter) and its totals.
struct GemvLayout {
  GemvPlan plan;
  uint32_t blocks;
  int64_t warps;  // with work: every column group's S warps
};

// Sorts a.parts into launch order and plans them: a block holds `warps_per_block` warps, a
// column group is `group_cols` output columns, and split_shift(part) gives each part's S.
template <typename SplitShift>
GemvLayout plan_gemv(GemvArgs& a, int warps_per_block, int64_t group_cols, SplitShift&& split_shift) {
  const auto size = [](const GemvPart& part) { return part.n * part.batch; };
  for (int p = 1; p < a.part_count; ++p)
    for (int at = p; at > 0 && size(a.parts[at - 1]) > size(a.parts[at]); --at) std::swap(a.parts[at - 1], a.parts[at]);
  GemvLayout layout{};
  GemvPlan& plan = layout.plan;
  for (int p = 0; p < a.part_count; ++p) {
    const GemvPart& part = a.parts[p];
    plan.split_shift[p] = split_shift(part);
    const int64_t cols_per_block = group_cols * (warps_per_block >> plan.split_shift[p]);
    const int64_t groups = (part.n + group_cols - 1) / group_cols * part.batch;
    plan.blocks[p] = uint32_t((part.n + cols_per_block - 1) / cols_per_block);
    plan.first_block[p] = layout.blocks;
    layout.blocks += plan.blocks[p] * uint32_t(part.batch);
    layout.warps += groups << plan.split_shift[p];
  }
  return layout;
}

#ifdef __CUDACC__
// This block of the grid: block `block` of problem `b` of `part`, whose S is 1 << split_shift.
__device__ __forceinline__ void gemv_block_of(const GemvArgs& a, const GemvPlan& plan, GemvPart& part, int64_t& b,
                                              int64_t& block, int& split_shift) {
  part = a.parts[0];
  uint32_t first = 0, per_problem = plan.blocks[0];
  split_shift = plan.split_shift[0];
#pragma unroll
  for (int q = 1; q < kGemvMaxParts; ++q)
    if (q < a.part_count && blockIdx.x >= plan.first_block[q]) {
      part = a.parts[q];
      first = plan.first_block[q];
      per_problem = plan.blocks[q];
      split_shift = plan.split_shift[q];
    }
  const uint32_t local = blockIdx.x - first;
  b = local / per_problem;
  block = local % per_problem;
}
#endif

}  // namespace moet::cuda
