// Server metrics in the Prometheus text format (version 0.0.4), named like vLLM's with a "moet:"
// prefix so dashboards port: request counts by finish reason and by HTTP status, prompt/generation
// token counters, running/waiting requests, KV block usage, prefix-cache queries/hits/hit rate,
// preemptions, speculative decoding's drafts and acceptance (vLLM's spec_decode counters, the
// acceptance length), and TTFT / inter-token latency / end-to-end latency histograms. Recording is
// thread-safe (one mutex); engine gauges are read from the engine's stats snapshot at render time.
#pragma once

#include "engine/engine_core.h"

#include <map>
#include <mutex>
#include <string>
#include <vector>

namespace moet::server {

class Histogram {
 public:
  explicit Histogram(std::vector<double> bounds);
  void observe(double value);
  void render(std::string& out, const std::string& name, const std::string& help) const;

 private:
  std::vector<double> bounds_;
  std::vector<int64_t> counts_;  // per bucket (not cumulative); last = +Inf
  double sum_ = 0.0;
  int64_t count_ = 0;
};

class Metrics {
 public:
  Metrics();
  void http_response(int status);
  void request_finished(const std::string& reason, int64_t prompt_tokens, int64_t generation_tokens,
                        double e2e_seconds);
  void first_token(double seconds);
  void inter_token(double seconds);
  std::string render(const EngineStats& engine) const;

 private:
  mutable std::mutex mutex_;
  std::map<int, int64_t> http_by_status_;
  std::map<std::string, int64_t> finished_by_reason_;
  int64_t prompt_tokens_ = 0, generation_tokens_ = 0;
  Histogram ttft_, itl_, e2e_;
};

}  // namespace moet::server
