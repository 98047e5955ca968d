// What benchmarks and diagnostics ask of a backend besides the model's ops: the copy bandwidth
// of the memory it computes from (the roofline every benchmark ratio is against), a launch that
// only reads given regions (the read ceiling of a kernel's own bytes, cuda_moe_bench), and the
// per-op profile (`moet bench --profile`). The CPU and CUDA backends implement it beside
// Backend; bench_ops() finds it.
#pragma once

#include "backend/backend.h"

#include <algorithm>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace moet {

// One row of the per-op profile: an op and its shape class ("matmul[n=151936,k=4096]"), how many
// calls and the time they took (the CUDA backend: GPU time between CUDA events around the op).
struct OpProfile {
  std::string op;
  int64_t calls = 0;
  double seconds = 0.0;
};

// A backend's accumulated profile (op name -> totals) as take_profile() returns it, most time
// first (ties by name), leaving the accumulator empty.
inline std::vector<OpProfile> drain_profile(std::map<std::string, OpProfile>& profile) {
  std::vector<OpProfile> out;
  for (auto& [name, entry] : profile) out.push_back(entry);
  profile.clear();
  std::sort(out.begin(), out.end(), [](const OpProfile& a, const OpProfile& b) {
    return a.seconds != b.seconds ? a.seconds > b.seconds : a.op < b.op;
  });
  return out;
}

// Memory a backend owns (device memory on the CUDA backend), for BenchOps::read_regions.
struct ByteRegion {
  const void* data;
  int64_t bytes;
};

// Regions one BenchOps::read_regions call takes (the CUDA kernel's argument holds them).
constexpr size_t kReadRegionsMax = 256;

// Checks the operands of BenchOps::read_regions.
inline void check_read_regions(const std::vector<ByteRegion>& regions, const Tensor& sink) {
  MOET_CHECK(regions.size() <= kReadRegionsMax && sink.dtype == DType::i32 && sink.numel() == 1,
             "read_regions takes at most {} regions and a one-int sink ({} regions)", kReadRegionsMax,
             regions.size());
  for (const ByteRegion& r : regions)
    MOET_CHECK(reinterpret_cast<uintptr_t>(r.data) % 16 == 0 && r.bytes % 16 == 0 && r.bytes >= 0,
               "read_regions: regions must be 16-byte aligned multiples of 16 bytes ({} bytes)", r.bytes);
}

class BenchOps {
 public:
  virtual ~BenchOps() = default;
  // Best-of-several copy of `bytes` bytes inside the memory the backend computes from; returns
  // GB/s counting bytes read + written (the roofline the benchmarks compare against).
  virtual double copy_bandwidth(size_t bytes) = 0;
  // Best-of-several copy of `bytes` bytes from page-locked host memory into the backend's memory
  // (the ceiling of an expert fetch); GB/s of bytes moved. The CPU backend: a host copy.
  virtual double upload_bandwidth(size_t bytes) = 0;
  // A bandwidth reference for benchmarks: reads every byte of the regions (16-byte aligned,
  // multiples of 16 bytes, at most 256) once, in one launch on the GPU; sink (one I32) = the XOR
  // of all their 32-bit words.
  virtual void read_regions(const std::vector<ByteRegion>& regions, Tensor& sink) = 0;
  // Per-op profile of the ops run while on (a captured graph's replay counts as one op,
  // "cuda_graph[rows=N]"); take_profile() returns what was gathered since the last call, most
  // time first, and clears it. Profiling never changes results.
  virtual void set_profiling(bool on) = 0;
  virtual std::vector<OpProfile> take_profile() = 0;
};

// The backend's BenchOps (every backend moet builds has them); fails with a clear error otherwise.
BenchOps& bench_ops(Backend& backend);

}  // namespace moet
