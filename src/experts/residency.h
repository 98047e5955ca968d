// Tiered expert residency: the backend holds a pool of `slots` routed experts (of any MoE layers)
// and the rest live in a host store (expert_store.h). The layer tables the MoE op reads mark the
// others absent; what the op meets absent it records (ExpertTracking) and leaves out. Two ways a
// step runs:
//   replay     (decode steps the pool can hold whole: moe layers x min(experts, rows x top_k) <=
//              slots) as it is, in a CUDA graph; afterwards the host reads the tracking, and when
//              more than miss_tolerance (layer, expert) pairs were absent it fetches them all
//              (victims: slots this pass did not use, least recently used first or least
//              frequently with decay), points the tables at them and the step runs again, until
//              nothing is missing or max_replays passes (then it logs once and accepts). A pass
//              that missed more than one layer's worth (rows x top_k) is not fetched from: its
//              later layers were routed from hidden states the missing experts had already
//              changed, so most of what it names is not what the step needs. The step runs
//              again layer by layer instead (exact in one pass), and so do the next steps until
//              one of them fetches at most one layer's worth;
//   layerwise  (prefill, mixed steps, decode steps the pool cannot hold) eagerly: before each MoE
//              layer's experts run, the host reads the layer's routing and makes its experts
//              resident; a layer routing to more experts than there are slots runs them in
//              ascending chunks of `slots`, the combine continuing from the previous chunk's sum.
// Either way the last pass is bit-identical to a fully resident run: the MoE op's work for
// present experts does not depend on what is absent, and chunks add in the same order.
// Sampling happens only after the last pass (the step runner asks after_pass()). Experts the FP4
// tier holds (fp4_tier.h) resolve there whatever their W2 slot: they never miss, are not
// fetched, and keep no slot busy.
// Past the cache (docs/experts.md):
//   exclusive  (ResidencyOptions::tiering) an expert is in a slot or in the host store, never both:
//              the pool is filled at load (preload()) and stays full; a fetch exchanges the
//              victim's row (written back to the store) for the missing one's;
//   host       (cpu_experts on / auto) an expert not in a slot has a host entry: the MoE op hands
//              its rows to serve(), which computes it from its host row (host_experts.h), or, in
//              auto, per miss (miss_policy.h) leaves it for a fetch and a replay, or skips it
//              within the tolerance. A step that stands then promotes up to promote_per_step of
//              its host-computed experts, hottest first, into slots held by colder experts;
//   prefetch   (next_layer) decode steps run layer by layer and after each MoE layer the pool
//              applies the next MoE layer's router to this layer's input (predict()); prefetch()
//              loads what it names before that layer runs; the KPIs count how much it named right.
#pragma once

#include "backend/backend.h"
#include "core/cpu_isa.h"
#include "experts/expert_store.h"
#include "experts/miss_policy.h"

#include <chrono>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

namespace moet {

class ExpertPool;
class ExpertTracker;
struct ExpertKpis;

enum class VictimPolicy { lru, frequency };
VictimPolicy victim_policy_parse(const std::string& name);  // "lru" | "frequency"
enum class ExpertTiering { inclusive, exclusive };
ExpertTiering expert_tiering_parse(const std::string& name);  // "inclusive" | "exclusive"
enum class CpuExperts { off, on, automatic };
CpuExperts cpu_experts_parse(const std::string& name);  // "off" | "on" | "auto"
const char* cpu_experts_name(CpuExperts mode);
enum class ExpertPrefetch { off, next_layer };
ExpertPrefetch expert_prefetch_parse(const std::string& name);  // "off" | "next-layer"
class HostExperts;

struct ResidencyOptions {
  // The pool's size: `slots` experts when > 0, else as many as cache_bytes of rows, else (auto)
  // what the backend has left when the first step runner exists (its KV cache allocated) minus
  // kAutoReserveBytes for activations and graphs.
  int64_t slots = 0;
  uint64_t cache_bytes = 0;
  int64_t miss_tolerance = 0;     // a pass with at most this many missing (layer, expert) pairs stands
  int64_t max_replays = 4;        // passes after the first at most; then the misses are accepted
  VictimPolicy policy = VictimPolicy::lru;
  double decay = 0.9;             // frequency policy: each step multiplies the counts by this
  int64_t max_step_rows = 1;      // decode rows one step may have (the pool must hold their layer)
  int64_t kpi_every = 500;        // steps between KPI log lines (0: none)
  ExpertTiering tiering = ExpertTiering::inclusive;
  CpuExperts cpu_experts = CpuExperts::off;
  bool host_only = false;         // no pool at all (cpu_experts on): every routed expert on the host
  int cpu_threads = 0;            // host expert workers (0: one per hardware thread)
  CpuIsa host_isa = cpu_isa_best();
  int64_t promote_per_step = 4;   // host-computed experts moved into slots after a step, at most
  ExpertPrefetch prefetch = ExpertPrefetch::off;

