// AsyncEngine: runs an EngineCore step loop on its own thread. Other threads (HTTP handlers) only
// submit requests, abort them, and read each request's OutputStream; they never touch the model or
// the KV cache. Submissions and aborts are applied between steps; outputs are pushed to the stream
// of their request as the engine produces them. The loop sleeps while there is nothing to do.
// Stats are a snapshot taken after every step (cheap to read from any thread). While there is
// work, a vLLM-style status line (throughputs, queue sizes, KV usage, prefix-cache hit rate, and
// with speculative decoding the acceptance length and per-position acceptance rates) is logged
// every 10 seconds.
#pragma once

#include "engine/engine_core.h"

#include <atomic>
#include <condition_variable>
#include <deque>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

namespace moet {

// The outputs of one submitted batch of requests (RequestOutput::index tells which), in order per
// request. next() blocks until an output arrives or the timeout passes.
class OutputStream {
 public:
  explicit OutputStream(std::vector<int64_t> ids) : ids_(std::move(ids)) {}
  // Engine request ids, by index.
  const std::vector<int64_t>& ids() const { return ids_; }
  // False on timeout (out untouched).
  bool next(RequestOutput& out, double timeout_seconds);
  void push(RequestOutput&& out);

 private:
  std::vector<int64_t> ids_;
  std::mutex mutex_;
  std::condition_variable ready_;
  std::deque<RequestOutput> queue_;
};

class AsyncEngine {
 public:
  AsyncEngine(Model& model, std::optional<Tokenizer> tokenizer, const EngineConfig& config);
  ~AsyncEngine();  // stops the loop (pending requests are dropped)

  // Validates every request (throws moet::Error for a bad one, queueing none) and queues them all;
  // the stream yields their outputs.
  std::shared_ptr<OutputStream> submit(std::vector<RequestParams> batch);
  // The checks submit() runs, without queueing (thread-safe).
  void validate(const RequestParams& params) const { core_.validate(params); }
  void abort(int64_t id);
  EngineStats stats() const;
  const EngineConfig& config() const { return core_.config(); }

 private:
  void loop();
  void log_status(const EngineStats& now);

  EngineCore core_;
  mutable std::mutex mutex_;
  std::condition_variable wake_;
  struct Pending {
    RequestParams params;
    std::shared_ptr<OutputStream> stream;
    int64_t index;
  };
  std::vector<Pending> inbox_;
  std::vector<int64_t> aborts_;
  EngineStats stats_;
  EngineStats logged_;  // engine-thread only: the stats at the last status line
  double logged_at_ = 0.0;
  bool stopping_ = false;
  std::atomic<int64_t> next_id_{1};
  std::thread thread_;
};

}  // namespace moet
