// AsyncEngine implementation (see async_engine.h).
#include "engine/async_engine.h"

#include "core/error.h"
#include "core/log.h"

#include <chrono>

namespace moet {
namespace {

// ", speculative: acceptance length L, per-position acceptance a, b, ..." over the interval
// between two snapshots (vLLM's SpecDecoding metrics line).
std::string speculative_log(const SpeculativeStats& now, const SpeculativeStats& before) {
  SpeculativeStats interval = now;
  interval.drafts -= before.drafts;
  interval.accepted_tokens -= before.accepted_tokens;
  std::string rates;
  for (size_t i = 0; i < now.drafted_per_position.size(); ++i) {
    interval.drafted_per_position[i] -= before.drafted_per_position[i];
    interval.accepted_per_position[i] -= before.accepted_per_position[i];
    rates += fmt::format("{}{:.3f}", i ? ", " : "", interval.acceptance_rate(i));
  }
  return fmt::format(", speculative: acceptance length {:.2f}, per-position acceptance {}",
                     interval.acceptance_length(), rates);
}

}  // namespace

bool OutputStream::next(RequestOutput& out, double timeout_seconds) {
  std::unique_lock lock(mutex_);
  if (!ready_.wait_for(lock, std::chrono::duration<double>(timeout_seconds), [&] { return !queue_.empty(); }))
    return false;
  out = std::move(queue_.front());
  queue_.pop_front();
  return true;
}

void OutputStream::push(RequestOutput&& out) {
  {
    std::lock_guard lock(mutex_);
    queue_.push_back(std::move(out));
  }
  ready_.notify_one();
}

AsyncEngine::AsyncEngine(Model& model, std::optional<Tokenizer> tokenizer, const EngineConfig& config)
    : core_(model, std::move(tokenizer), config) {
  stats_ = core_.stats();
  logged_ = stats_;
  thread_ = std::thread([this] { loop(); });
}

AsyncEngine::~AsyncEngine() {
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
  }
  wake_.notify_all();
  thread_.join();
}

std::shared_ptr<OutputStream> AsyncEngine::submit(std::vector<RequestParams> batch) {
  std::vector<int64_t> ids;
  for (const RequestParams& params : batch) {
    core_.validate(params);
    ids.push_back(next_id_++);
  }
  auto stream = std::make_shared<OutputStream>(ids);
  {
    std::lock_guard lock(mutex_);
    for (size_t i = 0; i < batch.size(); ++i) inbox_.push_back({std::move(batch[i]), stream, int64_t(i)});
  }
  wake_.notify_all();
  return stream;
}

void AsyncEngine::abort(int64_t id) {
  {
    std::lock_guard lock(mutex_);
    aborts_.push_back(id);
  }
  wake_.notify_all();
}

EngineStats AsyncEngine::stats() const {
  std::lock_guard lock(mutex_);
  return stats_;
}

void AsyncEngine::loop() {
  while (true) {
    decltype(inbox_) inbox;
    std::vector<int64_t> aborts;
    {
      std::unique_lock lock(mutex_);
      wake_.wait(lock, [&] { return stopping_ || !inbox_.empty() || !aborts_.empty() || core_.has_work(); });
      if (stopping_) return;
      inbox.swap(inbox_);
      aborts.swap(aborts_);
    }
    for (Pending& p : inbox) {
      auto deliver = [stream = p.stream, index = p.index](RequestOutput&& out) {
        out.index = index;
        stream->push(std::move(out));
      };
      core_.add(p.stream->ids()[size_t(p.index)], std::move(p.params), std::move(deliver));  // validated on submit
    }
    for (int64_t id : aborts) core_.abort(id);
    try {
      core_.step();
    } catch (const std::exception& e) {
      MOET_LOG_ERROR("engine step failed: {}", e.what());
      throw;  // a failing forward is a bug; let it terminate loudly rather than serve garbage
    }
    const EngineStats now = core_.stats();
    log_status(now);
    std::lock_guard lock(mutex_);
    stats_ = now;
  }
}

void AsyncEngine::log_status(const EngineStats& now) {
  const double t = std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
  if (logged_at_ == 0.0) logged_at_ = t;
  const double dt = t - logged_at_;
  if (dt < 10.0) return;
  const int64_t generated = now.generated_tokens - logged_.generated_tokens;
  // Rows computed that were neither prompt nor kept output: rejected drafts.
  const auto rejected = [](const EngineStats& s) {
    return s.speculative ? s.speculative->draft_tokens - s.speculative->accepted_tokens : 0;
  };
  const int64_t prompt =
      now.computed_tokens - logged_.computed_tokens - generated - (rejected(now) - rejected(logged_));
  const int64_t queries = now.kv.prefix_queries - logged_.kv.prefix_queries;
  const int64_t hits = now.kv.prefix_hits - logged_.kv.prefix_hits;
  MOET_LOG_INFO("engine: prompt {:.1f} tok/s, generation {:.1f} tok/s, running {}, waiting {}, KV usage {:.1f}%, "
                "prefix-cache hit rate {:.1f}%{}",
                double(prompt) / dt, double(generated) / dt, now.running, now.waiting,
                now.kv.total ? 100.0 * double(now.kv.used) / double(now.kv.total) : 0.0,
                queries ? 100.0 * double(hits) / double(queries) : 0.0,
                now.speculative ? speculative_log(*now.speculative, *logged_.speculative) : std::string());
  logged_ = now;
  logged_at_ = t;
}

}  // namespace moet
