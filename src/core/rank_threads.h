// One persistent thread per rank of a model split over threads of this process (docs/parallel.md):
// run(body) calls body(r) on rank r's thread for every rank at once and returns when all have. A
// rank keeps its thread for its life, so what a rank binds to its thread (a GPU's current device)
// stays bound. When a rank throws, on_failure runs at once on that thread with the message (so that
// ranks waiting for it in a collective are released), and run() rethrows that first failure once
// every rank has returned.
#pragma once

#include <condition_variable>
#include <exception>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace moet {

class RankThreads {
 public:
  explicit RankThreads(int ranks);
  ~RankThreads();
  RankThreads(const RankThreads&) = delete;
  RankThreads& operator=(const RankThreads&) = delete;

  int size() const { return int(threads_.size()); }
  void run(const std::function<void(int)>& body, const std::function<void(const std::string&)>& on_failure = {});

 private:
  void thread_loop(int rank);

  std::vector<std::thread> threads_;
  std::mutex mutex_;
  std::condition_variable work_ready_, work_done_;
  const std::function<void(int)>* body_ = nullptr;
  const std::function<void(const std::string&)>* on_failure_ = nullptr;
  std::exception_ptr failure_;
  size_t generation_ = 0;
  int pending_ = 0;
  bool stop_ = false;
};

}  // namespace moet
