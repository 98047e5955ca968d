// Expert cache KPIs (see expert_kpis.h).
#include "experts/expert_kpis.h"

#include <fmt/format.h>

#include <algorithm>
#include <limits>

namespace moet {
namespace {

double ratio(double a, double b) { return b > 0.0 ? a / b : 0.0; }

double percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0.0;
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, size_t(p * double(v.size())))];
}

}  // namespace

ExpertKpis expert_kpis(const ResidencyStats& now, const ResidencyStats& before, const ExpertStoreCounters& store,
                       const ExpertStoreCounters& store_before) {
  ExpertKpis k;
  k.steps = now.steps - before.steps;
  k.replayed_steps = now.replayed_steps - before.replayed_steps;
  k.layerwise_steps = now.layerwise_steps - before.layerwise_steps;
  k.passes = now.passes - before.passes;
  k.missing_pairs = now.missing_pairs - before.missing_pairs;
  k.accepted_misses = now.accepted_misses - before.accepted_misses;
  k.fetched_rows = now.fetched_rows - before.fetched_rows;
  k.fetched_bytes = now.fetched_bytes - before.fetched_bytes;
  k.replayed_fraction = ratio(double(k.replayed_steps), double(k.steps));
  k.missing_pairs_per_step = ratio(double(k.missing_pairs), double(k.steps));
  k.coverage = ratio(double(now.resident), double(now.total));
  k.hit_rate = ratio(double(now.resident_items - before.resident_items), double(now.routed_items - before.routed_items));
  k.fetch_gb_per_s = ratio(double(k.fetched_bytes) / 1e9, now.fetch_seconds - before.fetch_seconds);
  const uint64_t hits = store.arena_hits - store_before.arena_hits, misses = store.arena_misses - store_before.arena_misses;
  if (store.arena_hits + store.arena_misses > 0) k.arena_hit_rate = ratio(double(hits), double(hits + misses));
  k.read_p50_ms = 1e3 * percentile(store.fetch_seconds, 0.5);
  k.read_p99_ms = 1e3 * percentile(store.fetch_seconds, 0.99);
  k.written_back_rows = now.written_back_rows - before.written_back_rows;
  k.written_back_bytes = now.written_back_bytes - before.written_back_bytes;
  k.host_pairs = now.host_pairs - before.host_pairs;
  k.host_items = now.host_items - before.host_items;
  k.host_item_fraction = ratio(double(k.host_items), double(now.routed_items - before.routed_items));
  k.host_seconds = now.host_seconds - before.host_seconds;
  k.chose_fetch = now.chose_fetch - before.chose_fetch;
  k.chose_host = now.chose_host - before.chose_host;
  k.chose_skip = now.chose_skip - before.chose_skip;
  k.promoted_rows = now.promoted_rows - before.promoted_rows;
  k.prefetched_rows = now.prefetched_rows - before.prefetched_rows;
  k.predicted_routed = now.predicted_routed - before.predicted_routed;
  if (k.predicted_routed > 0)
    k.prefetch_hit_rate = ratio(double(now.predicted_hits - before.predicted_hits), double(k.predicted_routed));
  k.costs = now.costs;
  return k;
}

std::string expert_kpi_line(const ExpertKpis& k) {
  std::string line = fmt::format(
      "experts: {} steps, {:.1f}% replayed, {:.1f} missing pairs/step, coverage {:.1f}%, token hit rate {:.2f}%, "
      "fetched {} rows ({:.2f} GB) at {:.1f} GB/s",
      k.steps, 100.0 * k.replayed_fraction, k.missing_pairs_per_step, 100.0 * k.coverage, 100.0 * k.hit_rate,
      k.fetched_rows, double(k.fetched_bytes) / 1e9, k.fetch_gb_per_s);
  if (k.layerwise_steps > 0) line += fmt::format(", {} steps layer by layer", k.layerwise_steps);
  if (k.accepted_misses > 0) line += fmt::format(", {} misses accepted", k.accepted_misses);
  if (k.arena_hit_rate >= 0.0) line += fmt::format(", arena hits {:.1f}%", 100.0 * k.arena_hit_rate);
  line += fmt::format(", store read p50 {:.2f} ms p99 {:.2f} ms", k.read_p50_ms, k.read_p99_ms);
  if (k.written_back_rows > 0)
    line += fmt::format(", wrote back {} rows ({:.2f} GB)", k.written_back_rows, double(k.written_back_bytes) / 1e9);
  if (k.host_pairs > 0)
    line += fmt::format(", host computed {} experts ({:.1f}% of routings) in {:.2f} s", k.host_pairs,
                        100.0 * k.host_item_fraction, k.host_seconds);
  if (k.chose_fetch + k.chose_host + k.chose_skip > 0)
    line += fmt::format(", misses: {} fetch {} host {} skip", k.chose_fetch, k.chose_host, k.chose_skip);
  if (k.promoted_rows > 0) line += fmt::format(", promoted {}", k.promoted_rows);
  if (k.prefetch_hit_rate >= 0.0)
    line += fmt::format(", next-layer prediction hit rate {:.1f}% ({} prefetched)", 100.0 * k.prefetch_hit_rate,
                        k.prefetched_rows);
  return line;
}