  static constexpr uint64_t kAutoReserveBytes = uint64_t(4) << 30;
};

// What tiered residency runs with: the pool's size and protocol, and the host store.
struct TieringConfig {
  ResidencyOptions residency;
  ExpertStoreOptions store;  // .pack / .spec come from the expert loader
};

// Totals since the residency was made.
struct ResidencyStats {
  int64_t steps = 0, replayed_steps = 0, layerwise_steps = 0, passes = 0;
  int64_t missing_pairs = 0;     // (layer, expert) pairs found absent, every pass (layer by layer: before the layer ran)
  int64_t accepted_misses = 0;   // of those, in passes that stood (tolerance or max_replays)
  int64_t routed_items = 0, resident_items = 0;  // routings of first passes and those that found their expert
  int64_t fetched_rows = 0;
  uint64_t fetched_bytes = 0;
  double fetch_seconds = 0.0;    // store reads and copies into the slots
  int64_t resident = 0, total = 0;  // experts in slots now / routed experts of the model
  int64_t written_back_rows = 0;    // exclusive: victims' rows copied back to the store
  uint64_t written_back_bytes = 0;
  int64_t host_pairs = 0, host_items = 0;  // (layer, expert) pairs / routings computed on the host
  double host_seconds = 0.0;
  int64_t chose_fetch = 0, chose_host = 0, chose_skip = 0;  // auto: the policy's choices
  int64_t promoted_rows = 0;        // host-computed experts moved into slots after their step
  int64_t predicted_routed = 0, predicted_hits = 0;  // prefetch: routed experts of predicted layers / predicted
  int64_t prefetched_rows = 0;
  MissCosts costs;                  // auto: what the policy weighs (startup measurements, replay EWMA)
};

class ExpertResidency final : public HostExpertServer {
 public:
  ExpertResidency(Backend& backend, ExpertPool& pool, ExpertTracker& tracker, std::unique_ptr<ExpertStore> store,
                  const ResidencyOptions& options, const ExpertRowLayout& row, int64_t top_k);
  ~ExpertResidency() override;

  // Allocates the slot pool (once; the step runner calls it when it is made, after its KV
  // cache): refuses a pool smaller than one decode step's largest layer, naming the minimum.
  // With host experts, also links every MoE layer to serve() and marks what is not in a slot.
  void allocate();
  // Exclusive tiering, at load: allocates the pool and fills it with `keys` (at most the pool's
  // size; the store does not hold them), their rows made by `fill`.
  void preload(std::span<const ExpertKey> keys, const ExpertRowFn& fill);
  // The pool's size in experts as the options give it (exclusive tiering needs it at load).
  int64_t planned_slots() const;

  // Before pass `pass` of a step of `rows` rows (recurring: a decode step): on the first, chooses
  // how the step runs; false when it must run eagerly (layerwise).
  bool begin_pass(int64_t rows, bool recurring, int64_t pass);
  // After pass `pass` of a step: true when it fetched and the step must run again.
  bool after_pass(int64_t pass);
  // Whether the last after_pass() asked for the step to run again (a pass that missed experts
  // is not one to judge).
  bool replay_pending() const { return replayed_; }
  // The routed experts of `layer` (layerwise steps): makes them resident and runs them.
  void run_layer(int64_t layer, const Tensor& x, const Tensor& expert_ids, const Tensor& weights, Tensor& out);
  bool layerwise() const { return layerwise_; }
  // HostExpertServer: the host entries of `layer` routed in x / ids (inside the MoE op).
  void serve(int64_t layer, const float* x, const int32_t* ids, const float* weights, int64_t rows, int64_t top_k,
             float* results, int32_t* valid) override;
  // Prefetch: whether `rows` rows of a layerwise step get a prediction, and the predicted routing
  // ids [rows, top_k] of `layer` (the next MoE layer), loaded before it runs.
  bool predicts(int64_t rows) const;
  void prefetch(int64_t layer, std::span<const int32_t> predicted_ids);

