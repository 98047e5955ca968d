// The CPU backend: host memory, a thread pool (threads = cores by default), and the ops of
// backend.h implemented with kernels/cpu, on the code path `isa` names (AVX2 where the CPU has
// it unless told otherwise; core/cpu_isa.h). It implements BenchOps too (bench_ops.h).
#pragma once

#include "backend/backend.h"
#include "core/cpu_isa.h"

#include <functional>
#include <memory>
#include <string>

namespace moet {

struct CpuBackendOptions {
  int threads = 0;  // 0: one per core
  CpuIsa isa = cpu_isa_best();
};

std::unique_ptr<Backend> cpu_backend_create(const CpuBackendOptions& options);

// Runs body() (work outside the backend's ops on its data: a collective of cpu_communicator.h) as
// op name() of the CPU backend's per-op profile while that is on.
void cpu_backend_profiled(Backend& backend, const std::function<std::string()>& name,
                          const std::function<void()>& body);

}  // namespace moet
