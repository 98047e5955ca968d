// A bandwidth reference for the benchmarks: one launch that reads every byte of up to
// kMaxReadRegions device regions once, with nothing but loads (16 bytes per lane, 8 loads in
// flight per lane, 16 warps per SM, each warp one contiguous range of the regions laid end to end:
// the fastest pattern of tools/gpu/stream_read_ceiling.cu), and XORs their 32-bit words into
// *sink (which must be zero). cuda_moe_bench times it on exactly the expert bytes an MoE call
// reads: the most any kernel could do for that call's bytes in one launch.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace moet::cuda {

constexpr int kMaxReadRegions = 256;

struct ReadRegions {
  const void* data[kMaxReadRegions];     // 16-byte aligned
  int64_t bytes[kMaxReadRegions];        // multiples of 16
  int64_t first_line[kMaxReadRegions + 1];  // prefix sums of 512-byte lines (a warp-wide load each)
  int count = 0;
};

// Fills first_line from bytes (count regions).
void read_regions_index(ReadRegions& r);
void read_regions_launch(const ReadRegions& r, uint32_t* sink, cudaStream_t stream);

}  // namespace moet::cuda
