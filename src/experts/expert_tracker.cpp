// ExpertTracker implementation (see expert_tracker.h).
#include "experts/expert_tracker.h"

#include "core/error.h"
#include "experts/expert_pool.h"

namespace moet {

ExpertTracker::ExpertTracker(Backend& backend, ExpertPool& pool)
    : backend_(backend), layers_(pool.layers()), experts_(pool.experts_per_layer()),
      words_((pool.experts_per_layer() + 31) / 32) {
  for (int64_t l = 0; l < layers_; ++l)
    if (pool.has_layer(l)) moe_layers_.push_back(l);
  MOET_CHECK(!moe_layers_.empty(), "expert tracking: the model has no MoE layer");
  buffer_ = backend_.alloc({kCounters + 2 * layers_ * words_}, DType::i32);
  backend_.fill_zero(buffer_);
  host_.assign(size_t(buffer_.numel()), 0);
  auto* base = buffer_.as<int32_t>();
  for (int64_t l : moe_layers_) {
    ExpertTracking t;
    t.miss_count = base;
    t.routed_items = base + 1;
    t.absent_bits = reinterpret_cast<uint32_t*>(base + kCounters + (kAbsentBits * layers_ + l) * words_);
    t.used_bits = reinterpret_cast<uint32_t*>(base + kCounters + (kUsedBits * layers_ + l) * words_);
    pool.set_tracking(l, t);
  }
}

void ExpertTracker::read() {
  if (!stale_) return;
  backend_.to_host(buffer_, host_.data());
  stale_ = false;
}

}  // namespace moet