  ResidencyStats stats() const;
  // KPIs since the start.
  ExpertKpis kpis() const;
  const ExpertStore& store() const { return *store_; }
  const ResidencyOptions& options() const { return options_; }

 private:
  struct Key {
    int64_t layer, expert;
  };
  int64_t index(int64_t layer, int64_t expert) const { return layer * experts_ + expert; }
  // Makes `keys` resident, evicting only slots whose experts `keep` does not name; false when
  // there are not enough such slots (nothing changed then).
  bool ensure(std::span<const Key> keys, const std::vector<bool>& keep, bool scan);
  // Loads `keys` (none resident) into slots `into` (as many), evicting what they hold (exclusive:
  // written back to the store), in store-sized batches.
  void load_into(std::span<const Key> keys, std::span<const int64_t> into, bool scan);
  // Writes the table entries of `keys` (present: their slot's weights; else absent, or a host
  // entry with host experts), one update per layer.
  void point_tables(std::span<const Key> keys, bool present);
  // Runs `layer`'s routed experts `keys` (ascending) in chunks whose experts needing a slot
  // (`needs_slot`, by expert) number at most `chunk`, host entries in the chunk of their index,
  // then the FP4 tier's: the additions of one call (the MoE op's order).
  void run_chunked(int64_t layer, std::span<const Key> keys, const std::vector<bool>& needs_slot, int64_t chunk,
                   bool scan, const Tensor& x, const Tensor& expert_ids, const Tensor& weights, Tensor& out);
  // `count` slots to load into: free ones first, then those whose experts `keep` does not
  // protect, coldest first by the policy; fewer when there are not enough.
  std::vector<int64_t> victims(size_t count, const std::vector<bool>& keep) const;
  void touch(int64_t slot);
  bool host_mode() const { return options_.cpu_experts != CpuExperts::off; }
  // Host experts (residency_host.cpp): startup costs; the action for a miss of `rows` rows; the
  // end of a step that stands (heat, promotions); prefetch accounting when `layer` runs.
  void measure_costs();
  MissAction decide(int64_t rows, bool layerwise, int64_t pass);
  void end_step();
  void score_prediction(int64_t layer, const std::vector<bool>& routed);
  double heat(int64_t key) const;

  Backend& backend_;
  ExpertPool& pool_;
  ExpertTracker& tracker_;
  std::unique_ptr<ExpertStore> store_;
  ResidencyOptions options_;
  int64_t layers_, experts_, top_k_;
  std::vector<int64_t> moe_layers_;
  ExpertRowLayout row_;
  ExpertSlots slots_;
  std::vector<int64_t> slot_of_;    // [layers * experts]: slot or -1
  std::vector<int64_t> key_of_;     // [slots]: index() or -1
  std::vector<uint64_t> last_use_;  // [slots]: step of the last use
  std::vector<double> uses_;        // [slots]: decayed use counts (frequency policy)
  uint64_t tick_ = 0;
  bool layerwise_ = false;
  bool replayed_ = false;
  bool warned_max_replays_ = false;
  bool prefer_layerwise_ = false;     // decode steps start layer by layer (misses are many)
  int64_t step_rows_ = 0;
  int64_t step_fetched_ = 0;          // stats_.fetched_rows when the step began
  bool allocated_ = false;
  // Host experts.
  std::unique_ptr<HostExperts> host_;
  int64_t pass_ = 0;                  // the pass in flight
  int64_t skips_left_ = 0;            // this pass's tolerance budget (auto)
  bool replay_chosen_ = false;        // a fetch was chosen in this pass (auto)
  std::vector<Key> pass_fetches_;     // misses this pass left for a fetch (auto)
  std::vector<MissAction> layer_actions_;  // layerwise: [experts] the action run_layer chose
  std::vector<bool> step_used_;       // [layers * experts]: routed in this step
  std::vector<Key> step_host_;        // computed on the host in this step
  std::vector<double> heat_;          // [layers * experts]: use counts decayed every step
  std::vector<uint64_t> heat_tick_;   // [layers * experts]: the tick heat_ was last brought to
  std::chrono::steady_clock::time_point pass_start_;
  // Prefetch: per layer the experts predicted for its next run (empty: none pending).
  std::vector<std::vector<bool>> predicted_;
  ResidencyStats stats_;
  ResidencyStats logged_stats_;       // at the last KPI line
  ExpertStoreCounters logged_store_;
};

}  // namespace moet
