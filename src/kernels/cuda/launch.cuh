// Kernel launches with the sm_90 launch features, used where the kernel's binary has them:
// programmatic dependent launch (the kernel may be scheduled while the stream's previous kernel
// finishes; it must call pdl_wait() (below) before it reads or writes memory that an earlier
// kernel of the stream writes or reads, and may only touch constant data before. The next
// kernel's wait covers only this kernel's completion, which implies the earlier kernels' only if
// some thread of this one waited: threads may exit without waiting only where another thread of
// the grid waits or nothing later depends on the earlier kernels, as with the idle warps of the
// W2 down kernel) and thread-block clusters. Whether the binary is sm_90+ is asked of the kernel
// itself (cudaFuncGetAttributes: an sm_80 binary running on a newer GPU has no griddepcontrol /
// cluster instructions) once per kernel; one GPU architecture per process is assumed. Other
// binaries get a plain launch, where pdl_wait() and pdl_trigger() are no-ops; they must not ask
// for clusters. Also the grid of a grid-stride loop (grid_for).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace moet::cuda {

// Programmatic dependent launch: wait for the previous kernel's memory; let the next one start.
__device__ __forceinline__ void pdl_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}
__device__ __forceinline__ void pdl_trigger() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;");
#endif
}

template <auto Kernel>
bool kernel_is_sm90() {
  static const bool sm90 = [] {
    cudaFuncAttributes attributes{};
    return cudaFuncGetAttributes(&attributes, Kernel) == cudaSuccess && attributes.binaryVersion >= 90;
  }();
  return sm90;
}

// Launches Kernel<<<grid, block, shared, stream>>>(args...) as a programmatic dependent launch
// in clusters of `cluster` blocks along x (grid.x a multiple of it). Errors surface in
// cudaGetLastError().
template <auto Kernel, typename... Args>
void launch_dependent_kernel(dim3 grid, dim3 block, size_t shared, unsigned cluster, cudaStream_t stream,
                             Args... args) {
  if (!kernel_is_sm90<Kernel>()) {
    Kernel<<<grid, block, shared, stream>>>(args...);
    return;
  }
  cudaLaunchAttribute attributes[2] = {};
  attributes[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attributes[0].val.programmaticStreamSerializationAllowed = 1;
  attributes[1].id = cudaLaunchAttributeClusterDimension;
  attributes[1].val.clusterDim.x = cluster;
  attributes[1].val.clusterDim.y = attributes[1].val.clusterDim.z = 1;
  cudaLaunchConfig_t config{};
  config.gridDim = grid;
  config.blockDim = block;
  config.dynamicSmemBytes = shared;
  config.stream = stream;
  config.attrs = attributes;
  config.numAttrs = cluster > 1 ? 2 : 1;
  cudaLaunchKernelEx(&config, Kernel, args...);
}

// Blocks of `threads` for a grid-stride loop over n items: one item per thread, at most 65536
// blocks (later items wrap around), at least one block.
inline unsigned grid_for(int64_t n, int threads) {
  const int64_t blocks = (n + threads - 1) / threads;
  return unsigned(blocks < 65536 ? (blocks > 0 ? blocks : 1) : 65536);
}

}  // namespace moet::cuda
