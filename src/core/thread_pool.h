// A fixed pool of worker threads for data-parallel loops. parallel_for splits [0, n) into
// contiguous chunks and blocks until all are done; the calling thread takes part. Work items
// must not depend on which thread runs them, so results are identical for any thread count.
#pragma once

#include <condition_variable>
#include <cstddef>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace moet {

class ThreadPool {
 public:
  // threads <= 0 means one per hardware core.
  explicit ThreadPool(int threads = 0);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int size() const { return int(workers_.size()) + 1; }

  // Calls body(begin, end) over disjoint chunks covering [0, n), at least `grain` items each.
  void parallel_for(size_t n, const std::function<void(size_t, size_t)>& body, size_t grain = 1);

 private:
  void worker_loop(int index);

  std::vector<std::thread> workers_;
  std::mutex mutex_;
  std::condition_variable work_ready_;
  std::condition_variable work_done_;
  const std::function<void(size_t, size_t)>* body_ = nullptr;
  size_t n_ = 0;
  size_t chunk_ = 0;
  size_t generation_ = 0;
  int pending_ = 0;
  bool stop_ = false;
};

}  // namespace moet
