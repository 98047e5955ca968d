// Device memory for the CUDA backend: a caching allocator under a byte budget. Blocks are
// rounded to size classes (512 B below 1 MiB, 128 KiB above) and kept on a free list when their
// last Tensor dies, to be handed out again for the same class (activations recur with the same
// shapes every step). Reuse is safe without events because the backend issues all work on one
// stream: a block freed by the host is only reused by work enqueued after the work that used it.
// Exceeding the budget first asks the pressure handler to let go of memory (the backend drops its
// CUDA graphs), then releases the cached blocks, then fails with a one-line Error.
//
// Private pools (CUDA-graph capture): between begin_private() and end_private(), the calling
// thread's allocations come from a pool of their own: a block freed then goes back to that pool
// and is handed out again only by it (so within one capture memory is reused in stream order),
// and the pool's blocks return to the shared cache only when the pool dies, i.e. when the graph
// holding it is destroyed and no tensor of it is left. So memory a graph reads and writes at
// replay time is never given to other work.
#pragma once

#include <cstddef>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <thread>

namespace moet {

class DeviceMemory {
 public:
  explicit DeviceMemory(size_t budget_bytes);
  // A block of at least `bytes` bytes (256-byte aligned); freed back to the cache on release.
  std::shared_ptr<void> allocate(size_t bytes);
  size_t budget() const { return pool_->budget; }
  size_t reserved() const;

  // Called (without any lock held, never during a private pool) when an allocation would exceed
  // the budget, before the cached blocks are released.
  void set_pressure_handler(std::function<void()> handler) { pressure_ = std::move(handler); }

  // Starts routing this thread's allocations to a new private pool; the handle keeps the pool
  // (and so its blocks) alive. While a private pool is active, over-budget allocations fail
  // instead of releasing cached blocks (cudaFree would synchronise inside a capture).
  std::shared_ptr<void> begin_private();
  void end_private();

 private:
  struct Private;
  struct Pool {
    std::mutex mutex;
    std::multimap<size_t, void*> free;  // size class -> block
    size_t reserved = 0;
    size_t budget = 0;
    std::shared_ptr<Private> active;    // the private pool allocations go to, if any
    std::thread::id active_thread;      // ... for allocations from this thread
    void release_cached();              // caller holds the mutex
    ~Pool();
  };
  struct Private {
    std::shared_ptr<Pool> parent;
    std::multimap<size_t, void*> free;
    ~Private();  // hands its blocks to the parent's cache
  };
  // A new block of `size` bytes from the cache or cudaMalloc; caller holds the mutex. Returns
  // null when over budget (after releasing the cache, if allowed).
  void* take(Pool& pool, size_t size, bool may_release);

  std::shared_ptr<Pool> pool_;  // shared with every block's deleter, so blocks may outlive this
  std::function<void()> pressure_;
};

}  // namespace moet
