// Fp4Tier implementation (see fp4_tier.h).
#include "experts/fp4_tier.h"

#include "core/error.h"
#include "core/log.h"
#include "experts/expert_pool.h"
#include "experts/expert_tracker.h"
#include "experts/fp4_kpis.h"

#include <algorithm>
#include <map>

namespace moet {

Fp4Tier::Fp4Tier(Backend& backend, ExpertPool& pool, ExpertTracker& tracker, std::unique_ptr<ExpertStore> store,
                 const Fp4TierConfig& config, const ExpertLayout& layout, const ExpertRowLayout& row, int64_t top_k)
    : backend_(backend), pool_(pool), tracker_(tracker), store_(std::move(store)), config_(config), layout_(layout),
      row_(row), layers_(pool.layers()), experts_(pool.experts_per_layer()), top_k_(top_k),
      moe_layers_(tracker.moe_layers()), gate_(config.gate), start_(std::chrono::steady_clock::now()) {
  const Fp4TierOptions& o = config_.tier;
  MOET_CHECK(o.promote_per_step >= 0, "--fp4-promote-per-step must be >= 0 (got {})", o.promote_per_step);
  MOET_CHECK(o.decay > 0.0 && o.decay <= 1.0, "--fp4-decay must be in (0, 1] (got {})", o.decay);
  const size_t n = size_t(layers_ * experts_);
  slot_of_.assign(n, -1);
  uses_.assign(n, 0.0);
  last_routed_.assign(n, false);
  stats_.total = int64_t(moe_layers_.size()) * experts_;
}

Fp4Tier::~Fp4Tier() {
  if (pending_) backend_.expert_slots_wait(pending_->fence);  // the rows it reads belong to the store
}

void Fp4Tier::allocate() {
  if (slots_.count() > 0) return;
  const Fp4TierOptions& o = config_.tier;
  int64_t count = o.slots;
  if (count <= 0 && o.pool_bytes > 0) {
    count = int64_t(o.pool_bytes / row_.bytes);  // may be too few: refused below
  } else if (count <= 0) {
    const uint64_t left = backend_.memory_available();
    count = left > Fp4TierOptions::kAutoReserveBytes ? int64_t((left - Fp4TierOptions::kAutoReserveBytes) / row_.bytes)
                                                     : 0;
    MOET_LOG_INFO("FP4 tier auto: {:.1f} GiB left in {} (after the experts and KV), {:.1f} GiB kept for activations",
                  double(left) / double(1ull << 30), backend_.name(),
                  double(Fp4TierOptions::kAutoReserveBytes) / double(1ull << 30));
  }
  count = std::min(count, stats_.total);
  const int64_t minimum = std::min(experts_, std::max<int64_t>(1, o.max_step_rows) * top_k_);
  MOET_CHECK(count >= minimum,
             "the FP4 tier holds {} experts, fewer than a decode step of {} rows routes to in one layer ({}): "
             "give it at least {} slots ({:.3f} GiB; --fp4-pool-gb / --fp4-pool-slots)",
             count, o.max_step_rows, minimum, minimum, double(minimum) * double(row_.bytes) / double(1ull << 30));
  slots_ = backend_.alloc_expert_slots(layout_, row_, count);
  key_of_.assign(size_t(count), -1);
  const GateOptions& g = gate_.options();
  MOET_LOG_INFO("FP4 tier: {} of {} routed experts ({:.1f}%, {:.3f} GiB) at {}, {} store, {} promotions per step, "
                "decay {}; gate: {} tau {} (rounds {}, budget {})",
                count, stats_.total, 100.0 * double(count) / double(stats_.total),
                double(count) * double(row_.bytes) / double(1ull << 30),
                layout_.format == ExpertFormat::fp4 ? "MXFP4" : "W2", expert_store_name(store_->kind()),
                o.promote_per_step, o.decay, gate_signal_name(g.signal), gate_.tau(), g.rounds, g.budget);
}

void Fp4Tier::begin_pass(int64_t pass) {
  MOET_CHECK(slots_.count() > 0, "FP4 tier: the slot pool was not allocated");
  tracker_.begin_pass();
  if (pass != 0) return;
  fold_last_step();
  if (config_.tier.kpi_every > 0 && stats_.steps > 0 && stats_.steps % config_.tier.kpi_every == 0) log_kpis();
  manage();
}

void Fp4Tier::after_pass() {
  tracker_.read();
  for (int64_t l : moe_layers_)
    for (int64_t e = 0; e < experts_; ++e) last_routed_[size_t(index(l, e))] = tracker_.routed(l, e);
  last_fp4_items_ = tracker_.routed_items(2);
  last_routed_items_ = tracker_.routed_items(0) + tracker_.routed_items(1) + tracker_.routed_items(2);
  last_exact_ = tracker_.counts_exact();
  have_last_ = true;
}

void Fp4Tier::fold_last_step() {
  if (!have_last_) return;
  have_last_ = false;
  const double decay = config_.tier.decay;
  for (size_t i = 0; i < uses_.size(); ++i) uses_[i] = uses_[i] * decay + (last_routed_[i] ? 1.0 : 0.0);
  if (last_exact_) {
    stats_.fp4_items += last_fp4_items_;
    stats_.routed_items += last_routed_items_;
  }
  ++stats_.steps;
}

std::vector<Fp4Tier::Key> Fp4Tier::hottest(const std::vector<bool>& eligible, size_t limit) const {
  std::vector<int64_t> picks;
  for (size_t i = 0; i < eligible.size(); ++i)
    if (eligible[i]) picks.push_back(int64_t(i));
  const auto hotter = [&](int64_t a, int64_t b) {
    return uses_[size_t(a)] != uses_[size_t(b)] ? uses_[size_t(a)] > uses_[size_t(b)] : a < b;
  };
  limit = std::min(limit, picks.size());
  std::partial_sort(picks.begin(), picks.begin() + ptrdiff_t(limit), picks.end(), hotter);
  std::vector<Key> keys;
  for (size_t i = 0; i < limit; ++i) keys.push_back({picks[i] / experts_, picks[i] % experts_});
  return keys;
}

std::vector<int64_t> Fp4Tier::victims(size_t count, const std::vector<bool>& busy,
                                      const std::vector<double>& hotter_than) const {
  std::vector<int64_t> free_slots, held;
  for (int64_t s = 0; s < slots_.count(); ++s) {
    const int64_t key = key_of_[size_t(s)];
    if (key < 0) {
      free_slots.push_back(s);
    } else if (slot_of_[size_t(key)] == s && !busy[size_t(key)]) {  // pointed at (not in flight), not busy
      held.push_back(s);
    }
  }
  const auto colder = [&](int64_t a, int64_t b) {
    const double ua = uses_[size_t(key_of_[size_t(a)])], ub = uses_[size_t(key_of_[size_t(b)])];
    return ua != ub ? ua < ub : a < b;
  };
  std::sort(held.begin(), held.end(), colder);
  std::vector<int64_t> chosen;
  size_t next_free = 0, next_held = 0;
  while (chosen.size() < count) {
    if (next_free < free_slots.size()) {
      chosen.push_back(free_slots[next_free++]);
      continue;
    }
    if (next_held == held.size()) break;
    const int64_t s = held[next_held];
    const double victim_uses = uses_[size_t(key_of_[size_t(s)])];
    if (!hotter_than.empty() && hotter_than[chosen.size()] < Fp4TierOptions::kSwapMargin * victim_uses) break;
    chosen.push_back(s);
    ++next_held;
  }
  return chosen;
}

void Fp4Tier::evict(std::span<const int64_t> slots, int64_t& counter) {
  std::map<int64_t, std::vector<int64_t>> by_layer;
  for (int64_t s : slots) {
    const int64_t key = key_of_[size_t(s)];
    if (key < 0) continue;
    by_layer[key / experts_].push_back(key % experts_);
    slot_of_[size_t(key)] = -1;
    key_of_[size_t(s)] = -1;
    ++counter;
  }
  for (auto& [layer, experts] : by_layer)
    pool_.update_tier(layer, experts, std::vector<ExpertWeights>(experts.size()));
}

void Fp4Tier::point(std::span<const Key> keys, std::span<const int64_t> slots) {
  std::map<int64_t, std::pair<std::vector<int64_t>, std::vector<ExpertWeights>>> by_layer;
  for (size_t i = 0; i < keys.size(); ++i) {
    const int64_t key = index(keys[i].layer, keys[i].expert);
    slot_of_[size_t(key)] = slots[i];
    key_of_[size_t(slots[i])] = key;
    auto& [experts, weights] = by_layer[keys[i].layer];
    experts.push_back(keys[i].expert);
    weights.push_back(slots_.weights[size_t(slots[i])]);
  }
  for (auto& [layer, update] : by_layer) pool_.update_tier(layer, update.first, update.second);
}

void Fp4Tier::finish_pending(bool wait) {
  if (!pending_) return;
  if (wait) backend_.expert_slots_wait(pending_->fence);
  point(pending_->keys, pending_->slots);
  pending_.reset();
}

void Fp4Tier::manage() {
  if (pending_) {
    if (!backend_.expert_slots_ready(pending_->fence)) return;  // still copying: nothing new this step
    finish_pending(false);
  }
  const size_t limit = std::min(size_t(config_.tier.promote_per_step), store_->max_batch());
  if (limit == 0) return;
  std::vector<bool> eligible(uses_.size(), false);
  for (size_t i = 0; i < uses_.size(); ++i) eligible[i] = slot_of_[i] < 0 && uses_[i] > 0.0;
  std::vector<Key> keys = hottest(eligible, limit);
  std::vector<double> heat;
  for (const Key& k : keys) heat.push_back(uses_[size_t(index(k.layer, k.expert))]);
  const std::vector<int64_t> chosen = victims(keys.size(), last_routed_, heat);
  keys.resize(chosen.size());
  if (keys.empty()) return;
  evict(chosen, stats_.evictions);
  std::vector<ExpertKey> store_keys;
  for (size_t i = 0; i < keys.size(); ++i) {
    store_keys.push_back({keys[i].layer, keys[i].expert});
    key_of_[size_t(chosen[i])] = index(keys[i].layer, keys[i].expert);  // reserved while the copy runs
  }
  const std::vector<const uint8_t*> rows = store_->fetch(store_keys);
  ExpertLoadFence fence = backend_.expert_slots_load_async(slots_, chosen, rows);
  stats_.promotions += int64_t(keys.size());
  stats_.copied_bytes += keys.size() * row_.bytes;
  pending_ = Pending{std::move(keys), chosen, std::move(fence)};
  if (backend_.expert_slots_ready(pending_->fence)) finish_pending(false);
}

int64_t Fp4Tier::force_promote(int64_t budget) {
  finish_pending(true);
  std::vector<bool> eligible(uses_.size(), false);
  for (size_t i = 0; i < uses_.size(); ++i) eligible[i] = last_routed_[i] && slot_of_[i] < 0;
  std::vector<Key> keys = hottest(eligible, size_t(std::max<int64_t>(0, budget)));
  const std::vector<int64_t> chosen = victims(keys.size(), last_routed_, {});
  keys.resize(chosen.size());
  if (keys.empty()) return 0;
  evict(chosen, stats_.forced_evictions);
  const size_t batch = std::max<size_t>(1, std::min(store_->max_batch(), keys.size()));
  for (size_t first = 0; first < keys.size(); first += batch) {
    const size_t n = std::min(batch, keys.size() - first);
    std::vector<ExpertKey> store_keys;
    for (size_t i = first; i < first + n; ++i) store_keys.push_back({keys[i].layer, keys[i].expert});
    const std::vector<const uint8_t*> rows = store_->fetch(store_keys);
    backend_.expert_slots_load(slots_, std::span<const int64_t>(chosen).subspan(first, n), rows);
  }
  point(keys, chosen);
  stats_.forced_promotions += int64_t(keys.size());
  stats_.copied_bytes += keys.size() * row_.bytes;
  return int64_t(keys.size());
}

void Fp4Tier::count_judged(bool gated) {
  ++stats_.judged_steps;
  if (gated) ++stats_.gated_steps;
}

Fp4TierStats Fp4Tier::stats() const {
  Fp4TierStats s = stats_;
  s.held = int64_t(std::count_if(slot_of_.begin(), slot_of_.end(), [](int64_t slot) { return slot >= 0; }));
  s.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  return s;
}

void Fp4Tier::log_kpis() {
  const Fp4TierStats now = stats();
  Fp4Kpis k = fp4_kpis(now, logged_);
  k.tau = gate_.tau();
  MOET_LOG_INFO("{}", fp4_kpi_line(k));
  logged_ = now;
}

}  // namespace moet
