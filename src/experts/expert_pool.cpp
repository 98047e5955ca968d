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
  std::vector<ExpertWeights> weights(static_cast<size_t>(experts_));  // other ranks' experts stay absent
  if (!tiered())
    for (int64_t e = loader.expert_begin(); e < loader.expert_end(); ++e)
      weights[size_t(e)] = loader.load(sink, layer, e);
  layers_[size_t(layer)] = backend_.expert_set(loader.layout(), std::move(weights));
}

void ExpertPool::plan_tiering(const TieringConfig& config) {
  for (const auto& l : layers_) MOET_CHECK(!l.has_value(), "expert pool: tiering is planned before the layers load");
  tiering_ = config;
}

void ExpertPool::start_tiering(ExpertLoader& loader, ExpertUploadSink& sink, int64_t top_k) {
  MOET_CHECK(tiered(), "expert pool: tiering was not planned");
  TieringConfig t = *tiering_;
  const ExpertRowLayout row = loader.row_layout();
  if (t.residency.tiering == ExpertTiering::inclusive) {
    residency_ = std::make_unique<ExpertResidency>(backend_, *this, ensure_tracker(),
                                                   rows_store(t.store, loader, sink), t.residency, row, top_k);
    return;
  }
  // Exclusive: the pool's experts (expert-major, so every layer gets its share) are loaded into the
  // slots here, the store holds the others.
  MOET_CHECK(t.residency.slots > 0 || t.residency.cache_bytes > 0,
             "--expert-tiering exclusive sizes the store by the cache: give --expert-cache-gb GiB or "
             "--expert-cache-slots N (not auto)");
  int64_t count = t.residency.slots > 0 ? t.residency.slots : int64_t(t.residency.cache_bytes / row.bytes);
  std::vector<int64_t> moe_layers;
  for (int64_t l = 0; l < layers(); ++l)
    if (has_layer(l)) moe_layers.push_back(l);
  std::vector<ExpertKey> held;
  std::vector<bool> in_pool(size_t(layers() * experts_), false);
  for (int64_t e = 0; e < experts_ && int64_t(held.size()) < count; ++e)
    for (size_t i = 0; i < moe_layers.size() && int64_t(held.size()) < count; ++i) {
      held.push_back({moe_layers[i], e});
      in_pool[size_t(moe_layers[i] * experts_ + e)] = true;
    }
  t.store.exclusive = true;
  t.store.held_elsewhere = [in_pool, experts = experts_](const ExpertKey& k) {
    return in_pool[size_t(k.layer * experts + k.expert)];
  };
  residency_ = std::make_unique<ExpertResidency>(backend_, *this, ensure_tracker(), rows_store(t.store, loader, sink),
                                                 t.residency, row, top_k);
  residency_->preload(held, [&](int64_t layer, int64_t expert, uint8_t* dst) {
    loader.load_row(sink, layer, expert, dst);
  });
}

std::unique_ptr<ExpertStore> ExpertPool::rows_store(ExpertStoreOptions options, ExpertLoader& loader,
                                                    ExpertUploadSink& sink) {
  std::vector<int64_t> moe_layers;
  for (int64_t l = 0; l < layers(); ++l)
    if (has_layer(l)) moe_layers.push_back(l);
  if (options.kind != ExpertStoreKind::ram) {
    MOET_CHECK(loader.pack_paths().has_value(), "--expert-store / --fp4-store {} reads a pack file: give --pack-dir",
               expert_store_name(options.kind));
    options.pack = *loader.pack_paths();
    options.spec = *loader.pack_spec();
    for (int64_t l : moe_layers)
      for (int64_t e = 0; e < experts_; ++e) loader.mark_used(sink, l, e);
  }
  const ExpertRowFn fill = [&](int64_t layer, int64_t expert, uint8_t* dst) {
    loader.load_row(sink, layer, expert, dst);
  };
  return expert_store_create(options, backend_, moe_layers, experts_, loader.row_layout().bytes, fill);
}

void ExpertPool::plan_fp4_tier(const Fp4TierConfig& config) {
  for (const auto& l : layers_)
    MOET_CHECK(!l.has_value(), "expert pool: the FP4 tier is planned before the layers load");
  fp4_config_ = config;
}

void ExpertPool::start_fp4_tier(ExpertLoader& loader, ExpertUploadSink& sink, int64_t top_k) {
  MOET_CHECK(fp4_config_.has_value(), "expert pool: the FP4 tier was not planned");
  const ExpertLayout tier = loader.layout();
  base_.assign(size_t(layers()), {});
  tier_.assign(size_t(layers()), {});
  for (int64_t l = 0; l < layers(); ++l) {
    if (!has_layer(l)) continue;
    ExpertSet& set = mutable_layer(l);
    MOET_CHECK(set.layout.format == ExpertFormat::w2 && tier.hidden == set.layout.hidden &&
                   tier.inner == set.layout.inner,
               "the FP4 tier sits over W2 experts (--experts w2)");
    base_[size_t(l)] = set.experts;
    tier_[size_t(l)].assign(size_t(experts_), ExpertWeights{});
    backend_.expert_set_add_tier(set, tier.format);
  }
  std::unique_ptr<ExpertStore> store = rows_store(fp4_config_->store, loader, sink);
  fp4_tier_ = std::make_unique<Fp4Tier>(backend_, *this, ensure_tracker(), std::move(store), *fp4_config_, tier,
                                        loader.row_layout(), top_k);
}

