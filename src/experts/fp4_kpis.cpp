// FP4 tier and gate KPIs (see fp4_kpis.h).
#include "experts/fp4_kpis.h"

#include <fmt/format.h>

namespace moet {
namespace {

double ratio(double a, double b) { return b > 0.0 ? a / b : 0.0; }

}  // namespace

Fp4Kpis fp4_kpis(const Fp4TierStats& now, const Fp4TierStats& before) {
  Fp4Kpis k;
  k.steps = now.steps - before.steps;
  k.promotions = now.promotions - before.promotions;
  k.evictions = now.evictions - before.evictions;
  k.forced_promotions = now.forced_promotions - before.forced_promotions;
  k.forced_evictions = now.forced_evictions - before.forced_evictions;
  k.copied_bytes = now.copied_bytes - before.copied_bytes;
  k.seconds = now.seconds - before.seconds;
  k.promotions_per_s = ratio(double(k.promotions + k.forced_promotions), k.seconds);
  k.evictions_per_s = ratio(double(k.evictions + k.forced_evictions), k.seconds);
  k.held = now.held;
  k.total = now.total;
  k.coverage = ratio(double(now.held), double(now.total));
  k.hit_rate = ratio(double(now.fp4_items - before.fp4_items), double(now.routed_items - before.routed_items));
  k.judged_steps = now.judged_steps - before.judged_steps;
  k.gated_steps = now.gated_steps - before.gated_steps;
  k.gate_passes = now.gate_passes - before.gate_passes;
  k.gated_fraction = ratio(double(k.gated_steps), double(k.judged_steps));
  return k;
}

Fp4Kpis fp4_tier_kpis(const Fp4Tier& tier) {
  Fp4Kpis k = fp4_kpis(tier.stats(), {});
  k.tau = tier.gate().tau();
  return k;
}

std::string fp4_kpi_line(const Fp4Kpis& k) {
  return fmt::format(
      "fp4 tier: {} steps, coverage {:.1f}%, FP4 hit rate {:.2f}%, {} promotions + {} by the gate ({:.1f}/s), "
      "{} evictions ({:.1f}/s), {:.2f} GB copied; gate tau {:.3f}: {} of {} steps gated ({:.1f}%), {} gate replays",
      k.steps, 100.0 * k.coverage, 100.0 * k.hit_rate, k.promotions, k.forced_promotions, k.promotions_per_s,
      k.evictions + k.forced_evictions, k.evictions_per_s, double(k.copied_bytes) / 1e9, k.tau, k.gated_steps,
      k.judged_steps, 100.0 * k.gated_fraction, k.gate_passes);
}

nlohmann::json fp4_kpi_json(const Fp4Kpis& k) {
  return {{"steps", k.steps},
          {"promotions", k.promotions},
          {"forced_promotions", k.forced_promotions},
          {"evictions", k.evictions},
          {"forced_evictions", k.forced_evictions},
          {"promotions_per_s", k.promotions_per_s},
          {"evictions_per_s", k.evictions_per_s},
          {"copied_bytes", k.copied_bytes},
          {"experts_held", k.held},
          {"experts_total", k.total},
          {"coverage", k.coverage},
          {"hit_rate", k.hit_rate},
          {"judged_steps", k.judged_steps},
          {"gated_steps", k.gated_steps},
          {"gated_fraction", k.gated_fraction},
          {"gate_replays", k.gate_passes},
          {"tau", k.tau}};
}

std::vector<KpiSample> fp4_kpi_samples(const Fp4Kpis& k) {
  return {
      {"moet:expert_fp4_promotions", "counter", "Experts the FP4 tier's manager promoted between steps.",
       double(k.promotions)},
      {"moet:expert_fp4_forced_promotions", "counter", "Experts the confidence gate promoted to FP4.",
       double(k.forced_promotions)},
      {"moet:expert_fp4_evictions", "counter", "Experts taken out of the FP4 tier (manager and gate).",
       double(k.evictions + k.forced_evictions)},
      {"moet:expert_fp4_copied_bytes", "counter", "Bytes copied into the FP4 tier.", double(k.copied_bytes)},
      {"moet:expert_fp4_coverage", "gauge", "Experts in the FP4 tier / routed experts of the model.", k.coverage},
      {"moet:expert_fp4_hit_rate", "gauge", "Routings served at FP4 (passes that stood), since start.", k.hit_rate},
      {"moet:gate_judged_steps", "counter", "Steps the confidence gate judged (steps that sample, tau > 0).",
       double(k.judged_steps)},
      {"moet:gate_gated_steps", "counter", "Steps whose confidence was <= tau.", double(k.gated_steps)},
      {"moet:gate_replays", "counter", "Passes the gate ran again after promoting to FP4.", double(k.gate_passes)},
      {"moet:gate_gated_fraction", "gauge", "Gated steps / judged steps, since start.", k.gated_fraction},
      {"moet:gate_tau", "gauge", "The confidence gate's threshold now (0: off).", k.tau},
  };
}

}  // namespace moet
