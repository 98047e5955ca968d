// ExpertResidency implementation (see residency.h).
#include "experts/residency.h"

#include "core/error.h"
#include "core/log.h"
#include "experts/expert_kpis.h"
#include "experts/expert_pool.h"
#include "experts/expert_tracker.h"

#include <algorithm>
#include <chrono>
#include <map>

namespace moet {
namespace {

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

}  // namespace

VictimPolicy victim_policy_parse(const std::string& name) {
  if (name == "lru") return VictimPolicy::lru;
  if (name == "frequency") return VictimPolicy::frequency;
  fail("unknown expert eviction policy '{}' (expected lru or frequency)", name);
}

ExpertResidency::ExpertResidency(Backend& backend, ExpertPool& pool, ExpertTracker& tracker,
                                 std::unique_ptr<ExpertStore> store, const ResidencyOptions& options,
                                 const ExpertRowLayout& row, int64_t top_k)
    : backend_(backend), pool_(pool), tracker_(tracker), store_(std::move(store)), options_(options),
      layers_(pool.layers()), experts_(pool.experts_per_layer()), top_k_(top_k), row_(row) {
  for (int64_t l = 0; l < layers_; ++l)
    if (pool.has_layer(l)) moe_layers_.push_back(l);
  MOET_CHECK(!moe_layers_.empty(), "expert residency: the model has no MoE layer");
  MOET_CHECK(options.max_replays >= 0 && options.miss_tolerance >= 0, "max_replays and miss_tolerance must be >= 0");
  MOET_CHECK(options.policy != VictimPolicy::frequency || (options.decay > 0.0 && options.decay <= 1.0),
             "the frequency policy's decay must be in (0, 1] (got {})", options.decay);
  stats_.total = int64_t(moe_layers_.size()) * experts_;
}

void ExpertResidency::allocate() {
  if (slots_.count() > 0) return;
  const int64_t total = stats_.total;
  int64_t count = options_.slots;
  if (count <= 0 && options_.cache_bytes > 0) count = int64_t(options_.cache_bytes / row_.bytes);
  if (count <= 0) {
    const uint64_t left = backend_.memory_available();
    count = left > ResidencyOptions::kAutoReserveBytes
                ? int64_t((left - ResidencyOptions::kAutoReserveBytes) / row_.bytes) : 0;
    MOET_LOG_INFO("expert cache auto: {:.1f} GiB left in {} (after weights and KV), {:.1f} GiB kept for activations",
                  double(left) / double(1ull << 30), backend_.name(),
                  double(ResidencyOptions::kAutoReserveBytes) / double(1ull << 30));
  }
  count = std::min(count, total);
  const int64_t minimum = std::min(experts_, std::max<int64_t>(1, options_.max_step_rows) * top_k_);
  MOET_CHECK(count >= minimum,
             "the expert cache holds {} experts, fewer than a decode step of {} rows can route to in one layer ({}): "
             "give it at least {} slots ({:.2f} GiB; --expert-cache-gb / --expert-cache-slots)",
             count, options_.max_step_rows, minimum, minimum, double(minimum) * double(row_.bytes) / double(1ull << 30));
  slots_ = backend_.alloc_expert_slots(pool_.layer(moe_layers_.front()).layout, row_, count);
  key_of_.assign(size_t(count), -1);
  last_use_.assign(size_t(count), 0);
  uses_.assign(size_t(count), 0.0);
  slot_of_.assign(size_t(layers_ * experts_), -1);
  MOET_LOG_INFO("expert cache: {} of {} routed experts in {} ({:.1f}% coverage, {:.2f} GiB), {} store, {} eviction",
                count, total, backend_.name(), 100.0 * double(count) / double(total),
                double(count) * double(row_.bytes) / double(1ull << 30), expert_store_name(store_->kind()),
                options_.policy == VictimPolicy::lru ? "lru" : "frequency");
}

ExpertResidency::~ExpertResidency() = default;

bool ExpertResidency::begin_pass(int64_t rows, bool recurring, int64_t pass) {
  MOET_CHECK(slots_.count() > 0, "expert residency: the slot pool was not allocated");
  tracker_.begin_pass();
  if (pass == 0) {
    if (options_.kpi_every > 0 && stats_.steps > 0 && stats_.steps % options_.kpi_every == 0) {
      const ResidencyStats now = stats();
      MOET_LOG_INFO("{}", expert_kpi_line(expert_kpis(now, logged_stats_, store_->counters(), logged_store_)));
      logged_stats_ = now;
      logged_store_ = store_->counters();
    }
    ++stats_.steps;
    ++tick_;
    if (options_.policy == VictimPolicy::frequency)
      for (double& u : uses_) u *= options_.decay;
    const int64_t step_set = int64_t(moe_layers_.size()) * std::min(experts_, rows * top_k_);
    layerwise_ = !recurring || step_set > slots_.count() || prefer_layerwise_;
    if (layerwise_) ++stats_.layerwise_steps;
    step_rows_ = rows;
    step_fetched_ = stats_.fetched_rows;
  }
  ++stats_.passes;
  return !layerwise_;
}

void ExpertResidency::touch(int64_t slot) {
  last_use_[size_t(slot)] = tick_;
  uses_[size_t(slot)] += 1.0;
}

std::vector<int64_t> ExpertResidency::victims(size_t count, const std::vector<bool>& keep) const {
  std::vector<int64_t> free_slots, used;
  for (int64_t s = 0; s < slots_.count(); ++s) {
    const int64_t key = key_of_[size_t(s)];
    if (key < 0) {
      free_slots.push_back(s);
    } else if (!keep[size_t(key)]) {
      used.push_back(s);
    }
  }
  const auto colder = [&](int64_t a, int64_t b) {
    if (options_.policy == VictimPolicy::frequency && uses_[size_t(a)] != uses_[size_t(b)])
      return uses_[size_t(a)] < uses_[size_t(b)];
    return last_use_[size_t(a)] != last_use_[size_t(b)] ? last_use_[size_t(a)] < last_use_[size_t(b)] : a < b;
  };
  const size_t from_used = count > free_slots.size() ? count - free_slots.size() : 0;
  if (from_used > used.size()) return {};
  std::partial_sort(used.begin(), used.begin() + ptrdiff_t(from_used), used.end(), colder);
  free_slots.resize(std::min(free_slots.size(), count));
  free_slots.insert(free_slots.end(), used.begin(), used.begin() + ptrdiff_t(from_used));
  return free_slots;
}

void ExpertResidency::point_tables(std::span<const Key> keys, bool present) {
  std::map<int64_t, std::pair<std::vector<int64_t>, std::vector<ExpertWeights>>> by_layer;
  for (const Key& k : keys) {
    auto& [experts, weights] = by_layer[k.layer];
    experts.push_back(k.expert);
    weights.push_back(present ? slots_.weights[size_t(slot_of_[size_t(index(k.layer, k.expert))])] : ExpertWeights{});
  }
  for (auto& [layer, update] : by_layer) pool_.update_layer(layer, update.first, update.second);
}

bool ExpertResidency::ensure(std::span<const Key> keys, const std::vector<bool>& keep, bool scan) {
  std::vector<Key> missing;
  for (const Key& k : keys)
    if (slot_of_[size_t(index(k.layer, k.expert))] < 0) missing.push_back(k);
  if (missing.empty()) return true;
  // Victims first (all of them, so that nothing changes when there are too few).
  const std::vector<int64_t> chosen = victims(missing.size(), keep);
  if (chosen.size() < missing.size()) return false;
  std::vector<Key> evicted;
  const auto start = std::chrono::steady_clock::now();
  for (int64_t s : chosen) {
    const int64_t old = key_of_[size_t(s)];
    if (old < 0) continue;
    evicted.push_back({old / experts_, old % experts_});
    slot_of_[size_t(old)] = -1;
    key_of_[size_t(s)] = -1;
  }
  point_tables(evicted, false);
  const size_t batch = std::min(store_->max_batch(), missing.size());
  for (size_t first = 0; first < missing.size(); first += batch) {
    const size_t n = std::min(batch, missing.size() - first);
    std::vector<ExpertKey> store_keys;
    for (size_t i = first; i < first + n; ++i) store_keys.push_back({missing[i].layer, missing[i].expert});
    const std::vector<const uint8_t*> rows = store_->fetch(store_keys, scan);
    const std::vector<int64_t> ids(chosen.begin() + ptrdiff_t(first), chosen.begin() + ptrdiff_t(first + n));
    backend_.expert_slots_load(slots_, ids, rows);
    for (size_t i = first; i < first + n; ++i) {
      const int64_t key = index(missing[i].layer, missing[i].expert);
      slot_of_[size_t(key)] = chosen[i];
      key_of_[size_t(chosen[i])] = key;
      touch(chosen[i]);
    }
  }
  point_tables(missing, true);
  stats_.fetched_rows += int64_t(missing.size());
  stats_.fetched_bytes += missing.size() * store_->row_bytes();
  stats_.fetch_seconds += seconds_since(start);
  return true;
}

bool ExpertResidency::after_pass(int64_t pass) {
  replayed_ = false;
  const int64_t one_layer = std::min(experts_, step_rows_ * top_k_);
  if (layerwise_) {  // complete; graphs again once a step needs at most one layer's worth
    if (stats_.fetched_rows - step_fetched_ <= one_layer) prefer_layerwise_ = false;
    return false;
  }
  tracker_.read();
  const int64_t misses = tracker_.misses();
  if (pass == 0) {
    const int64_t found = tracker_.routed_items(0) + tracker_.routed_items(2);
    stats_.resident_items += found;
    stats_.routed_items += found + tracker_.routed_items(1);
  }
  stats_.missing_pairs += misses;
  std::vector<bool> keep(size_t(layers_ * experts_), false);
  std::vector<Key> missing;
  for (int64_t l : moe_layers_) {
    for (int64_t e = 0; e < experts_; ++e) {
      if (tracker_.used(l, e) && !pool_.tier_present(l, e)) {  // a tier expert needs no slot
        keep[size_t(index(l, e))] = true;
        if (slot_of_[size_t(index(l, e))] >= 0) touch(slot_of_[size_t(index(l, e))]);
      }
      if (tracker_.absent(l, e)) {
        keep[size_t(index(l, e))] = true;
        missing.push_back({l, e});
      }
    }
  }
  if (misses <= options_.miss_tolerance) {
    stats_.accepted_misses += misses;
    return false;
  }
  if (pass >= options_.max_replays) {
    if (!warned_max_replays_)
      MOET_LOG_WARN("expert cache: a step still missed {} experts after {} replays (--max-replays); accepting it "
                    "(said once)", misses, pass);
    warned_max_replays_ = true;
    stats_.accepted_misses += misses;
    return false;
  }
  if (pass == 0) ++stats_.replayed_steps;
  replayed_ = true;
  if (misses > one_layer) {  // routed from already-changed hidden states: run it layer by layer
    layerwise_ = prefer_layerwise_ = true;
    ++stats_.layerwise_steps;
    return true;
  }
  // The pass's experts and the missing ones together do not fit: run the step again layer by layer.
  if (!ensure(missing, keep, false)) {
    layerwise_ = true;
    ++stats_.layerwise_steps;
  }
  return true;
}

void ExpertResidency::run_layer(int64_t layer, const Tensor& x, const Tensor& expert_ids, const Tensor& weights,
                                Tensor& out) {
  std::vector<int32_t> ids(size_t(expert_ids.numel()));
  backend_.to_host(expert_ids, ids.data());
  std::vector<bool> routed(size_t(experts_), false);
  for (int32_t e : ids)
    if (e >= 0 && e < experts_) routed[size_t(e)] = true;
  // The routed experts that need a W2 slot (the FP4 tier's resolve there).
  std::vector<Key> keys;
  for (int64_t e = 0; e < experts_; ++e)
    if (routed[size_t(e)] && !pool_.tier_present(layer, e)) keys.push_back({layer, e});
  stats_.routed_items += int64_t(ids.size());
  for (int32_t e : ids)
    if (e >= 0 && e < experts_ && (slot_of_[size_t(index(layer, e))] >= 0 || pool_.tier_present(layer, e)))
      stats_.resident_items += 1;
  for (const Key& k : keys)
    if (slot_of_[size_t(index(k.layer, k.expert))] < 0) stats_.missing_pairs += 1;  // found missing, fetched
  const int64_t chunk = slots_.count();
  const bool scan = x.rows() > options_.max_step_rows;  // a prefill: do not let it evict the decode hot set
  if (keys.size() > size_t(chunk)) return run_chunked(layer, keys, chunk, scan, x, expert_ids, weights, out);
  std::vector<bool> keep(size_t(layers_ * experts_), false);
  for (const Key& k : keys) keep[size_t(index(k.layer, k.expert))] = true;
  MOET_CHECK(ensure(keys, keep, scan), "expert cache: {} experts do not fit {} slots", keys.size(), chunk);
  backend_.moe_experts(x, pool_.layer(layer), expert_ids, weights, out, false);
}

void ExpertResidency::run_chunked(int64_t layer, std::span<const Key> keys, int64_t chunk, bool scan, const Tensor& x,
                                  const Tensor& expert_ids, const Tensor& weights, Tensor& out) {
  tracker_.set_inexact();  // masked experts count as absent in every chunk but their own
  const auto run_only = [&](const std::vector<bool>& present, bool accumulate) {
    pool_.mask_layer(layer, present);
    backend_.moe_experts(x, pool_.layer(layer), expert_ids, weights, out, accumulate);
    pool_.restore_layer(layer);
  };
  for (size_t first = 0; first < keys.size(); first += size_t(chunk)) {
    const std::span<const Key> part = keys.subspan(first, std::min(size_t(chunk), keys.size() - first));
    std::vector<bool> keep(size_t(layers_ * experts_), false), present(size_t(experts_), false);
    for (const Key& k : part) {
      keep[size_t(index(k.layer, k.expert))] = true;
      present[size_t(k.expert)] = true;
    }
    MOET_CHECK(ensure(part, keep, scan), "expert cache: {} experts do not fit {} slots", part.size(), chunk);
    run_only(present, first > 0);
  }
  std::vector<bool> tier(size_t(experts_), false);
  for (int64_t e = 0; e < experts_; ++e) tier[size_t(e)] = pool_.tier_present(layer, e);
  if (std::find(tier.begin(), tier.end(), true) != tier.end()) run_only(tier, true);
}

ExpertKpis ExpertResidency::kpis() const { return expert_kpis(stats(), {}, store_->counters(), {}); }

ResidencyStats ExpertResidency::stats() const {
  ResidencyStats s = stats_;
  s.resident = int64_t(std::count_if(key_of_.begin(), key_of_.end(), [](int64_t k) { return k >= 0; }));
  return s;
}

}  // namespace moet
