// Device memory for the CUDA backend: a caching allocator under a byte budget. Blocks are
// rounded to size classes (512 B below 1 MiB, 128 KiB above) and kept on a free list when their
// last Tensor dies, to be handed out again for the same class (activations recur with the same
// shapes every step). Reuse is safe without events because the backend issues all work on one
// stream: a block freed by the host is only reused by work enqueued after the work that used it.
// Exceeding the budget first releases the cached blocks, then fails with a one-line Error.
#pragma once

#include <cstddef>
#include <map>
#include <memory>
#include <mutex>

namespace moet {

class DeviceMemory {
 public:
  explicit DeviceMemory(size_t budget_bytes);
  // A block of at least `bytes` bytes (256-byte aligned); freed back to the cache on release.
  std::shared_ptr<void> allocate(size_t bytes);
  size_t budget() const { return pool_->budget; }
  size_t reserved() const;

 private:
  struct Pool {
    std::mutex mutex;
    std::multimap<size_t, void*> free;  // size class -> block
    size_t reserved = 0;
    size_t budget = 0;
    void release_cached();              // caller holds the mutex
    ~Pool();
  };
  std::shared_ptr<Pool> pool_;  // shared with every block's deleter, so blocks may outlive this
};

}  // namespace moet
