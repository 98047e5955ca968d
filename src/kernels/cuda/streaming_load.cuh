// Loads of data a kernel reads once (weights streamed from memory): through the read-only path
// and not kept in L1, which stays free for what is re-read (activations). The data must not be
// written during the kernel.
#pragma once

#include <cuda_runtime.h>

namespace moet::cuda {

__device__ __forceinline__ uint4 load_streaming(const uint4* p) {
  uint4 v;
  asm("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
      : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
      : "l"(p));
  return v;
}
__device__ __forceinline__ uint2 load_streaming(const uint2* p) {
  uint2 v;
  asm("ld.global.nc.L1::no_allocate.v2.u32 {%0, %1}, [%2];" : "=r"(v.x), "=r"(v.y) : "l"(p));
  return v;
}

}  // namespace moet::cuda
