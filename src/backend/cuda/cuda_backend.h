// The CUDA backend's factory, in plain C++ (no CUDA headers), so the CLI and tests can create it
// without including CUDA. Only built when nvcc is found (MOET_HAVE_CUDA is then defined for
// everything that links moet_backend_cuda).
#pragma once

#include "backend/backend.h"

#include <memory>

namespace moet {

struct CudaBackendOptions {
  int device = 0;
  double memory_utilization = 0.9;  // fraction of the card's memory moet may take
  double memory_limit_gib = 0.0;    // > 0: an absolute cap instead (a large card standing in for a small one)
  bool graphs = true;               // capture/replay run_graph() forwards as CUDA graphs (--cuda-graphs)
  // Products of at least this many rows with BF16 or FP8-block weights run on the tensor cores (cuBLASLt);
  // 0: never.
  int64_t gemm_min_rows = 16;
  int64_t max_graphs = 32;          // captured graphs kept (least recently used dropped first)
  bool sync_every_op = false;       // synchronise and check after every op (debugging a faulting kernel)
  bool profile = false;             // the per-op profile on from the start (BenchOps::set_profiling)
};

// Throws moet::Error when no usable GPU is present.
std::unique_ptr<Backend> cuda_backend_create(const CudaBackendOptions& options);

}  // namespace moet
