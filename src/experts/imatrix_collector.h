// Collects a model's importance matrix (io/imatrix.h) as it runs: an ExpertObserver that sees
// every MoE layer's input rows and routing, adds x^2 per column into the sums of each expert the
// row was routed to (gate_up's input), and recomputes the routed rows' SiLU(gate) * up with the
// layer's own dense experts through the backend's matmul and silu_mul (down's input), adding its
// squares too. Sums are float64 in row order, so the result does not depend on how the text was
// cut into steps. Dense experts only (`--experts native`): importance is measured on the
// unquantized model. Every forward must run once (no replays: no tiered residency) and eagerly.
// With second moments (MomentExperts: every expert, or per layer a chosen few such as the hottest
// on an earlier pass) it also sums those experts' outer products x x^T and a a^T (lower
// triangles, float64, the diagonal by the same operations as the vectors): K^2 doubles per chosen
// expert and input, the expert moments of W2K's LDLQ (io/expert_moments.h). With layer_moments it sums them once per layer over every
// (row, expert) pair instead (io/layer_moments.h: a row's x x^T weighted by the number of experts
// it went to; a a^T in row order, each row's experts in routing order): K^2 doubles per layer
// and input, what a full-size model can afford. The outer products run on the collector's
// threads, each matrix row summed in row order (the same bits for any thread count).
#pragma once

#include "core/thread_pool.h"
#include "experts/expert_pool.h"
#include "io/imatrix.h"
#include "io/layer_moments.h"

#include <cstdint>
#include <map>
#include <vector>

namespace moet {

// The experts whose full second moments a collector sums: none (the default), every expert, or per
// MoE layer the listed ones.
struct MomentExperts {
  bool every = false;
  std::map<int64_t, std::vector<int64_t>> chosen;  // MoE layer -> experts, ascending
  bool contains(int64_t layer, int64_t expert) const;
  bool any() const { return every || !chosen.empty(); }
};
// Per MoE layer of `imatrix`, the n experts with most tokens (ties: the lower index) among those
// with at least max(min_tokens, 1), so that none of them takes its layer's average.
MomentExperts hottest_experts(const Imatrix& imatrix, int64_t n, int64_t min_tokens);

class ImatrixCollector final : public ExpertObserver {
 public:
  explicit ImatrixCollector(const ModelConfig& config, MomentExperts second_moments = {}, bool layer_moments = false);
  void observe(Backend& backend, int64_t layer, const Tensor& x, const Tensor& expert_ids,
               const ExpertSet& experts) override;
  // Means of what was observed; experts with fewer than min_tokens tokens take the layer's
  // average. `tokens` (the input tokens the caller ran) and the identity go to the metadata.
  // The chosen experts' gate_up_xx / down_xx are filled too (the same fallback; the others' stay empty).
  Imatrix result(int64_t min_tokens, int64_t tokens, const std::string& checkpoint_identity) const;
  // The layer moments (needs layer_moments): each layer's sums over its (row, expert) pairs.
  LayerMomentsData layer_moments(int64_t tokens, const std::string& checkpoint_identity) const;

 private:
  struct Sums {
    std::vector<double> gate_up_in, down_in, gate_up_xx, down_xx;  // *_xx: empty without second moments
    int64_t tokens = 0;
    void add(const Sums& other);
  };
  struct LayerSums {
    std::vector<double> gate_up_xx, down_xx;  // lower triangles
    int64_t pairs = 0;
  };
  Sums zero_sums(bool with_moments) const;
  void add_layer_pairs(int64_t layer, const std::vector<float>& xs, const std::vector<int32_t>& ids, int64_t top_k,
                       const std::vector<std::vector<int64_t>>& routed, const std::vector<std::vector<float>>& acts);
  int64_t hidden_, inner_, experts_;
  MomentExperts second_moments_;
  bool layer_moments_;
  std::map<int64_t, std::vector<Sums>> layers_;
  std::map<int64_t, LayerSums> layer_sums_;
  ThreadPool pool_;
};

}  // namespace moet