ExpertTracker& ExpertPool::ensure_tracker() {
  if (!tracker_) tracker_ = std::make_unique<ExpertTracker>(backend_, *this);
  return *tracker_;
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
  if (tier_.empty()) return backend_.expert_set_update(mutable_layer(layer), experts, weights);
  MOET_CHECK(experts.size() == weights.size(), "expert pool: {} entries for {} weights", experts.size(),
             weights.size());
  for (size_t i = 0; i < experts.size(); ++i) base_[size_t(layer)].at(size_t(experts[i])) = weights[i];
  write_resolved(layer, experts);
}

void ExpertPool::update_tier(int64_t layer, std::span<const int64_t> experts, std::span<const ExpertWeights> weights) {
  MOET_CHECK(!tier_.empty() && has_layer(layer) && experts.size() == weights.size(),
             "expert pool: a tier update without an FP4 tier, or of a layer without experts");
  for (size_t i = 0; i < experts.size(); ++i) tier_[size_t(layer)].at(size_t(experts[i])) = weights[i];
  write_resolved(layer, experts);
}

void ExpertPool::write_resolved(int64_t layer, std::span<const int64_t> experts) {
  std::vector<ExpertWeights> resolved;
  for (int64_t e : experts) {
    const ExpertWeights& tier = tier_[size_t(layer)][size_t(e)];
    resolved.push_back(tier.present() ? tier : base_[size_t(layer)][size_t(e)]);
  }
  backend_.expert_set_update(mutable_layer(layer), experts, resolved);
}

bool ExpertPool::tier_present(int64_t layer, int64_t expert) const {
  return !tier_.empty() && has_layer(layer) && tier_[size_t(layer)].at(size_t(expert)).present();
}

void ExpertPool::mask_layer(int64_t layer, const std::vector<bool>& keep) {
  MOET_CHECK(masked_.count(layer) == 0 && keep.size() == size_t(experts_), "expert pool: bad mask of layer {}", layer);
  const std::vector<ExpertWeights>& current = this->layer(layer).experts;
  masked_[layer] = current;
  std::vector<int64_t> ids;
  std::vector<ExpertWeights> entries;
  for (int64_t e = 0; e < experts_; ++e) {
    if (keep[size_t(e)] || (!current[size_t(e)].present() && !current[size_t(e)].host)) continue;
    ids.push_back(e);
    entries.push_back({});
  }
  backend_.expert_set_update(mutable_layer(layer), ids, entries);
}

void ExpertPool::restore_layer(int64_t layer) {
  auto it = masked_.find(layer);
  MOET_CHECK(it != masked_.end(), "expert pool: layer {} is not masked", layer);
  std::vector<int64_t> ids(static_cast<size_t>(experts_));
  for (int64_t e = 0; e < experts_; ++e) ids[size_t(e)] = e;
  backend_.expert_set_update(mutable_layer(layer), ids, it->second);
  masked_.erase(it);
}

void ExpertPool::link_host(int64_t layer, const HostExpertLink& link) { mutable_layer(layer).host = link; }

void ExpertPool::set_router(int64_t layer, const Tensor* weight, const Tensor* bias, const RouterParams& params) {
  MOET_CHECK(layer >= 0 && layer < layers() && weight != nullptr, "expert pool: a router for layer {}", layer);
  routers_.resize(size_t(layers()));
  routers_[size_t(layer)] = {weight, bias, params};
}

int64_t ExpertPool::next_routed_layer(int64_t layer) const {
  for (int64_t l = layer + 1; l < int64_t(routers_.size()); ++l)
    if (routers_[size_t(l)].weight && has_layer(l)) return l;
  return -1;
}

std::vector<int32_t> ExpertPool::predict(int64_t layer, const Tensor& x) {
  const Router& r = routers_[size_t(layer)];
  Tensor logits = backend_.alloc({x.rows(), r.params.experts});
  backend_.matmul(x, *r.weight, r.bias, logits);
  Tensor ids = backend_.alloc({x.rows(), r.params.top_k}, DType::i32);
  Tensor weights = backend_.alloc({x.rows(), r.params.top_k});
  backend_.router(r.params, logits, ids, weights);
  std::vector<int32_t> host(size_t(ids.numel()));
  backend_.to_host(ids, host.data());
  return host;
}

void ExpertPool::begin_forward() {
  if (tracker_) tracker_->clear();
}

void ExpertPool::run(int64_t layer, const Tensor& x, const Tensor& expert_ids, const Tensor& weights, Tensor& out) {
  if (observer_) observer_->observe(backend_, layer, x, expert_ids, this->layer(layer));
  if (!residency_ || !residency_->layerwise())
    return backend_.moe_experts(x, this->layer(layer), expert_ids, weights, out);
  residency_->run_layer(layer, x, expert_ids, weights, out);
  const int64_t next = residency_->predicts(x.rows()) ? next_routed_layer(layer) : -1;
  if (next >= 0) residency_->prefetch(next, predict(next, x));
}

}  // namespace moet
