// What CUDA devices this process can see, in plain C++ (no CUDA headers), so that the CLI can
// report them. Returns an empty list (never throws) when the driver or a GPU is absent. Also a
// device-wide synchronisation for tests that launch kernels outside a backend.
#pragma once

#include <string>
#include <vector>

namespace moet {

struct CudaDeviceInfo {
  int index;
  std::string name;
  int compute_major, compute_minor;
  size_t memory_bytes;
};

std::vector<CudaDeviceInfo> cuda_devices();

// Waits for all work on the current device; false when it ended in a CUDA error.
bool cuda_device_synchronize();

}  // namespace moet
