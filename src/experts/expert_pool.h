// Every MoE layer's routed experts in backend memory: per layer the backend's ExpertSet (the
// table the MoE kernels read at run time) and per expert its format, so a layer may later hold
// experts of different formats side by side (an FP4 tier beside the W2 base). An entry may be
// absent (not in backend memory); the MoE ops then treat it as contributing nothing. MoE blocks
// keep the pool and their layer index and run their routed experts through it (run()), so
// residency needs no change in models/.
// Tiered (plan_tiering() before the layers load, start_tiering() after): the layers load as
// all-absent tables, the rows go to a host store, and an ExpertResidency (residency.h) keeps a
// pool of slots filled; run() then lets it make a layer resident first in eager steps, and
// begin_forward() clears what the MoE ops record.
#pragma once

#include "backend/backend.h"
#include "experts/expert_loader.h"
#include "experts/residency.h"

#include <cstdint>
#include <functional>
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

  // Loads every expert of `layer` through `loader` and builds the layer's table (tiered: an
  // all-absent table; the rows are the store's).
  void load_layer(int64_t layer, ExpertLoader& loader, ExpertUploadSink& sink);

  void plan_tiering(const TieringConfig& config);
  bool tiered() const { return tiering_.has_value(); }
  // Once every layer is loaded: the store (ram: every row through `loader`) and the residency.
  void start_tiering(ExpertLoader& loader, ExpertUploadSink& sink, int64_t top_k);
  ExpertResidency* residency() { return residency_.get(); }

  int64_t layers() const { return int64_t(layers_.size()); }
  int64_t experts_per_layer() const { return experts_; }
  bool has_layer(int64_t layer) const;
  // The layer's experts as the MoE op reads them (the layer must have been loaded).
  const ExpertSet& layer(int64_t layer) const;
  ExpertFormat format(int64_t layer, int64_t expert) const;
  bool present(int64_t layer, int64_t expert) const;

  // The residency's access to the tables: where a layer records, and new entries.
  void set_tracking(int64_t layer, const ExpertTracking& tracking);
  void update_layer(int64_t layer, std::span<const int64_t> experts, std::span<const ExpertWeights> weights);

  // Inside a forward, before its first MoE layer.
  void begin_forward();
  // Observes every later run() (null: none); the observer must outlive its use.
  void set_observer(ExpertObserver* observer) { observer_ = observer; }
  // out = the layer's routed experts applied to x as expert_ids / weights route it.
  void run(int64_t layer, const Tensor& x, const Tensor& expert_ids, const Tensor& weights, Tensor& out);

 private:
  const ExpertWeights& entry(int64_t layer, int64_t expert) const;
  ExpertSet& mutable_layer(int64_t layer);

  Backend& backend_;
  int64_t experts_;
  std::vector<std::optional<ExpertSet>> layers_;
  std::optional<TieringConfig> tiering_;
  std::unique_ptr<ExpertResidency> residency_;
  ExpertObserver* observer_ = nullptr;
};

}  // namespace moet
