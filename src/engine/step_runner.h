// The step runner: the one caller of Model::forward. run(plan) turns a step plan (chunks of
// sequences: their tokens, positions and KV blocks) into a ForwardBatch, runs it over the KV
// cache the runner owns, and then asks its hooks whether to run the same step again before
// anything is sampled: this loop is where "run, decide, run again" lives (expert misses fetched
// and the step replayed, an unsure step re-run with its experts at FP4). A pass is a full forward
// over the same inputs; it rewrites the same KV slots and activations, so running a step again
// is safe and, with nothing changed in between, gives the same bits. The outcome is the last
// pass's output.
//
// A plan may also be a draft step of the model's MTP layer (StepPlan::mtp_hidden: speculative
// decoding, engine/speculative.h), run through the same loop and hooks.
//
// A runner set row-invariant (set_row_invariant(): the engine does when speculative decoding is
// on) marks its decode-like steps (row_invariant_step(): every chunk at most kRowInvariantMaxRun
// rows: decode steps, speculative verify steps [last token, k drafts] and MTP draft steps)
// ForwardBatch::row_invariant, for which a backend picks its kernels as for one row per sequence:
// each row's bits then depend only on its own inputs, so a verify row equals the decode step it
// replaces and a decode row does not change with the batch. Steps with a longer chunk (prefill),
// and every step of a runner not set so, keep the kernels sized to their rows (the fastest:
// cuBLASLt for many rows; docs/design.md, "Numerics").
//
// Steps whose shape recurs (step_recurs(): decode steps, and in a row-invariant runner set to
// (set_speculative_graphs()) verify steps and the chained MTP draft steps) run as CUDA graphs under a key the runner builds: this
// runner, the KV cache's memory, the logit, hidden and confidence rows and the top-logits width
// (the backend adds rows, sequences and table stride; a draft step's model adds where its hidden
// rows are staged), unless a hook needs the pass eager. When the model's experts are tiered (experts/residency.h),
// the runner's first hook is the residency protocol: misses fetched, the step run again. When they
// have an FP4 tier (experts/fp4_tier.h), the next is the tier's manager and confidence gate
// (engine/confidence_gate.h), for which a judged step's forward also returns the confidence of
// its sampling rows.
#pragma once

#include "engine/scheduler.h"
#include "kv/kv_cache.h"
#include "models/model.h"

#include <cstdint>
#include <memory>
#include <vector>

namespace moet {

class ConfidenceGate;

// The longest chunk of a decode-like step: one verify chunk of the largest speculative k + 1.
constexpr int64_t kRowInvariantMaxRun = 16;

// Whether the runner marks `plan` row-invariant (ForwardBatch::row_invariant): every chunk computes
// at most kRowInvariantMaxRun rows.
bool row_invariant_step(const StepPlan& plan);

// Whether `plan`'s shape recurs, so that the runner captures it as a CUDA graph: every chunk returns
// the logits of its rows and is one row (a decode step, a chained draft step) or, in a
// row-invariant step, returns every row's (a verify step: [last token, k drafts]; its rows take
// the decode kernels, so nothing but the step inputs tells them apart). A draft step's first
// chunk (the verified rows, logits of the last) and prefill chunks run eagerly: their shapes
// seldom repeat.
bool step_recurs(const StepPlan& plan, bool row_invariant);

enum class StepDecision { done, again };

// A decision point after each pass of a step (not owned by the runner; it must outlive it).
class StepHook {
 public:
  virtual ~StepHook() = default;
  // Before pass `pass` of `plan` (recurring: a decode step the runner would capture); false:
  // this pass must run eagerly (the hook decides on the host inside the forward).
  virtual bool before_pass(const StepPlan& plan, int64_t pass, bool recurring) {
    (void)plan, (void)pass, (void)recurring;
    return true;
  }
  // Called after pass `pass` (0 for the first) of `plan` with that pass's output, before
  // sampling; `again` runs the step once more (the hook has changed what it needed to).
  virtual StepDecision after_pass(const StepPlan& plan, const StepOutput& output, int64_t pass) = 0;
};

struct StepOutcome {
  StepOutput output;  // the last pass's
  int64_t passes = 0;
  // Output logit row i is row logit_rows[i] of the step's batch; the chunk it belongs to is
  // logit_chunks[i] (an index into plan.chunks). The same for the hidden rows.
  std::vector<int32_t> logit_chunks, hidden_chunks;
};

struct StepRunnerStats {
  int64_t steps = 0;
  int64_t passes = 0;          // forwards run (steps + replays)
  int64_t replayed_steps = 0;  // steps that ran more than once
};

class StepRunner {
 public:
  // The KV cache: `blocks` blocks of `block_size` slots for every layer's spec (`specs`, or the
  // model's when empty: a second cache of another dtype next to the model's, as `moet score` compares).
  StepRunner(Model& model, int64_t blocks, int64_t block_size, std::span<const KvLayerSpec> specs = {});
  ~StepRunner();

  // Hooks are asked in the order added; any `again` runs the step again.
  void add_hook(StepHook* hook) { hooks_.push_back(hook); }
  // Marks decode-like steps row-invariant from now on (off by default).
  void set_row_invariant(bool on) { row_invariant_ = on; }
  // Whether verify steps and chained draft steps are captured as CUDA graphs (step_recurs());
  // off: only one-row-per-chunk target steps are (engine/speculative.h, graph_steps).
  void set_speculative_graphs(bool on) { speculative_graphs_ = on; }
  // Whether `plan` runs as a row-invariant step here.
  bool marks_row_invariant(const StepPlan& plan) const { return row_invariant_ && row_invariant_step(plan); }
  StepOutcome run(const StepPlan& plan);

  Model& model() { return model_; }
  const KvCache& cache() const { return cache_; }
  int64_t block_size() const { return cache_.block_size; }
  const StepRunnerStats& stats() const { return stats_; }

  // A pass cap no hook should reach (each bounds its own replays); past it the last pass stands.
  static constexpr int64_t kMaxPasses = 64;

 private:
  ForwardBatch batch_for(const StepPlan& plan, StepOutcome& outcome) const;
  GraphKey graph_key(const ForwardBatch& batch) const;

  Model& model_;
  KvCache cache_;
  int64_t id_;  // unique per runner in the process (graph keys)
  bool row_invariant_ = false;
  bool speculative_graphs_ = false;
  std::unique_ptr<StepHook> residency_;  // the tiered experts' protocol (first of hooks_)
  std::unique_ptr<ConfidenceGate> gate_;  // the FP4 tier's manager and gate (next)
  std::vector<StepHook*> hooks_;
  StepRunnerStats stats_;
};

}  // namespace moet
