// WorkerPool implementation (see worker_pool.h). Threads are detached and counted; the
// destructor waits for the count to reach zero, so no thread outlives the pool.
#include "server/worker_pool.h"

#include "core/log.h"

#include <chrono>
#include <exception>
#include <thread>

namespace moet::server {

WorkerPool::WorkerPool(size_t keep_idle) : keep_idle_(keep_idle) {}

WorkerPool::~WorkerPool() {
  std::unique_lock lock(mutex_);
  stopping_ = true;
  wake_.notify_all();
  changed_.wait(lock, [&] { return threads_ == 0; });
}

void WorkerPool::submit(std::function<void()> task) {
  std::lock_guard lock(mutex_);
  tasks_.push_back(std::move(task));
  if (idle_ >= tasks_.size()) {
    wake_.notify_one();
    return;
  }
  ++threads_;
  std::thread([this] { work(); }).detach();
}

void WorkerPool::work() {
  std::unique_lock lock(mutex_);
  while (true) {
    if (!tasks_.empty()) {
      std::function<void()> task = std::move(tasks_.front());
      tasks_.pop_front();
      ++running_;
      lock.unlock();
      try {
        task();
      } catch (const std::exception& e) {  // handlers catch their own errors; this is a last resort
        MOET_LOG_ERROR("HTTP worker: {}", e.what());
      }
      task = nullptr;
      lock.lock();
      --running_;
      changed_.notify_all();
      continue;
    }
    if (stopping_) break;
    ++idle_;
    const bool woken = wake_.wait_for(lock, std::chrono::seconds(60), [&] { return stopping_ || !tasks_.empty(); });
    --idle_;
    if (!woken && idle_ >= keep_idle_) break;
  }
  --threads_;
  changed_.notify_all();
}

bool WorkerPool::wait_idle(double seconds) {
  std::unique_lock lock(mutex_);
  return changed_.wait_for(lock, std::chrono::duration<double>(seconds),
                           [&] { return running_ == 0 && tasks_.empty(); });
}

size_t WorkerPool::busy() const {
  std::lock_guard lock(mutex_);
  return running_ + tasks_.size();
}

}  // namespace moet::server
