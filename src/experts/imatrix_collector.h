// Collects a model's importance matrix (io/imatrix.h) as it runs: an ExpertObserver that sees
// every MoE layer's input rows and routing, adds x^2 per column into the sums of each expert the
// row was routed to (gate_up's input), and recomputes the routed rows' SiLU(gate) * up with the
// layer's own dense experts through the backend's matmul and silu_mul (down's input), adding its
// squares too. Sums are float64 in row order, so the result does not depend on how the text was
// cut into steps. Dense experts only (`--experts native`): importance is measured on the
// unquantized model. Every forward must run once (no replays: no tiered residency) and eagerly.
// With second_moments it also sums the outer products x x^T and a a^T (lower triangles, float64,
// the diagonal by the same operations as the vectors): K^2 doubles per expert and input, a study
// aid for small models (models/tiny); a full-size model would need one shared matrix per layer.
#pragma once

#include "experts/expert_pool.h"
#include "io/imatrix.h"

#include <cstdint>
#include <map>
#include <vector>

namespace moet {

class ImatrixCollector final : public ExpertObserver {
 public:
  explicit ImatrixCollector(const ModelConfig& config, bool second_moments = false);
  void observe(Backend& backend, int64_t layer, const Tensor& x, const Tensor& expert_ids,
               const ExpertSet& experts) override;
  // Means of what was observed; experts with fewer than min_tokens tokens take the layer's
  // average. `tokens` (the input tokens the caller ran) and the identity go to the metadata.
  // With second_moments the experts' gate_up_xx / down_xx are filled too (the same fallback).
  Imatrix result(int64_t min_tokens, int64_t tokens, const std::string& checkpoint_identity) const;

 private:
  struct Sums {
    std::vector<double> gate_up_in, down_in, gate_up_xx, down_xx;  // *_xx: empty without second moments
    int64_t tokens = 0;
    void add(const Sums& other);
  };
  Sums zero_sums() const;
  int64_t hidden_, inner_, experts_;
  bool second_moments_;
  std::map<int64_t, std::vector<Sums>> layers_;
};

}  // namespace moet
