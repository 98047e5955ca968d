// The FP4 tier's step hook (experts/fp4_tier.h): the tier's manager before every step, and the
// confidence gate after every pass. The gate judges every step that samples a token (the last
// chunk of a prompt included): the step's confidence is the minimum over its sampling rows (a
// speculative verify chunk's rows included: the last known token's and every draft's) of
// the chosen signal (the largest softmax probability, or its margin over the second; both in
// [0, 1], kernels/cpu/logit_confidence.h), computed by the forward where the whole logit rows are
// (ForwardBatch::confidence_rows) so that steps returning only their best logits are judged the
// same. When it is <= tau the step's routed experts that are not FP4 yet are promoted (at most
// --gate-budget per step, hottest first), the step runs again and is judged again, up to
// --gate-rounds times; sampling happens only after the last pass. A pass the expert cache is about
// to run again (it missed experts) is not judged. Nothing is promoted and nothing runs again when
// every routed expert already is FP4 (another pass would give the same bits). tau is read once
// per step from the tier's GateControl (changed at run time by POST /admin/gate or the tau file);
// tau 0: the gate is off, the forward computes no confidence and the outputs are exactly those
// without a gate.
#pragma once

#include "engine/step_runner.h"
#include "experts/fp4_tier.h"
#include "experts/residency.h"

#include <cstdint>

namespace moet {

class ConfidenceGate final : public StepHook {
 public:
  // Allocates the tier's slot pool (after the KV cache and the expert cache). residency: the
  // expert cache whose replays come first (null: none).
  ConfidenceGate(Fp4Tier& tier, const ExpertResidency* residency);

  // Before a step: latches tau; true when this step is judged (its forward must return the
  // sampling rows' confidence).
  bool judges_step();
  bool before_pass(const StepPlan& plan, int64_t pass, bool recurring) override;
  StepDecision after_pass(const StepPlan& plan, const StepOutput& output, int64_t pass) override;

 private:
  Fp4Tier& tier_;
  const ExpertResidency* residency_;
  double tau_ = 0.0;       // this step's
  bool judging_ = false;   // this step is judged
  bool judged_ = false;    // a pass of this step was judged
  int64_t rounds_ = 0;     // gate replays of this step
  int64_t budget_ = 0;     // promotions this step may still make
};

}  // namespace moet
