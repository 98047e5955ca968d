// The expert cache's KPIs, from the residency's and the store's counters: replayed steps, missing
// pairs per step, coverage, the token hit rate, fetch GB/s, arena hits, store read latency; past
// the cache: rows written back (exclusive tiering), experts computed on the host and the per-miss
// policy's choices (--cpu-experts), promotions, the next-layer prediction's hit rate. Used
// by the periodic log line (every --kpi-every steps, over the steps since the last one), by
// /metrics (Prometheus names moet:expert_*, since start) and by the JSON of moet generate and
// moet bench ("experts": {...}).
#pragma once

#include "experts/residency.h"

#include <nlohmann/json.hpp>

#include <string>
#include <vector>

namespace moet {

struct ExpertKpis {
  int64_t steps = 0, replayed_steps = 0, layerwise_steps = 0, passes = 0;
  int64_t missing_pairs = 0, accepted_misses = 0, fetched_rows = 0;
  uint64_t fetched_bytes = 0;
  double replayed_fraction = 0.0;        // replayed_steps / steps
  double missing_pairs_per_step = 0.0;
  double coverage = 0.0;                 // experts in the cache / routed experts of the model
  double hit_rate = 0.0;                 // routings that found their expert cached (first passes)
  double fetch_gb_per_s = 0.0;           // fetched bytes / time spent fetching
  double arena_hit_rate = -1.0;          // arena store only (else -1)
  double read_p50_ms = 0.0, read_p99_ms = 0.0;  // store fetch latency, recent fetches
  int64_t written_back_rows = 0;
  uint64_t written_back_bytes = 0;
  int64_t host_pairs = 0, host_items = 0;
  double host_item_fraction = 0.0;       // routings computed on the host / routings (first passes)
  double host_seconds = 0.0;
  int64_t chose_fetch = 0, chose_host = 0, chose_skip = 0;
  int64_t promoted_rows = 0, prefetched_rows = 0;
  int64_t predicted_routed = 0;          // routed experts of layers that had a prediction
  double prefetch_hit_rate = -1.0;       // of those, the share the prediction named (else -1: none)
  MissCosts costs;
};

// KPIs of what happened between `before` and `now` (before = {}: since the start).
ExpertKpis expert_kpis(const ResidencyStats& now, const ResidencyStats& before, const ExpertStoreCounters& store,
                       const ExpertStoreCounters& store_before);
std::string expert_kpi_line(const ExpertKpis& k);
// {"steps", "replayed_steps", "missing_pairs", "fetched_bytes", "hit_rate", "coverage", ...}
nlohmann::json expert_kpi_json(const ExpertKpis& k);

// One Prometheus sample.
struct KpiSample {
  std::string name, type, help;  // type: "counter" | "gauge"
  double value;
};
std::vector<KpiSample> expert_kpi_samples(const ExpertKpis& k);

}  // namespace moet
