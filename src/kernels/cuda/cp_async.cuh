// Asynchronous global-to-shared copies (cp.async, sm_80+) in groups: a thread issues copies,
// commits them as a group, and waits for its groups before the block's barrier publishes them.
#pragma once

#include <cuda_runtime.h>

namespace moet::cuda {

__device__ __forceinline__ unsigned shared_address(const void* p) {
  return static_cast<unsigned>(__cvta_generic_to_shared(p));
}
// 16 bytes, bypassing L1 (both addresses 16-byte aligned; dst as a shared-memory address).
__device__ __forceinline__ void cp_async16(unsigned dst, const void* src) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(dst), "l"(src) : "memory");
}
__device__ __forceinline__ void cp_async16(void* dst, const void* src) { cp_async16(shared_address(dst), src); }
// 4 bytes (both addresses 4-byte aligned).
__device__ __forceinline__ void cp_async4(void* dst, const void* src) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4;\n" ::"r"(shared_address(dst)), "l"(src) : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
// Waits until at most N of this thread's copy groups are pending.
template <int N>
__device__ __forceinline__ void cp_async_wait_pending() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}
// Waits for this thread's copy groups but the newest one.
__device__ __forceinline__ void cp_async_wait_all_but_newest() { cp_async_wait_pending<1>(); }
// Waits for all of this thread's copy groups.
__device__ __forceinline__ void cp_async_wait_all() { cp_async_wait_pending<0>(); }

}  // namespace moet::cuda
