// The grouping step of the routed experts (moe.h, step 1), shared by the dense, MXFP4 and W2
// paths: items (row * top_k + slot) grouped by expert, experts in index order and items in item
// order inside each (a stable counting sort), run by one block with `count` as [experts] ints of
// shared memory. Items naming no valid expert are dropped (they contribute nothing).
#pragma once

#include "kernels/cuda/moe.h"

namespace moet::cuda {

__device__ __forceinline__ void moe_group_block(const MoeArgs& a, int32_t* count) {
  const int items = int(a.rows * a.top_k), experts = int(a.experts);
  for (int e = threadIdx.x; e < experts; e += blockDim.x) {
    int c = 0;
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
    int pos = count[e];
    for (int i = 0; i < items; ++i)
      if (a.expert_ids[i] == e) a.order[pos++] = i;
  }
}

}  // namespace moet::cuda
