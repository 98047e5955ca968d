// cuda_check(): turns a failed CUDA runtime call into a moet::Error naming what was being done.
// Internal to backend/cuda.
#pragma once

#include "core/error.h"

#include <cuda_runtime_api.h>

namespace moet {

inline void cuda_check(cudaError_t status, const char* what) {
  if (status != cudaSuccess) fail("CUDA error during {}: {} ({})", what, cudaGetErrorString(status), int(status));
}

}  // namespace moet
