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

DeviceMemory::Private::~Private() {
  std::lock_guard<std::mutex> lock(parent->mutex);
  parent->free.insert(free.begin(), free.end());
}

void* DeviceMemory::take(Pool& pool, size_t size, bool may_release) {
  if (auto it = pool.free.find(size); it != pool.free.end()) {
    void* block = it->second;
    pool.free.erase(it);
    return block;
  }
  if (pool.reserved + size > pool.budget) {
    if (!may_release) return nullptr;
    pool.release_cached();
    if (pool.reserved + size > pool.budget) return nullptr;
  }
  void* block = nullptr;
  if (cudaMalloc(&block, size) != cudaSuccess) {
    cudaGetLastError();
    if (!may_release) return nullptr;
    pool.release_cached();
    cuda_check(cudaMalloc(&block, size), "cudaMalloc");
  }
  pool.reserved += size;
  return block;
}

std::shared_ptr<void> DeviceMemory::allocate(size_t bytes) {
  const size_t size = size_class(bytes);
  std::shared_ptr<Pool> pool = pool_;
  for (int attempt = 0;; ++attempt) {
    std::unique_lock<std::mutex> lock(pool->mutex);
    std::shared_ptr<Private> priv =
        pool->active && pool->active_thread == std::this_thread::get_id() ? pool->active : nullptr;
    void* block = nullptr;
    if (priv) {
      if (auto it = priv->free.find(size); it != priv->free.end()) {
        block = it->second;
        priv->free.erase(it);
      } else {
        block = take(*pool, size, false);
      }
    } else {
      // First try without releasing the cache: the pressure handler may free graph memory.
      block = take(*pool, size, attempt > 0 || !pressure_);
    }
    if (block != nullptr) {
      if (priv) {
        return std::shared_ptr<void>(block, [priv, size](void* p) {
          std::lock_guard<std::mutex> guard(priv->parent->mutex);
          priv->free.emplace(size, p);
        });
      }
      return std::shared_ptr<void>(block, [pool, size](void* p) {
        std::lock_guard<std::mutex> guard(pool->mutex);
        pool->free.emplace(size, p);
      });
    }
    MOET_CHECK(!priv && attempt == 0 && pressure_,
               "GPU memory budget exhausted: {:.2f} GiB in use + {:.3f} GiB asked > {:.2f} GiB "
               "(raise --gpu-memory-limit / --gpu-memory-utilization)",
               gib(pool->reserved), gib(size), gib(pool->budget));
    lock.unlock();
    pressure_();
  }
}

std::shared_ptr<void> DeviceMemory::begin_private() {
  auto priv = std::make_shared<Private>();
  priv->parent = pool_;
  std::lock_guard<std::mutex> lock(pool_->mutex);
  MOET_CHECK(!pool_->active, "a private device-memory pool is already active");
  pool_->active = priv;
  pool_->active_thread = std::this_thread::get_id();
  return priv;
}

void DeviceMemory::end_private() {
  std::shared_ptr<Private> done;  // dies after the lock is released (~Private takes it)
  std::lock_guard<std::mutex> lock(pool_->mutex);
  done = std::move(pool_->active);
  pool_->active_thread = {};
}

}  // namespace moet
