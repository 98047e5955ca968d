// The "last to finish combines" handshake of kernels whose warps or blocks each leave a partial
// result and the last to arrive adds them up (the W2 products' shared tile blocks, split
// attention rows). The caller's threads store their partials, synchronise (__syncwarp or
// __syncthreads), then one thread counts its arrival with count_arrival(): the release half
// publishes every partial the group stored before the barrier (release is cumulative over what
// the barrier ordered), and in the last arriver the acquire half makes every earlier group's
// partials visible to its threads after a second barrier. This replaces a __threadfence() before
// and after a relaxed atomicAdd (docs/gpu-history.md, Run 19: 1-2% of the W2 op at batch 1).
#pragma once

#include <cstdint>

namespace moet::cuda {

// Adds 1 to *counter at GPU scope with acquire-release order; returns the count before.
__device__ __forceinline__ uint32_t count_arrival(uint32_t* counter) {
  uint32_t before;
  asm volatile("atom.acq_rel.gpu.global.add.u32 %0, [%1], 1;" : "=r"(before) : "l"(counter) : "memory");
  return before;
}

}  // namespace moet::cuda
