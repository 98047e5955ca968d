// The H each expert rounds against and its LDLQ decompositions (see ldlq_moments.h).
#include "io/ldlq_moments.h"

#include "core/error.h"

#include <cstring>
#include <vector>

namespace moet {
namespace {

// A mapped F32 [K, K] matrix copied out (aligned for float reads).
std::vector<float> copy_of(const HostTensor& t) {
  std::vector<float> H(size_t(t.numel()));
  std::memcpy(H.data(), t.data, t.bytes);
  return H;
}

}  // namespace

void LdlqMoments::check(const ModelConfig& config) const {
  MOET_CHECK(layers || experts, "the w2k LDLQ quantizer needs second moments (--layer-moments, --expert-moments)");
  if (layers) layers->check(config);
  if (!experts) return;
  experts->check(config);
  if (layers) return;
  const std::string missing = experts->first_missing(config);
  MOET_CHECK(missing.empty(),
             "expert moments {} hold no matrices for {} (made with --expert-moments-top?): give --layer-moments F "
             "for the experts without their own",
             experts->path(), missing);
}

LdlqFactors::LdlqFactors(std::shared_ptr<const LdlqMoments> moments, ThreadPool& pool)
    : moments_(std::move(moments)), pool_(pool) {}

std::shared_ptr<const W2kLdlqFactor> LdlqFactors::layer_factor(int64_t layer, bool down) {
  const HostTensor* matrix = moments_->layers ? moments_->layers->matrix(layer, down) : nullptr;
  if (matrix == nullptr) return nullptr;
  if (layer != layer_) {
    layer_factors_[0] = layer_factors_[1] = nullptr;  // the previous layer's are released first
    layer_ = layer;
  }
  std::shared_ptr<const W2kLdlqFactor>& f = layer_factors_[down ? 1 : 0];
  if (!f) f = std::make_shared<const W2kLdlqFactor>(w2k_ldlq_factor(copy_of(*matrix).data(), matrix->shape[0], pool_));
  return f;
}

std::shared_ptr<const W2kLdlqFactor> LdlqFactors::get(int64_t layer, int64_t expert, bool down) {
  const HostTensor* own = moments_->experts ? moments_->experts->matrix(layer, expert, down) : nullptr;
  if (own == nullptr) return layer_factor(layer, down);
  if (layer != expert_layer_ || expert != expert_) {
    expert_factors_[0] = expert_factors_[1] = nullptr;
    expert_layer_ = layer, expert_ = expert;
  }
  std::shared_ptr<const W2kLdlqFactor>& f = expert_factors_[down ? 1 : 0];
  if (f) return f;
  std::vector<float> H = copy_of(*own);
  const HostTensor* shared = moments_->layers ? moments_->layers->matrix(layer, down) : nullptr;
  if (moments_->blends() && shared != nullptr) {  // (n_e H_e + n0 H_layer) / (n_e + n0)
    const double n = double(moments_->experts->tokens(layer, expert)), n0 = double(moments_->prior_tokens);
    const std::vector<float> L = copy_of(*shared);
    for (size_t i = 0; i < H.size(); ++i) H[i] = float((n * double(H[i]) + n0 * double(L[i])) / (n + n0));
  }
  f = std::make_shared<const W2kLdlqFactor>(w2k_ldlq_factor(H.data(), own->shape[0], pool_));
  return f;
}

}  // namespace moet
