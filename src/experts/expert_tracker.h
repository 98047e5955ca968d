// What the MoE ops recorded in a forward (backend/expert_types.h, ExpertTracking), for every MoE
// layer of an ExpertPool: one backend buffer [counters | absent bits | used bits] that each MoE
// layer's table points into, cleared inside the forward before the first MoE layer (captured in
// CUDA graphs like the rest) and copied to the host after a pass (a few KB), once per pass whoever
// asks first: the expert cache (residency.h) for its misses, the FP4 tier (fp4_tier.h) for the
// routing it counts and the gate force-promotes. Each of them calls begin_pass() before a pass
// and read() after it (host calls: a graph replay skips the forward's host code). Counts of
// routings are exact unless a pass ran a layer in chunks with the rest masked absent.
#pragma once

#include "backend/backend.h"

#include <cstdint>
#include <vector>

namespace moet {

class ExpertPool;

class ExpertTracker {
 public:
  // Points every MoE layer of `pool` at the buffer.
  ExpertTracker(Backend& backend, ExpertPool& pool);

  // Before a pass (any number of callers).
  void begin_pass() {
    stale_ = true;
    exact_ = true;
  }
  // Inside the forward, before any MoE layer.
  void clear() { backend_.fill_zero(buffer_); }
  // After a pass: copies the buffer to the host (the first call after begin_pass()).
  void read();
  // A layer ran in chunks: the routing counts of this pass overcount.
  void set_inexact() { exact_ = false; }

  // Of the last forward read.
  int64_t misses() const { return int64_t(host_[0]); }
  // Routings whose expert was present in the layer's format / absent / present in the tier's.
  int64_t routed_items(int which) const { return int64_t(host_[size_t(1 + which)]); }
  bool counts_exact() const { return exact_; }
  bool absent(int64_t layer, int64_t expert) const { return bit(kAbsentBits, layer, expert); }
  bool used(int64_t layer, int64_t expert) const { return bit(kUsedBits, layer, expert); }
  bool routed(int64_t layer, int64_t expert) const { return absent(layer, expert) || used(layer, expert); }
  const std::vector<int64_t>& moe_layers() const { return moe_layers_; }
  int64_t experts() const { return experts_; }

 private:
  static constexpr int64_t kCounters = 4;  // miss_count, routed_items[3]
  enum Plane { kAbsentBits = 0, kUsedBits = 1 };
  bool bit(Plane plane, int64_t layer, int64_t expert) const {
    const uint32_t word = host_[size_t(kCounters + (plane * layers_ + layer) * words_ + expert / 32)];
    return (word >> (expert % 32)) & 1u;
  }

  Backend& backend_;
  int64_t layers_, experts_, words_;
  std::vector<int64_t> moe_layers_;
  Tensor buffer_;
  std::vector<uint32_t> host_;
  bool stale_ = true;  // the host copy is of an earlier pass
  bool exact_ = true;
};

}  // namespace moet
