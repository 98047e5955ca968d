// ConfidenceGate implementation (see confidence_gate.h).
#include "engine/confidence_gate.h"

#include "core/error.h"

#include <algorithm>

namespace moet {

ConfidenceGate::ConfidenceGate(Fp4Tier& tier, const ExpertResidency* residency) : tier_(tier), residency_(residency) {
  tier_.allocate();
}

bool ConfidenceGate::judges_step() {
  tier_.gate().poll_file();
  tau_ = tier_.gate().tau();
  judging_ = tau_ > 0.0;
  return judging_;
}

bool ConfidenceGate::before_pass(const StepPlan&, int64_t pass, bool) {
  if (pass == 0) {
    judged_ = false;
    rounds_ = 0;
    budget_ = tier_.gate().options().budget;
  }
  tier_.begin_pass(pass);
  return true;
}

StepDecision ConfidenceGate::after_pass(const StepPlan&, const StepOutput& output, int64_t) {
  tier_.after_pass();
  if (!judging_ || output.confidence.empty()) return StepDecision::done;
  if (residency_ != nullptr && residency_->replay_pending()) return StepDecision::done;  // an incomplete pass
  const size_t signal = tier_.gate().options().signal == GateSignal::maxprob ? 0 : 1;
  float confidence = 1.0f;
  for (size_t i = signal; i < output.confidence.size(); i += 2) confidence = std::min(confidence, output.confidence[i]);
  const bool unsure = double(confidence) <= tau_;
  if (!judged_) tier_.count_judged(unsure);
  judged_ = true;
  if (!unsure || rounds_ >= tier_.gate().options().rounds || budget_ <= 0) return StepDecision::done;
  const int64_t promoted = tier_.force_promote(budget_);
  if (promoted == 0) return StepDecision::done;
  budget_ -= promoted;
  ++rounds_;
  tier_.count_gate_pass();
  return StepDecision::again;
}

}  // namespace moet
