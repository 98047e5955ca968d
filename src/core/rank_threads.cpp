// RankThreads implementation (see rank_threads.h).
#include "core/rank_threads.h"

#include "core/error.h"

#include <utility>

namespace moet {

RankThreads::RankThreads(int ranks) {
  MOET_CHECK(ranks >= 1, "a parallel model needs at least one rank (got {})", ranks);
  for (int r = 0; r < ranks; ++r) threads_.emplace_back([this, r] { thread_loop(r); });
}

RankThreads::~RankThreads() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_ = true;
  }
  work_ready_.notify_all();
  for (auto& thread : threads_) thread.join();
}

void RankThreads::run(const std::function<void(int)>& body, const std::function<void(const std::string&)>& on_failure) {
  std::unique_lock<std::mutex> lock(mutex_);
  body_ = &body;
  on_failure_ = on_failure ? &on_failure : nullptr;
  failure_ = nullptr;
  pending_ = size();
  ++generation_;
  work_ready_.notify_all();
  work_done_.wait(lock, [this] { return pending_ == 0; });
  body_ = nullptr;
  on_failure_ = nullptr;
  if (failure_) std::rethrow_exception(std::exchange(failure_, nullptr));
}

void RankThreads::thread_loop(int rank) {
  size_t seen = 0;
  for (;;) {
    const std::function<void(int)>* body;
    {
      std::unique_lock<std::mutex> lock(mutex_);
      work_ready_.wait(lock, [&] { return stop_ || generation_ != seen; });
      if (stop_) return;
      seen = generation_;
      body = body_;
    }
    try {
      (*body)(rank);
    } catch (...) {
      std::string what = "unknown error";
      try {
        throw;
      } catch (const std::exception& e) {
        what = e.what();
      } catch (...) {
      }
      bool first = false;
      const std::function<void(const std::string&)>* on_failure;
      {
        std::lock_guard<std::mutex> lock(mutex_);
        first = !failure_;
        if (first) failure_ = std::current_exception();
        on_failure = on_failure_;
      }
      if (first && on_failure) (*on_failure)(fmt::format("rank {}: {}", rank, what));
    }
    std::lock_guard<std::mutex> lock(mutex_);
    if (--pending_ == 0) work_done_.notify_one();
  }
}

}  // namespace moet
