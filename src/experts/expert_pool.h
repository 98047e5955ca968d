// Every MoE layer's routed experts in backend memory: per layer the backend's ExpertSet (the
// table the MoE kernels read at run time) and per expert its format, so a layer may later hold
// experts of different formats side by side (an FP4 tier beside the W2 base). An entry may be
// absent (not in backend memory); the MoE ops then treat it as contributing nothing. MoE blocks
// keep the pool and their layer index and read the layer's set at every forward, so whatever
// changes the pool's entries (residency) needs no change in models/.
#pragma once

#include "backend/backend.h"

#include <cstdint>
#include <functional>
#include <optional>
#include <vector>

namespace moet {

class ExpertPool {
 public:
  ExpertPool(Backend& backend, int64_t layers, int64_t experts_per_layer);

  // Loads every expert of `layer` through load(expert) and builds the layer's table.
  void load_layer(int64_t layer, const ExpertLayout& layout, const std::function<ExpertWeights(int64_t)>& load);

  int64_t layers() const { return int64_t(layers_.size()); }
  int64_t experts_per_layer() const { return experts_; }
  bool has_layer(int64_t layer) const;
  // The layer's experts as the MoE op reads them (the layer must have been loaded).
  const ExpertSet& layer(int64_t layer) const;
  ExpertFormat format(int64_t layer, int64_t expert) const;
  bool present(int64_t layer, int64_t expert) const;

 private:
  const ExpertWeights& entry(int64_t layer, int64_t expert) const;

  Backend& backend_;
  int64_t experts_;
  std::vector<std::optional<ExpertSet>> layers_;
};

}  // namespace moet
