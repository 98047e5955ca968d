// The read reference of read_regions.h. Warp w of W takes lines [w * L / W, (w + 1) * L / W) of
// the L 512-byte lines of the regions laid end to end; a line's lane-l load covers bytes 16l to
// 16l + 15 of it (lanes past a region's end load nothing); the warp's XOR is folded into *sink
// with one atomic (XOR commutes: the result does not depend on the split).
#include "kernels/cuda/read_regions.h"

#include "kernels/cuda/launch.cuh"
#include "kernels/cuda/streaming_load.cuh"

namespace moet::cuda {
namespace {

constexpr int kWarps = 8, kBlocksPerSm = 2, kDepth = 8;
constexpr int64_t kLineBytes = 512;

__global__ void __launch_bounds__(kWarps * 32) read_regions_kernel(ReadRegions r, uint32_t* sink) {
  pdl_trigger();
  pdl_wait();
  const int lane = threadIdx.x & 31;
  const int64_t warps = int64_t(gridDim.x) * kWarps, warp = int64_t(blockIdx.x) * kWarps + (threadIdx.x >> 5);
  const int64_t lines = r.first_line[r.count];
  const int64_t l0 = warp * lines / warps, l1 = (warp + 1) * lines / warps;
  int region = 0;
  while (region + 1 < r.count && r.first_line[region + 1] <= l0) ++region;
  uint32_t acc = 0;
  for (int64_t l = l0; l < l1; l += kDepth) {
    uint4 v[kDepth];
#pragma unroll
    for (int d = 0; d < kDepth; ++d) {
      v[d] = make_uint4(0u, 0u, 0u, 0u);
      const int64_t line = l + d;
      if (line >= l1) continue;
      while (line >= r.first_line[region + 1]) ++region;
      const int64_t offset = (line - r.first_line[region]) * kLineBytes + 16 * lane;
      const auto* at = static_cast<const uint8_t*>(r.data[region]) + offset;
      if (offset < r.bytes[region]) v[d] = load_streaming(reinterpret_cast<const uint4*>(at));
    }
#pragma unroll
    for (int d = 0; d < kDepth; ++d) acc ^= v[d].x ^ v[d].y ^ v[d].z ^ v[d].w;
  }
  for (int offset = 16; offset > 0; offset >>= 1) acc ^= __shfl_xor_sync(0xffffffffu, acc, offset);
  if (lane == 0 && acc != 0) atomicXor(sink, acc);
}

}  // namespace

void read_regions_index(ReadRegions& r) {
  r.first_line[0] = 0;
  for (int i = 0; i < r.count; ++i) r.first_line[i + 1] = r.first_line[i] + (r.bytes[i] + kLineBytes - 1) / kLineBytes;
}

void read_regions_launch(const ReadRegions& r, uint32_t* sink, cudaStream_t stream) {
  static const int sms = [] {
    int device = 0, count = 0;
    cudaGetDevice(&device);
    cudaDeviceGetAttribute(&count, cudaDevAttrMultiProcessorCount, device);
    return count;
  }();
  launch_dependent_kernel<read_regions_kernel>(dim3(unsigned(sms * kBlocksPerSm)), dim3(kWarps * 32), 0, 1, stream, r,
                                               sink);
}

}  // namespace moet::cuda
