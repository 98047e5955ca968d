// Profile gate kernel (see profile_gate.h).
#include "kernels/cuda/profile_gate.h"

namespace moet::cuda {
namespace {

__device__ __forceinline__ uint64_t global_ns() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

__global__ void profile_gate_kernel(const volatile uint32_t* flag, uint32_t value, uint64_t timeout_ns) {
  const uint64_t start = global_ns();
  while (int32_t(*flag - value) < 0) {
    if (global_ns() - start > timeout_ns) return;
    __nanosleep(256);
  }
}

}  // namespace

void profile_gate_launch(const volatile uint32_t* flag, uint32_t value, uint64_t timeout_ns, cudaStream_t stream) {
  profile_gate_kernel<<<1, 1, 0, stream>>>(flag, value, timeout_ns);
}

}  // namespace moet::cuda
