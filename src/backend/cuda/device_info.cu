// cuda_devices(): enumerates visible GPUs through the CUDA runtime; cuda_device_synchronize()
// (see device_info.h).
#include "backend/cuda/device_info.h"

#include <cuda_runtime.h>

namespace moet {

std::vector<CudaDeviceInfo> cuda_devices() {
  std::vector<CudaDeviceInfo> devices;
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    cudaGetLastError();  // clear the sticky "no driver / no device" error
    return devices;
  }
  for (int i = 0; i < count; ++i) {
    cudaDeviceProp prop{};
    if (cudaGetDeviceProperties(&prop, i) != cudaSuccess) continue;
    devices.push_back({i, prop.name, prop.major, prop.minor, prop.totalGlobalMem});
  }
  return devices;
}

bool cuda_device_synchronize() { return cudaDeviceSynchronize() == cudaSuccess; }

}  // namespace moet
