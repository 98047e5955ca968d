// What tiered residency does with a routed expert the backend does not hold (--cpu-experts auto):
// fetch it into a slot (in a replayed pass: and run the step again), compute it on the host from
// its host row (experts/host_experts.h), or leave it out (only within --miss-tolerance: the output
// then differs from holding every expert). A pure function of costs measured at startup and during
// decode (MissCosts) and of the miss's situation (MissSituation), so it is tested on its own:
//   - within the step's tolerance budget: skip (the user traded exactness for time);
//   - a pass that will run again anyway (a fetch was already chosen in it): fetch (a host result
//     would be thrown away with the pass);
//   - no fetch possible (no slots, or the pass may not run again: --max-replays): the host;
//   - otherwise the cheaper of the host, fixed + rows x per row, and the fetch, plus a replay of
//     the step when the pass is a graph pass (a layer-by-layer pass waits for its fetch before the
//     layer runs and needs no replay). Ties go to the host.
#pragma once

#include <cstdint>

namespace moet {

enum class MissAction { fetch, host, skip };

struct MissCosts {
  double fetch_seconds = 0.0;       // one expert read from the store and copied into a slot
  double replay_seconds = 0.0;      // one more pass of a decode step (measured; until then infinite)
  double host_fixed_seconds = 0.0;  // one expert on the host, apart from its rows
  double host_row_seconds = 0.0;    // each row routed to it
};

struct MissSituation {
  int64_t rows = 1;               // rows of the step routed to the expert
  bool layerwise = false;         // the layer waits for its fetches (no replay)
  bool replay_chosen = false;     // a fetch (and so a replay) was already chosen in this pass
  bool fetch_possible = true;     // there are slots, and a graph pass may still run again
  int64_t skips_left = 0;         // pairs the tolerance still lets this pass leave out
};

MissAction choose_miss_action(const MissCosts& costs, const MissSituation& miss);

// The host's cost of one expert of `rows` rows.
inline double host_seconds(const MissCosts& c, int64_t rows) {
  return c.host_fixed_seconds + double(rows) * c.host_row_seconds;
}

}  // namespace moet
