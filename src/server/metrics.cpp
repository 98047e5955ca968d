// Metrics implementation (see metrics.h).
#include "server/metrics.h"

#include <fmt/format.h>

namespace moet::server {
namespace {

void header(std::string& out, const std::string& name, const char* type, const std::string& help) {
  out += fmt::format("# HELP {} {}\n# TYPE {} {}\n", name, help, name, type);
}

void gauge(std::string& out, const std::string& name, const std::string& help, double value) {
  header(out, name, "gauge", help);
  out += fmt::format("{} {}\n", name, value);
}

// Counters are named with their _total suffix in the 0.0.4 text format (TYPE line included).
void counter(std::string& out, const std::string& name, const std::string& help, double value) {
  header(out, name + "_total", "counter", help);
  out += fmt::format("{}_total {}\n", name, value);
}

// vLLM's spec_decode counters, per-position accepted drafts, and the mean acceptance length.
void render_speculative(std::string& out, const SpeculativeStats& s) {
  counter(out, "moet:spec_decode_num_drafts", "Verify steps of a request that had drafts.", double(s.drafts));
  counter(out, "moet:spec_decode_num_draft_tokens", "Draft tokens verified.", double(s.draft_tokens));
  counter(out, "moet:spec_decode_num_accepted_tokens", "Draft tokens accepted.", double(s.accepted_tokens));
  header(out, "moet:spec_decode_num_accepted_tokens_per_pos_total", "counter",
         "Draft tokens accepted at each draft position (0-based).");
  for (size_t i = 0; i < s.accepted_per_position.size(); ++i)
    out += fmt::format("moet:spec_decode_num_accepted_tokens_per_pos_total{{position=\"{}\"}} {}\n", i,
                       s.accepted_per_position[i]);
  header(out, "moet:spec_decode_acceptance_rate_per_pos", "gauge",
         "Accepted / drafted at each draft position since start.");
  for (size_t i = 0; i < s.drafted_per_position.size(); ++i)
    out += fmt::format("moet:spec_decode_acceptance_rate_per_pos{{position=\"{}\"}} {}\n", i, s.acceptance_rate(i));
  gauge(out, "moet:spec_decode_acceptance_length",
        "Tokens produced per verify step since start: 1 + accepted / drafts (0 before any).", s.acceptance_length());
}

}  // namespace

Histogram::Histogram(std::vector<double> bounds) : bounds_(std::move(bounds)), counts_(bounds_.size() + 1, 0) {}

void Histogram::observe(double value) {
  size_t i = 0;
  while (i < bounds_.size() && value > bounds_[i]) ++i;
  ++counts_[i];
  sum_ += value;
  ++count_;
}

void Histogram::render(std::string& out, const std::string& name, const std::string& help) const {
  header(out, name, "histogram", help);
  int64_t cumulative = 0;
  for (size_t i = 0; i < bounds_.size(); ++i) {
    cumulative += counts_[i];
    out += fmt::format("{}_bucket{{le=\"{}\"}} {}\n", name, bounds_[i], cumulative);
  }
  out += fmt::format("{}_bucket{{le=\"+Inf\"}} {}\n{}_sum {}\n{}_count {}\n", name, count_, name, sum_, name, count_);
}

Metrics::Metrics()
    : ttft_({0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0}),
      itl_({0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5}),
      e2e_({0.1, 0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0}) {}

void Metrics::http_response(int status) {
  std::lock_guard lock(mutex_);
  ++http_by_status_[status];
}

void Metrics::request_finished(const std::string& reason, int64_t prompt_tokens, int64_t generation_tokens,
                               double e2e_seconds) {
  std::lock_guard lock(mutex_);
  ++finished_by_reason_[reason];
  prompt_tokens_ += prompt_tokens;
  generation_tokens_ += generation_tokens;
  e2e_.observe(e2e_seconds);
}

void Metrics::first_token(double seconds) {
  std::lock_guard lock(mutex_);
  ttft_.observe(seconds);
}

void Metrics::inter_token(double seconds) {
  std::lock_guard lock(mutex_);
  itl_.observe(seconds);
}

std::string Metrics::render(const EngineStats& engine) const {
  std::lock_guard lock(mutex_);
  std::string out;
  gauge(out, "moet:num_requests_running", "Requests in the running batch.", double(engine.running));
  gauge(out, "moet:num_requests_waiting", "Requests waiting for admission.", double(engine.waiting));
  gauge(out, "moet:kv_cache_usage_perc", "Fraction of KV blocks held by requests (1 = full).",
        engine.kv.total ? double(engine.kv.used) / double(engine.kv.total) : 0.0);
  gauge(out, "moet:kv_blocks_total", "KV cache blocks in the pool.", double(engine.kv.total));
  gauge(out, "moet:kv_blocks_used", "KV cache blocks held by requests.", double(engine.kv.used));
  gauge(out, "moet:kv_cache_tokens", "Tokens the KV pool holds (blocks x block size).",
        double(engine.kv_cache_tokens));
  gauge(out, "moet:kv_cache_bytes_per_token", "KV cache bytes one token takes over all layers (in its dtype).",
        double(engine.kv_bytes_per_token));
  gauge(out, "moet:kv_blocks_cached_free", "Free KV blocks that still hold a reusable prompt prefix.",
        double(engine.kv.cached_free));
  counter(out, "moet:prefix_cache_queries", "Prompt tokens looked up in the prefix cache.",
          double(engine.kv.prefix_queries));
  counter(out, "moet:prefix_cache_hits", "Prompt tokens found in the prefix cache.", double(engine.kv.prefix_hits));
  gauge(out, "moet:prefix_cache_hit_rate", "prefix_cache_hits / prefix_cache_queries since start.",
        engine.kv.prefix_queries ? double(engine.kv.prefix_hits) / double(engine.kv.prefix_queries) : 0.0);
  counter(out, "moet:num_preemptions", "Requests preempted (KV cache full) and later recomputed.",
          double(engine.preemptions));
  counter(out, "moet:prompt_tokens", "Prompt tokens of finished requests.", double(prompt_tokens_));
  counter(out, "moet:generation_tokens", "Generated tokens of finished requests.", double(generation_tokens_));
  header(out, "moet:request_success_total", "counter", "Finished requests by finish reason (stop, length, tool_calls, abort).");
  for (const auto& [reason, n] : finished_by_reason_)
    out += fmt::format("moet:request_success_total{{finished_reason=\"{}\"}} {}\n", reason, n);
  header(out, "moet:http_requests_total", "counter", "HTTP responses by status code.");
  for (const auto& [status, n] : http_by_status_)
    out += fmt::format("moet:http_requests_total{{status=\"{}\"}} {}\n", status, n);
  if (engine.speculative) render_speculative(out, *engine.speculative);
  if (engine.experts)
    for (const KpiSample& k : expert_kpi_samples(*engine.experts))
      (k.type == "counter" ? counter : gauge)(out, k.name, k.help, k.value);
  if (engine.fp4)
    for (const KpiSample& k : fp4_kpi_samples(*engine.fp4))
      (k.type == "counter" ? counter : gauge)(out, k.name, k.help, k.value);
  ttft_.render(out, "moet:time_to_first_token_seconds", "Time from request arrival to its first token.");
  itl_.render(out, "moet:inter_token_latency_seconds", "Time between consecutive tokens of a request.");
  e2e_.render(out, "moet:e2e_request_latency_seconds", "Time from request arrival to its last token.");
  return out;
}

}  // namespace moet::server
