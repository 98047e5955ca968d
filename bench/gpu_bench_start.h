// The common start of the CUDA microbenchmarks (cuda_*_bench.cpp): a CUDA backend and the
// device-to-device copy bandwidth measured in the same run, the ceiling every bench prints its
// GB/s against. Without a visible GPU it says so and the bench exits 0 (CI builds and runs them).
#pragma once

#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/device_info.h"

#include <cstdio>
#include <memory>

namespace moet {

struct CudaBenchStart {
  std::unique_ptr<Backend> backend;  // null: no GPU
  double copy_gbs = 0.0;
};

inline CudaBenchStart start_cuda_bench(const char* name, size_t copy_bytes = size_t(2) << 30) {
  if (cuda_devices().empty()) {
    std::printf("%s: no CUDA GPU visible; nothing to measure\n", name);
    return {};
  }
  CudaBenchStart start{cuda_backend_create({}), 0.0};
  start.copy_gbs = start.backend->copy_bandwidth(copy_bytes);
  std::printf("%s\ndevice-to-device copy: %.1f GB/s (read + write)\n", start.backend->name().c_str(), start.copy_gbs);
  return start;
}

}  // namespace moet
