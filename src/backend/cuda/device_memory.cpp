// Caching device allocator (see device_memory.h).
#include "backend/cuda/device_memory.h"

#include "backend/cuda/cuda_check.h"

#include <cuda_runtime_api.h>

namespace moet {
namespace {

size_t size_class(size_t bytes) {
  const size_t granule = bytes <= (size_t(1) << 20) ? 512 : (size_t(128) << 10);
  return (std::max<size_t>(bytes, 1) + granule - 1) / granule * granule;
}

double gib(size_t bytes) { return double(bytes) / double(size_t(1) << 30); }

}  // namespace

DeviceMemory::DeviceMemory(size_t budget_bytes) : pool_(std::make_shared<Pool>()) { pool_->budget = budget_bytes; }

size_t DeviceMemory::reserved() const {
  std::lock_guard<std::mutex> lock(pool_->mutex);
  return pool_->reserved;
}

void DeviceMemory::Pool::release_cached() {
  for (auto& [size, block] : free) {
    cudaFree(block);
    reserved -= size;
  }
  free.clear();
}

DeviceMemory::Pool::~Pool() { release_cached(); }

std::shared_ptr<void> DeviceMemory::allocate(size_t bytes) {
  const size_t size = size_class(bytes);
  std::shared_ptr<Pool> pool = pool_;
  std::lock_guard<std::mutex> lock(pool->mutex);
  void* block = nullptr;
  if (auto it = pool->free.find(size); it != pool->free.end()) {
    block = it->second;
    pool->free.erase(it);
  } else {
    if (pool->reserved + size > pool->budget) pool->release_cached();
    MOET_CHECK(pool->reserved + size <= pool->budget,
               "GPU memory budget exhausted: {:.2f} GiB in use + {:.3f} GiB asked > {:.2f} GiB "
               "(raise --gpu-memory-limit / --gpu-memory-utilization)",
               gib(pool->reserved), gib(size), gib(pool->budget));
    if (cudaMalloc(&block, size) != cudaSuccess) {
      cudaGetLastError();
      pool->release_cached();
      cuda_check(cudaMalloc(&block, size), "cudaMalloc");
    }
    pool->reserved += size;
  }
  return std::shared_ptr<void>(block, [pool, size](void* p) {
    std::lock_guard<std::mutex> guard(pool->mutex);
    pool->free.emplace(size, p);
  });
}

}  // namespace moet
