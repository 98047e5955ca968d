// The FP4 recovery tier: a second pool of expert slots beside the W2 base (resident or the expert
// cache of residency.h) holding experts at MXFP4, the checkpoint's own bytes where it ships MXFP4
// experts (requantized from any other source: formats/requant.h). A table entry resolves to the
// expert's FP4 slot when it has one, else to its base entry (expert_pool.h); each expert runs
// through its format's product kernel. FP4 rows come from a host store like the W2 base's
// (expert_store.h) over a second pack file, experts-fp4-*.pack (built once, rebuilt when stale).
// Two ways experts get in, both between passes, never inside one:
//   manager  before each step (begin_pass of its first pass): every expert's use count is
//            multiplied by `decay` and those the previous step routed get +1; then up to
//            promote_per_step of the hottest experts not in the tier take a free slot or the slot
//            of the coldest tier expert the previous step did not route, if they are at least
//            kSwapMargin times as hot (equal heat does not churn). The rows are copied without
//            waiting (Backend::expert_slots_load_async: the CPU copies at once; CUDA copies on its
//            copy stream and the tables point at the new slots at the first step boundary after
//            the copy is done, so a step never waits for them; evicted entries fall back to the
//            base before the copy may overwrite the slot).
//   gate     after a pass judged unsure (engine/confidence_gate.h): force_promote() makes that
//            pass's routed experts FP4 (at most `budget`, hottest first), evicting tier experts
//            the pass did not route, synchronously; the step then runs again.
// Table rewrites are read by captured CUDA graphs at replay (nothing is captured again). The gate's
// settings and run-time threshold live here too (GateControl), where the server can reach them.
#pragma once

#include "backend/backend.h"
#include "experts/expert_store.h"
#include "experts/gate_control.h"

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <vector>

namespace moet {

class ExpertPool;
class ExpertTracker;
struct Fp4Kpis;

struct Fp4TierOptions {
  // The pool's size: `slots` experts when > 0, else as many as pool_bytes of FP4 rows, else (auto)
  // what the backend has left when the first step runner exists (after the base and the KV
  // cache) minus kAutoReserveBytes.
  int64_t slots = 0;
  uint64_t pool_bytes = 0;
  int64_t promote_per_step = 8;  // manager promotions before a step at most (0: no manager)
  double decay = 0.99;           // use counts are multiplied by this before every step
  int64_t max_step_rows = 1;     // decode rows one step may have (the pool must hold their layer)
  int64_t kpi_every = 500;       // steps between KPI log lines (0: none)

  static constexpr uint64_t kAutoReserveBytes = uint64_t(4) << 30;
  static constexpr double kSwapMargin = 1.25;
};

struct Fp4TierConfig {
  Fp4TierOptions tier;
  ExpertStoreOptions store;        // .pack / .spec come from the tier's loader
  GateOptions gate;
  ExpertFormat format = ExpertFormat::fp4;  // w2: a tier of the base's own rows (tests: moves that change nothing)
};

// Totals since the tier was made.
struct Fp4TierStats {
  int64_t steps = 0;
  int64_t promotions = 0, evictions = 0;                // the manager's
  int64_t forced_promotions = 0, forced_evictions = 0;  // the gate's
  int64_t fp4_items = 0, routed_items = 0;  // routings of the passes that stood, served at FP4 / all
  uint64_t copied_bytes = 0;
  int64_t held = 0, total = 0;              // experts in the tier now / routed experts of the model
  int64_t judged_steps = 0, gated_steps = 0, gate_passes = 0;  // the gate's (engine/confidence_gate.h)
  double seconds = 0.0;                     // since the tier was made
};

class Fp4Tier {
 public:
  Fp4Tier(Backend& backend, ExpertPool& pool, ExpertTracker& tracker, std::unique_ptr<ExpertStore> store,
          const Fp4TierConfig& config, const ExpertLayout& layout, const ExpertRowLayout& row, int64_t top_k);
  ~Fp4Tier();

  // Allocates the slot pool (once, when the first step runner exists, after its KV cache and the
  // expert cache): refuses a pool smaller than one decode step's largest layer, naming the minimum.
  void allocate();
  // Before pass `pass` of a step; the first of a step runs the manager.
  void begin_pass(int64_t pass);
  // After a pass: what it routed (the tracker's copy of the pass).
  void after_pass();
  // The gate's promotion: up to `budget` experts the last pass routed that are not in the tier;
  // returns how many were promoted (0: none could be, or all already are).
  int64_t force_promote(int64_t budget);
  bool holds(int64_t layer, int64_t expert) const { return slot_of_[size_t(index(layer, expert))] >= 0; }

  GateControl& gate() { return gate_; }
  const GateControl& gate() const { return gate_; }
  // The gate hook's counts.
  void count_judged(bool gated);
  void count_gate_pass() { ++stats_.gate_passes; }

  Fp4TierStats stats() const;
  const Fp4TierOptions& options() const { return config_.tier; }
  ExpertFormat format() const { return layout_.format; }

 private:
  struct Key {
    int64_t layer, expert;
  };
  int64_t index(int64_t layer, int64_t expert) const { return layer * experts_ + expert; }
  // Folds the last pass of the previous step into the use counts and the hit rate.
  void fold_last_step();
  // The manager: completes copies that are done, then starts the next promotions.
  void manage();
  // Up to `count` slots for new experts: free ones, then those of tier experts `busy` does not
  // name, coldest first, each at most `hotter_than` / kSwapMargin hot (a negative bound: any).
  std::vector<int64_t> victims(size_t count, const std::vector<bool>& busy,
                               const std::vector<double>& hotter_than) const;
  // Takes the experts out of `slots` (their entries fall back to the base).
  void evict(std::span<const int64_t> slots, int64_t& counter);
  // Points the tables at `keys` in `slots`.
  void point(std::span<const Key> keys, std::span<const int64_t> slots);
  // Waits for the manager's copies in flight and points the tables at them.
  void finish_pending(bool wait);
  // The hottest `limit` experts that `eligible` names, hottest first (ties: lower index).
  std::vector<Key> hottest(const std::vector<bool>& eligible, size_t limit) const;
  void log_kpis();

  Backend& backend_;
  ExpertPool& pool_;
  ExpertTracker& tracker_;
  std::unique_ptr<ExpertStore> store_;
  Fp4TierConfig config_;
  ExpertLayout layout_;
  ExpertRowLayout row_;
  int64_t layers_, experts_, top_k_;
  std::vector<int64_t> moe_layers_;
  GateControl gate_;
  ExpertSlots slots_;
  std::vector<int64_t> slot_of_;     // [layers * experts]: slot or -1
  std::vector<int64_t> key_of_;      // [slots]: index() or -1 (also while its copy is in flight)
  std::vector<double> uses_;         // [layers * experts]: decayed use counts
  std::vector<bool> last_routed_;    // [layers * experts]: routed by the last pass read
  bool have_last_ = false;           // a pass was read since the last fold
  int64_t last_fp4_items_ = 0, last_routed_items_ = 0;
  bool last_exact_ = false;
  struct Pending {
    std::vector<Key> keys;
    std::vector<int64_t> slots;
    ExpertLoadFence fence;
  };
  std::optional<Pending> pending_;   // the manager's copies in flight
  Fp4TierStats stats_;
  Fp4TierStats logged_;              // at the last KPI line
  std::chrono::steady_clock::time_point start_;
};

}  // namespace moet
