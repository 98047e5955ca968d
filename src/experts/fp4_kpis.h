// The FP4 tier's and the confidence gate's KPIs, from the tier's counters: gated-step %, gate
// replays, promotions and evictions (per second), FP4 coverage and the FP4 hit rate of routings.
// Used by the periodic log line (every --kpi-every steps, over the steps since the last one),
// /metrics (Prometheus names moet:expert_fp4_* and moet:gate_*, since start) and the JSON of moet
// generate and moet bench ("fp4": {...}).
#pragma once

#include "experts/expert_kpis.h"
#include "experts/fp4_tier.h"

#include <nlohmann/json.hpp>

#include <string>
#include <vector>

namespace moet {

struct Fp4Kpis {
  int64_t steps = 0, promotions = 0, evictions = 0, forced_promotions = 0, forced_evictions = 0;
  uint64_t copied_bytes = 0;
  double promotions_per_s = 0.0, evictions_per_s = 0.0;  // the manager's and the gate's together
  int64_t held = 0, total = 0;  // experts in the tier now / routed experts of the model
  double coverage = 0.0;        // held / total
  double hit_rate = 0.0;        // routings of the passes that stood served at FP4
  int64_t judged_steps = 0, gated_steps = 0, gate_passes = 0;
  double gated_fraction = 0.0;  // gated_steps / judged_steps
  double tau = 0.0;             // the gate's threshold now
  double seconds = 0.0;
};

// KPIs of what happened between `before` and `now` (before = {}: since the start); tau is the caller's.
Fp4Kpis fp4_kpis(const Fp4TierStats& now, const Fp4TierStats& before);
std::string fp4_kpi_line(const Fp4Kpis& k);
nlohmann::json fp4_kpi_json(const Fp4Kpis& k);
std::vector<KpiSample> fp4_kpi_samples(const Fp4Kpis& k);
// Since the start, tau included.
Fp4Kpis fp4_tier_kpis(const Fp4Tier& tier);

}  // namespace moet
