// ExpertPool implementation (see expert_pool.h).
#include "experts/expert_pool.h"

#include "core/error.h"

namespace moet {

ExpertPool::ExpertPool(Backend& backend, int64_t layers, int64_t experts_per_layer)
    : backend_(backend), experts_(experts_per_layer), layers_(size_t(layers)) {
  MOET_CHECK(layers > 0 && experts_per_layer > 0, "an expert pool needs layers and experts ({} x {})", layers,
             experts_per_layer);
}

ExpertPool::~ExpertPool() = default;

void ExpertPool::load_layer(int64_t layer, ExpertLoader& loader, ExpertUploadSink& sink) {
  MOET_CHECK(layer >= 0 && layer < layers(), "expert pool: layer {} outside [0, {})", layer, layers());
  std::vector<ExpertWeights> weights(static_cast<size_t>(experts_));
  if (!tiered())
    for (int64_t e = 0; e < experts_; ++e) weights[size_t(e)] = loader.load(sink, layer, e);
  layers_[size_t(layer)] = backend_.expert_set(loader.layout(), std::move(weights));
}

void ExpertPool::plan_tiering(const TieringConfig& config) {
  for (const auto& l : layers_) MOET_CHECK(!l.has_value(), "expert pool: tiering is planned before the layers load");
  tiering_ = config;
}

void ExpertPool::start_tiering(ExpertLoader& loader, ExpertUploadSink& sink, int64_t top_k) {
  MOET_CHECK(tiered(), "expert pool: tiering was not planned");
  TieringConfig& t = *tiering_;
  const ExpertRowLayout row = loader.row_layout();
  std::vector<int64_t> moe_layers;
  for (int64_t l = 0; l < layers(); ++l)
    if (has_layer(l)) moe_layers.push_back(l);
  if (t.store.kind != ExpertStoreKind::ram) {
    MOET_CHECK(loader.pack_paths().has_value(), "--expert-store {} reads a pack file: give --pack-dir",
               expert_store_name(t.store.kind));
    t.store.pack = *loader.pack_paths();
    t.store.spec = *loader.pack_spec();
    for (int64_t l : moe_layers)
      for (int64_t e = 0; e < experts_; ++e) loader.mark_used(sink, l, e);
  }
  std::unique_ptr<ExpertStore> store =
      expert_store_create(t.store, backend_, moe_layers, experts_, row.bytes,
                          [&](int64_t layer, int64_t expert, uint8_t* dst) { loader.load_row(sink, layer, expert, dst); });
  residency_ = std::make_unique<ExpertResidency>(backend_, *this, std::move(store), t.residency, row, top_k);
}

bool ExpertPool::has_layer(int64_t layer) const {
  return layer >= 0 && layer < layers() && layers_[size_t(layer)].has_value();
}

const ExpertSet& ExpertPool::layer(int64_t layer) const {
  MOET_CHECK(has_layer(layer), "expert pool: layer {} has no experts", layer);
  return *layers_[size_t(layer)];
}

ExpertSet& ExpertPool::mutable_layer(int64_t layer) {
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

void ExpertPool::set_tracking(int64_t layer, const ExpertTracking& tracking) { mutable_layer(layer).tracking = tracking; }

void ExpertPool::update_layer(int64_t layer, std::span<const int64_t> experts, std::span<const ExpertWeights> weights) {
  backend_.expert_set_update(mutable_layer(layer), experts, weights);
}

void ExpertPool::begin_forward() {
  if (residency_) residency_->begin_forward();
}

void ExpertPool::run(int64_t layer, const Tensor& x, const Tensor& expert_ids, const Tensor& weights, Tensor& out) {
  if (observer_) observer_->observe(backend_, layer, x, expert_ids, this->layer(layer));
  if (residency_ && residency_->layerwise()) return residency_->run_layer(layer, x, expert_ids, weights, out);
  backend_.moe_experts(x, this->layer(layer), expert_ids, weights, out);
}

}  // namespace moet
