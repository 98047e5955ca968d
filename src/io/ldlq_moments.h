// What W2K's LDLQ quantizer (formats/w2k_ldlq.h) rounds each routed expert against, and the
// decompositions it needs. Two sources of input second moments H, either or both:
//   layer moments  (io/layer_moments.h)   one H per MoE layer and input, shared by its experts
//   expert moments (io/expert_moments.h)  each expert's own H, for every expert or the hottest
// An expert the expert moments hold rounds against its own H; with layer moments as well, that
// H is blended with its layer's by its token count n_e and a prior of n0 tokens,
//   H_e' = (n_e H_e + n0 H_layer) / (n_e + n0)     (float64, then rounded to float32)
// so an expert measured on few tokens (whose H is noisy, rank-deficient below K tokens) leans on
// its layer's; n0 = 0 keeps H_e as measured, and H_e == H_layer gives H_layer's bits exactly. An
// expert the expert moments lack rounds against its layer's H; without layer moments the expert
// moments must hold every expert (LdlqMoments::check).
#pragma once

#include "formats/w2k_ldlq.h"
#include "io/expert_moments.h"
#include "io/layer_moments.h"

#include <cstdint>
#include <memory>

namespace moet {

// The prior's default in tokens (docs/quality.md measures the choice on models/tiny).
inline constexpr int64_t kDefaultExpertMomentsPrior = 1024;

struct LdlqMoments {
  std::shared_ptr<const LayerMoments> layers;    // null: none
  std::shared_ptr<const ExpertMoments> experts;  // null: none
  int64_t prior_tokens = kDefaultExpertMomentsPrior;  // n0, read only with both files
  // Throws unless each file belongs to `config` (their own messages) and, without layer moments,
  // the expert moments hold every expert ("expert moments F hold no matrices for layer L expert e
  // ...: give --layer-moments F for the experts without their own").
  void check(const ModelConfig& config) const;
  // Whether the expert's H is a blend (both files, the expert held, n0 > 0).
  bool blends() const { return layers && experts && prior_tokens > 0; }
};

// The decompositions, made on first use; kept: the layer H's of the layer asked last and the own
// H's of the expert asked last (packs and loads run expert by expert in layer order; each
// decomposition is K^2 doubles). One thread at a time: the decompositions run on `pool`.
class LdlqFactors {
 public:
  LdlqFactors(std::shared_ptr<const LdlqMoments> moments, ThreadPool& pool);
  // The factor for the input (down or gate_up) of (layer, expert); null for a layer neither file
  // holds (the MTP layers, which scoring never runs: they keep the reference quantizer).
  std::shared_ptr<const W2kLdlqFactor> get(int64_t layer, int64_t expert, bool down);

 private:
  std::shared_ptr<const W2kLdlqFactor> layer_factor(int64_t layer, bool down);
  std::shared_ptr<const LdlqMoments> moments_;
  ThreadPool& pool_;
  int64_t layer_ = -1;  // whose layer H factors are kept
  std::shared_ptr<const W2kLdlqFactor> layer_factors_[2];
  int64_t expert_layer_ = -1, expert_ = -1;  // whose own H factors are kept
  std::shared_ptr<const W2kLdlqFactor> expert_factors_[2];
};

}  // namespace moet
