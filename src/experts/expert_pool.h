// Every MoE layer's routed experts in backend memory: per layer the backend's ExpertSet (the
// table the MoE kernels read at run time) and per expert its format, so a layer may later hold
// experts of different formats side by side (an FP4 tier beside the W2 base). An entry may be
// absent (not in backend memory); the MoE ops then treat it as contributing nothing. MoE blocks
// keep the pool and their layer index and run their routed experts through it (run()), so
// residency needs no change in models/.
// Tiered (plan_tiering() before the layers load, start_tiering() after): the layers load as
// all-absent tables, the rows go to a host store, and an ExpertResidency (residency.h) keeps a
// pool of slots filled; run() then lets it make a layer resident first in eager steps, and
// begin_forward() clears what the MoE ops record (expert_tracker.h).
// Exclusive tiering fills the slots at load with the first of the experts in expert-major order
// (expert 0 of every layer, then expert 1, ...) and the store takes the rest. MoE blocks register
// their routers (set_router()) so that, with --expert-prefetch next-layer, run() can apply the
// next MoE layer's router to this layer's input and let the residency load what it predicts.
// With an FP4 tier (plan_fp4_tier(), start_fp4_tier(); fp4_tier.h) an entry resolves to the
// expert's FP4 slot when it has one, else to its base entry (resident, a W2 slot, or absent): the
// pool keeps both and writes the resolved one (update_layer() sets base entries,
// update_tier() tier entries).
#pragma once

#include "backend/backend.h"
#include "experts/expert_loader.h"
#include "experts/expert_tracker.h"
#include "experts/fp4_tier.h"
#include "experts/residency.h"

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <vector>

namespace moet {

// Sees each MoE layer's routing as run() receives it (the imatrix collector: experts/imatrix.h).
// Called on the host inside the forward, before the layer's experts run: an observed forward must
// run eagerly (no graph capture); with no observer set, run() only tests a null pointer.
class ExpertObserver {
 public:
  virtual ~ExpertObserver() = default;
  virtual void observe(Backend& backend, int64_t layer, const Tensor& x, const Tensor& expert_ids,
                       const ExpertSet& experts) = 0;
};

class ExpertPool {
 public:
  ExpertPool(Backend& backend, int64_t layers, int64_t experts_per_layer);
  ~ExpertPool();

  // Loads the experts of `layer` that `loader` holds (all of them; a rank of a parallel model: its
  // range, the others absent) and builds the layer's table (tiered: an all-absent table; the rows
  // are the store's).
  void load_layer(int64_t layer, ExpertLoader& loader, ExpertUploadSink& sink);

  void plan_tiering(const TieringConfig& config);
  bool tiered() const { return tiering_.has_value(); }
  // Once every layer is loaded: the store (ram: every row through `loader`) and the residency.
  void start_tiering(ExpertLoader& loader, ExpertUploadSink& sink, int64_t top_k);
  ExpertResidency* residency() { return residency_.get(); }
  const ExpertResidency* residency() const { return residency_.get(); }

  // The FP4 tier: planned before the layers load, started after them (and after any tiering)
  // with the loader of its rows (the base loader itself for a tier of the base's format).
  void plan_fp4_tier(const Fp4TierConfig& config);
  void start_fp4_tier(ExpertLoader& loader, ExpertUploadSink& sink, int64_t top_k);
  Fp4Tier* fp4_tier() { return fp4_tier_.get(); }
  const Fp4Tier* fp4_tier() const { return fp4_tier_.get(); }
  // What the MoE ops record (null unless the experts are tiered or have an FP4 tier).
  ExpertTracker* tracker() { return tracker_.get(); }

  int64_t layers() const { return int64_t(layers_.size()); }
  int64_t experts_per_layer() const { return experts_; }
  bool has_layer(int64_t layer) const;
  // The layer's experts as the MoE op reads them (the layer must have been loaded).
  const ExpertSet& layer(int64_t layer) const;
  ExpertFormat format(int64_t layer, int64_t expert) const;
  bool present(int64_t layer, int64_t expert) const;

  // The residency's and the tier's access to the tables: where a layer records, and new base /
  // tier entries (ExpertWeights{}: none).
  void set_tracking(int64_t layer, const ExpertTracking& tracking);
  void update_layer(int64_t layer, std::span<const int64_t> experts, std::span<const ExpertWeights> weights);
  void update_tier(int64_t layer, std::span<const int64_t> experts, std::span<const ExpertWeights> weights);
  bool tier_present(int64_t layer, int64_t expert) const;
  // Until restore_layer(): only the experts `keep` names (by expert index) are present (or host
  // entries) in the layer's table (a layer run in chunks).
  void mask_layer(int64_t layer, const std::vector<bool>& keep);
  void restore_layer(int64_t layer);
  // The residency's host experts: the layer's link (before any step is captured).
  void link_host(int64_t layer, const HostExpertLink& link);

  // The MoE block of `layer` routes with `weight` [experts, hidden] (+ `bias`, empty: none) and
  // `params`; the tensors must outlive the pool's use of them.
  void set_router(int64_t layer, const Tensor* weight, const Tensor* bias, const RouterParams& params);

  // Inside a forward, before its first MoE layer.
  void begin_forward();
  // Observes every later run() (null: none); the observer must outlive its use.
  void set_observer(ExpertObserver* observer) { observer_ = observer; }
  // out = the layer's routed experts applied to x as expert_ids / weights route it.
  void run(int64_t layer, const Tensor& x, const Tensor& expert_ids, const Tensor& weights, Tensor& out);

 private:
  const ExpertWeights& entry(int64_t layer, int64_t expert) const;
  ExpertSet& mutable_layer(int64_t layer);
  ExpertTracker& ensure_tracker();
  // The host store `options` names over `loader`'s rows (pack stores: its pack file).
  std::unique_ptr<ExpertStore> rows_store(ExpertStoreOptions options, ExpertLoader& loader, ExpertUploadSink& sink);
  // The entries of `experts` as they resolve (tier over base) into the layer's table.
  void write_resolved(int64_t layer, std::span<const int64_t> experts);
  // Prefetch: the next MoE layer after `layer` with a router (-1: none), and its routing of x.
  int64_t next_routed_layer(int64_t layer) const;
  std::vector<int32_t> predict(int64_t layer, const Tensor& x);

  struct Router {
    const Tensor* weight = nullptr;
    const Tensor* bias = nullptr;
    RouterParams params{};
  };

  Backend& backend_;
  int64_t experts_;
  std::vector<std::optional<ExpertSet>> layers_;
  std::optional<TieringConfig> tiering_;
  std::unique_ptr<ExpertTracker> tracker_;
  std::unique_ptr<ExpertResidency> residency_;
  std::optional<Fp4TierConfig> fp4_config_;
  std::unique_ptr<Fp4Tier> fp4_tier_;
  // With an FP4 tier: per layer, the base entries and the tier's (empty: not a MoE layer).
  std::vector<std::vector<ExpertWeights>> base_, tier_;
  std::map<int64_t, std::vector<ExpertWeights>> masked_;  // mask_layer(): the entries to restore
  std::vector<Router> routers_;                           // [layers] (weight null: none registered)
  ExpertObserver* observer_ = nullptr;
};

}  // namespace moet