nlohmann::json expert_kpi_json(const ExpertKpis& k) {
  nlohmann::json j = {{"steps", k.steps},
                      {"replayed_steps", k.replayed_steps},
                      {"layerwise_steps", k.layerwise_steps},
                      {"passes", k.passes},
                      {"missing_pairs", k.missing_pairs},
                      {"accepted_misses", k.accepted_misses},
                      {"fetched_rows", k.fetched_rows},
                      {"fetched_bytes", k.fetched_bytes},
                      {"fetch_gb_per_s", k.fetch_gb_per_s},
                      {"hit_rate", k.hit_rate},
                      {"coverage", k.coverage},
                      {"store_read_p50_ms", k.read_p50_ms},
                      {"store_read_p99_ms", k.read_p99_ms}};
  if (k.arena_hit_rate >= 0.0) j["arena_hit_rate"] = k.arena_hit_rate;
  j["written_back_rows"] = k.written_back_rows;
  j["written_back_bytes"] = k.written_back_bytes;
  j["host_pairs"] = k.host_pairs;
  j["host_items"] = k.host_items;
  j["host_item_fraction"] = k.host_item_fraction;
  j["host_seconds"] = k.host_seconds;
  j["chose_fetch"] = k.chose_fetch;
  j["chose_host"] = k.chose_host;
  j["chose_skip"] = k.chose_skip;
  j["promoted_rows"] = k.promoted_rows;
  j["prefetched_rows"] = k.prefetched_rows;
  if (k.prefetch_hit_rate >= 0.0) {
    j["prefetch_hit_rate"] = k.prefetch_hit_rate;
    j["predicted_routed"] = k.predicted_routed;
  }
  const double inf = std::numeric_limits<double>::infinity();
  j["costs"] = {{"fetch_ms", 1e3 * k.costs.fetch_seconds},
                {"replay_ms", k.costs.replay_seconds == inf ? -1.0 : 1e3 * k.costs.replay_seconds},
                {"host_fixed_ms", 1e3 * k.costs.host_fixed_seconds},
                {"host_row_ms", 1e3 * k.costs.host_row_seconds}};
  return j;
}

std::vector<KpiSample> expert_kpi_samples(const ExpertKpis& k) {
  std::vector<KpiSample> s = {
      {"moet:expert_steps", "counter", "Steps run with the expert cache.", double(k.steps)},
      {"moet:expert_replayed_steps", "counter", "Steps run again after fetching missing experts.",
       double(k.replayed_steps)},
      {"moet:expert_layerwise_steps", "counter", "Steps whose MoE layers were made resident one by one (prefill).",
       double(k.layerwise_steps)},
      {"moet:expert_missing_pairs", "counter", "(layer, expert) pairs found missing, every pass.",
       double(k.missing_pairs)},
      {"moet:expert_fetched_rows", "counter", "Experts copied into the cache.", double(k.fetched_rows)},
      {"moet:expert_fetched_bytes", "counter", "Bytes copied into the cache.", double(k.fetched_bytes)},
      {"moet:expert_coverage", "gauge", "Cached experts / routed experts of the model.", k.coverage},
      {"moet:expert_hit_rate", "gauge", "Routings that found their expert cached (first passes), since start.",
       k.hit_rate},
      {"moet:expert_fetch_gb_per_s", "gauge", "Fetched bytes / time spent fetching, since start.", k.fetch_gb_per_s},
      {"moet:expert_store_read_p50_seconds", "gauge", "Median store fetch latency (recent fetches).",
       k.read_p50_ms / 1e3},
      {"moet:expert_store_read_p99_seconds", "gauge", "99th percentile store fetch latency (recent fetches).",
       k.read_p99_ms / 1e3},
  };
  if (k.arena_hit_rate >= 0.0)
    s.push_back({"moet:expert_arena_hit_rate", "gauge", "Store fetches served by the pinned arena.", k.arena_hit_rate});
  s.push_back({"moet:expert_written_back_rows", "counter",
               "Exclusive tiering: evicted experts copied back to the store.", double(k.written_back_rows)});
  s.push_back({"moet:expert_host_pairs", "counter", "(layer, expert) pairs computed on the host (--cpu-experts).",
               double(k.host_pairs)});
  s.push_back({"moet:expert_host_items", "counter", "Routings computed on the host.", double(k.host_items)});
  s.push_back({"moet:expert_host_seconds", "counter", "Time spent computing experts on the host.", k.host_seconds});
  s.push_back({"moet:expert_miss_fetch", "counter", "Misses --cpu-experts auto chose to fetch.",
               double(k.chose_fetch)});
  s.push_back({"moet:expert_miss_host", "counter", "Misses --cpu-experts auto chose to compute on the host.",
               double(k.chose_host)});
  s.push_back({"moet:expert_miss_skip", "counter", "Misses --cpu-experts auto left out (--miss-tolerance).",
               double(k.chose_skip)});
  s.push_back({"moet:expert_promoted_rows", "counter", "Host-computed experts moved into the cache after their step.",
               double(k.promoted_rows)});
  s.push_back({"moet:expert_prefetched_rows", "counter", "Experts loaded by the next-layer prediction.",
               double(k.prefetched_rows)});
  if (k.prefetch_hit_rate >= 0.0)
    s.push_back({"moet:expert_prefetch_hit_rate", "gauge",
                 "Routed experts the next-layer prediction named, since start.", k.prefetch_hit_rate});
  return s;
}

}  // namespace moet
