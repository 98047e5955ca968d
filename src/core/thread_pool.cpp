// ThreadPool implementation: one shared job at a time, chunk i of the job goes to thread i.
#include "core/thread_pool.h"

#include <algorithm>

namespace moet {

ThreadPool::ThreadPool(int threads) {
  if (threads <= 0) threads = int(std::max(1u, std::thread::hardware_concurrency()));
  for (int i = 1; i < threads; ++i) workers_.emplace_back([this, i] { worker_loop(i); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_ = true;
  }
  work_ready_.notify_all();
  for (auto& worker : workers_) worker.join();
}

void ThreadPool::parallel_for(size_t n, const std::function<void(size_t, size_t)>& body,
                              size_t grain) {
  if (n == 0) return;
  const size_t threads = size_t(size());
  const size_t chunk = std::max(std::max<size_t>(grain, 1), (n + threads - 1) / threads);
  if (workers_.empty() || chunk >= n) {
    body(0, n);
    return;
  }
  {
    std::lock_guard<std::mutex> lock(mutex_);
    body_ = &body;
    n_ = n;
    chunk_ = chunk;
    pending_ = int(workers_.size());
    ++generation_;
  }
  work_ready_.notify_all();
  body(0, std::min(chunk, n));
  std::unique_lock<std::mutex> lock(mutex_);
  work_done_.wait(lock, [this] { return pending_ == 0; });
  body_ = nullptr;
}

void ThreadPool::worker_loop(int index) {
  size_t seen = 0;
  for (;;) {
    const std::function<void(size_t, size_t)>* body;
    size_t begin, end;
    {
      std::unique_lock<std::mutex> lock(mutex_);
      work_ready_.wait(lock, [&] { return stop_ || generation_ != seen; });
      if (stop_) return;
      seen = generation_;
      body = body_;
      begin = std::min(n_, chunk_ * size_t(index));
      end = std::min(n_, begin + chunk_);
    }
    if (begin < end) (*body)(begin, end);
    std::lock_guard<std::mutex> lock(mutex_);
    if (--pending_ == 0) work_done_.notify_one();
  }
}

}  // namespace moet
