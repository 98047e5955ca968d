// WorkerPool: threads for the HTTP handlers. An admitted request (headers and body fully read)
// always gets a thread at once: submit() hands the task to an idle worker or starts a new one, so
// a handler that waits for the engine (a stream holds its thread until it ends) never delays
// another admitted request. The number of threads is bounded by the transport's connection cap
// (one exchange per connection at a time). Workers idle for a minute exit while more than
// `keep_idle` are idle. wait_idle() blocks until no task runs; the destructor waits for the
// threads to end.
#pragma once

#include <condition_variable>
#include <cstddef>
#include <deque>
#include <functional>
#include <mutex>

namespace moet::server {

class WorkerPool {
 public:
  explicit WorkerPool(size_t keep_idle = 8);
  ~WorkerPool();
  WorkerPool(const WorkerPool&) = delete;
  WorkerPool& operator=(const WorkerPool&) = delete;

  void submit(std::function<void()> task);
  // Waits until no task is queued or running, at most `seconds`; true when idle.
  bool wait_idle(double seconds);
  size_t busy() const;

 private:
  void work();

  const size_t keep_idle_;
  mutable std::mutex mutex_;
  std::condition_variable wake_, changed_;
  std::deque<std::function<void()>> tasks_;
  size_t threads_ = 0, idle_ = 0, running_ = 0;
  bool stopping_ = false;
};

}  // namespace moet::server
