// The grouping step of the routed experts (moe.h, step 1), shared by the dense, MXFP4 and W2
// paths: items (row * top_k + slot) grouped by expert, experts in index order and items in item
// order inside each (a stable sort), run by one block. Items naming no valid expert are dropped
// (they contribute nothing), and so are items whose expert another table or the host serves (moe.h); absent
// experts are grouped like present ones (moe.h). Up to blockDim.x items (every decode batch) are ranked one item per
// thread with no serial step; more items take a counting sort with one serial pass over the
// experts.
#pragma once

#include "kernels/cuda/moe.h"

namespace moet::cuda {

// silu(gate) * up, with DeepSeek-V4's SwiGLU clamp when limit > 0 (gate at most limit, up in
// [-limit, limit]; kernels/cpu/elementwise.h silu_mul): the gate_up epilogue of every format.
__device__ __forceinline__ float moe_swiglu(float gate, float up, float limit) {
  if (limit > 0.0f) {
    gate = fminf(gate, limit);
    up = fminf(fmaxf(up, -limit), limit);
  }
  return gate / (1.0f + expf(-gate)) * up;
}

// Whether items naming expert e run in this table's pass.
__device__ __forceinline__ bool moe_item_runs(const MoeArgs& a, int e) {
  if (e < 0 || e >= a.experts) return false;
  const int32_t presence = a.table[e].present;
  return presence != kServedElsewhere && presence != kHostComputed;
}

// items <= blockDim.x: item i's position is the number of valid items before it in (expert,
// item) order; the first item of each expert opens its slot, the slot index being the number of
// distinct smaller experts. `shared`: 2 * blockDim.x ints.
__device__ __forceinline__ void moe_group_ranked(const MoeArgs& a, int32_t* shared) {
  const int items = int(a.rows * a.top_k), i = threadIdx.x;
  int32_t* ids = shared;                 // valid expert or -1, per item
  int32_t* opens = shared + blockDim.x;  // 1 where the item is its expert's first
  const int e = i < items ? a.expert_ids[i] : -1;
  const bool valid = moe_item_runs(a, e);
  ids[i] = valid ? e : -1;
  __syncthreads();
  int rank = 0, start = 0;
  bool first = valid;
  for (int j = 0; j < items; ++j) {
    const int f = ids[j];
    if (f < 0) continue;
    rank += f < e || (f == e && j < i);
    start += f < e;
    first = first && !(f == e && j < i);
  }
  opens[i] = first;
  const int active = __syncthreads_count(first), total = __syncthreads_count(valid);
  int slot = 0;
  for (int j = 0; j < items; ++j) slot += opens[j] && ids[j] < e;
  if (valid) a.order[rank] = i;
  if (first) {
    a.active[slot] = e;
    a.ranges[slot] = start;
  }
  if (i == 0) {
    a.ranges[active] = total;
    a.active_count[0] = active;
  }
  __syncthreads();
}

__device__ __forceinline__ void moe_group_counted(const MoeArgs& a, int32_t* count) {
  const int items = int(a.rows * a.top_k), experts = int(a.experts);
  for (int e = threadIdx.x; e < experts; e += blockDim.x) {
    int c = 0;
    if (moe_item_runs(a, e))
      for (int i = 0; i < items; ++i) c += a.expert_ids[i] == e;
    count[e] = c;
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    int start = 0, active = 0;
    for (int e = 0; e < experts; ++e) {
      const int c = count[e];
      if (c > 0) {
        a.active[active] = e;
        a.ranges[active] = start;
        ++active;
      }
      count[e] = start;  // becomes the expert's first position
      start += c;
    }
    a.ranges[active] = start;
    *a.active_count = active;
  }
  __syncthreads();
  for (int e = threadIdx.x; e < experts; e += blockDim.x) {
    if (!moe_item_runs(a, e)) continue;
    int pos = count[e];
    for (int i = 0; i < items; ++i)
      if (a.expert_ids[i] == e) a.order[pos++] = i;
  }
  __syncthreads();
}

// `count`: moe_group_shared_ints(experts, blockDim.x) ints of shared memory.
__host__ __device__ inline int64_t moe_group_shared_ints(int64_t experts, int64_t threads) {
  return experts > 2 * threads ? experts : 2 * threads;
}
__device__ __forceinline__ void moe_group_block(const MoeArgs& a, int32_t* count) {
  if (a.rows * a.top_k <= blockDim.x) {
    moe_group_ranked(a, count);
  } else {
    moe_group_counted(a, count);
  }
}

}  // namespace moet::cuda
