// The CPU backend: host memory, a thread pool (threads = cores by default), and the ops of
// backend.h implemented with kernels/cpu (AVX2 where available, scalar otherwise).
#pragma once

#include "backend/backend.h"
#include "core/thread_pool.h"

#include <memory>

namespace moet {

std::unique_ptr<Backend> cpu_backend_create(int threads);

}  // namespace moet
