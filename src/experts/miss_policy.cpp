// The per-miss policy (see miss_policy.h).
#include "experts/miss_policy.h"

namespace moet {

MissAction choose_miss_action(const MissCosts& costs, const MissSituation& miss) {
  if (miss.skips_left > 0) return MissAction::skip;
  if (!miss.fetch_possible) return MissAction::host;
  if (miss.replay_chosen && !miss.layerwise) return MissAction::fetch;
  const double fetch = costs.fetch_seconds + (miss.layerwise ? 0.0 : costs.replay_seconds);
  return host_seconds(costs, miss.rows) <= fetch ? MissAction::host : MissAction::fetch;
}

}  // namespace moet
