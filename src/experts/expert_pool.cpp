// ExpertPool implementation (see expert_pool.h).
#include "experts/expert_pool.h"

#include "core/error.h"

namespace moet {

ExpertPool::ExpertPool(Backend& backend, int64_t layers, int64_t experts_per_layer)
    : backend_(backend), experts_(experts_per_layer), layers_(size_t(layers)) {
  MOET_CHECK(layers > 0 && experts_per_layer > 0, "an expert pool needs layers and experts ({} x {})", layers,
             experts_per_layer);
}

void ExpertPool::load_layer(int64_t layer, const ExpertLayout& layout,
                            const std::function<ExpertWeights(int64_t)>& load) {
  MOET_CHECK(layer >= 0 && layer < layers(), "expert pool: layer {} outside [0, {})", layer, layers());
  std::vector<ExpertWeights> weights;
  weights.reserve(size_t(experts_));
  for (int64_t e = 0; e < experts_; ++e) weights.push_back(load(e));
  layers_[size_t(layer)] = backend_.expert_set(layout, std::move(weights));
}

bool ExpertPool::has_layer(int64_t layer) const {
  return layer >= 0 && layer < layers() && layers_[size_t(layer)].has_value();
}

const ExpertSet& ExpertPool::layer(int64_t layer) const {
  MOET_CHECK(has_layer(layer), "expert pool: layer {} has no experts", layer);
  return *layers_[size_t(layer)];
}

const ExpertWeights& ExpertPool::entry(int64_t layer, int64_t expert) const {
  const ExpertSet& set = this->layer(layer);
  MOET_CHECK(expert >= 0 && expert < experts_, "expert pool: expert {} outside [0, {})", expert, experts_);
  return set.experts[size_t(expert)];
}

ExpertFormat ExpertPool::format(int64_t layer, int64_t expert) const {
  const ExpertWeights& e = entry(layer, expert);
  return e.present() ? e.format : this->layer(layer).layout.format;
}

bool ExpertPool::present(int64_t layer, int64_t expert) const { return entry(layer, expert).present(); }

}  // namespace moet
