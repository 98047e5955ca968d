// ExpertResidency's host experts and prefetch (see residency.h): the startup costs and per-miss
// decisions of --cpu-experts auto, serve() (the MoE op's host entries), the end of a step (heat,
// promotions of host-computed experts into slots) and --expert-prefetch next-layer.
#include "experts/residency.h"

#include "core/error.h"
#include "core/log.h"
#include "experts/expert_pool.h"
#include "experts/host_experts.h"

#include <algorithm>
#include <chrono>
#include <cmath>

namespace moet {
namespace {

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

// A promotion replaces a slot's expert only when the newcomer is this much hotter (equal heat
// does not churn the copies; the FP4 tier's manager uses the same margin).
constexpr double kPromotionMargin = 1.25;

}  // namespace

// What the policy weighs, measured once the pool exists (best of three): bringing one expert from
// the store into a slot (inclusive: a store read and a load into a free slot; exclusive, once the
// pool is full: an exchange with slot 0's expert, undone afterwards), and the host's time for one
// expert of 1 and 4 rows. The replay cost is measured on decode passes as they run (residency.cpp).
void ExpertResidency::measure_costs() {
  int64_t key = -1;
  for (int64_t l : moe_layers_)
    for (int64_t e = 0; e < experts_ && key < 0; ++e)
      if (slot_of_[size_t(index(l, e))] < 0) key = index(l, e);
  if (key < 0) return;  // everything is in the pool: nothing ever misses
  const ExpertKey k{key / experts_, key % experts_};
  const int64_t slot = 0;
  const bool exclusive = options_.tiering == ExpertTiering::exclusive;
  std::shared_ptr<uint8_t> saved = backend_.alloc_pinned(size_t(row_.bytes));
  double best = 1e30;
  for (int run = 0; slots_.count() > 0 && run < 3; ++run) {
    const auto start = std::chrono::steady_clock::now();
    const std::vector<const uint8_t*> rows = store_->fetch({&k, 1});
    if (exclusive) {
      uint8_t* out = saved.get();
      backend_.expert_slots_exchange(slots_, {&slot, 1}, rows, {&out, 1});
    } else {
      MOET_CHECK(key_of_[size_t(slot)] < 0, "expert costs are measured into a free slot");
      backend_.expert_slots_load(slots_, {&slot, 1}, rows);
    }
    best = std::min(best, seconds_since(start));
    if (exclusive) {  // slot 0's expert back
      const uint8_t* back = saved.get();
      backend_.expert_slots_load(slots_, {&slot, 1}, {&back, 1});
    }
  }
  if (slots_.count() > 0) stats_.costs.fetch_seconds = best;
  const HostExpertCost host = host_->measure(store_->fetch({&k, 1})[0]);
  stats_.costs.host_fixed_seconds = host.fixed_seconds;
  stats_.costs.host_row_seconds = host.row_seconds;
  MOET_LOG_INFO("expert costs: fetch {:.3f} ms an expert ({:.2f} GB/s), host {:.3f} ms + {:.3f} ms a row on {} threads",
                1e3 * stats_.costs.fetch_seconds,
                stats_.costs.fetch_seconds > 0 ? double(row_.bytes) / stats_.costs.fetch_seconds / 1e9 : 0.0,
                1e3 * host.fixed_seconds, 1e3 * host.row_seconds, host_->threads());
}

MissAction ExpertResidency::decide(int64_t rows, bool layerwise, int64_t pass) {
  if (options_.cpu_experts == CpuExperts::on) return MissAction::host;
  MissSituation miss;
  miss.rows = rows;
  miss.layerwise = layerwise;
  miss.replay_chosen = replay_chosen_;
  miss.fetch_possible = slots_.count() > 0 && (layerwise || pass < options_.max_replays);
  miss.skips_left = skips_left_;
  const MissAction action = choose_miss_action(stats_.costs, miss);
  switch (action) {
    case MissAction::fetch:
      ++stats_.chose_fetch;
      replay_chosen_ = replay_chosen_ || !layerwise;
      break;
    case MissAction::host: ++stats_.chose_host; break;
    case MissAction::skip:
      ++stats_.chose_skip;
      ++stats_.accepted_misses;
      --skips_left_;
      break;
  }
  return action;
}

void ExpertResidency::serve(int64_t layer, const float* x, const int32_t* ids, const float* /*weights*/, int64_t rows,
                            int64_t top_k, float* results, int32_t* valid) {
  std::fill(valid, valid + rows * top_k, 0);
  // Items per host entry of the layer (the entries the table has now: a chunked layer masks the others).
  const std::vector<ExpertWeights>& table = pool_.layer(layer).experts;
  std::vector<std::vector<int64_t>> items(static_cast<size_t>(experts_));
  for (int64_t i = 0; i < rows * top_k; ++i)
    if (ids[i] >= 0 && ids[i] < experts_ && table[size_t(ids[i])].host) items[size_t(ids[i])].push_back(i);
  std::vector<Key> compute;
  for (int64_t e = 0; e < experts_; ++e) {
    if (items[size_t(e)].empty()) continue;
    const MissAction action = layerwise_ ? layer_actions_[size_t(e)]
                                         : decide(int64_t(items[size_t(e)].size()), false, pass_);
    if (!layerwise_) stats_.missing_pairs += 1;  // layerwise: counted by run_layer
    if (action == MissAction::host) compute.push_back({layer, e});
    if (action == MissAction::fetch) pass_fetches_.push_back({layer, e});
  }
  const auto start = std::chrono::steady_clock::now();
  const size_t batch = std::max<size_t>(1, store_->max_batch());
  for (size_t first = 0; first < compute.size(); first += batch) {
    std::vector<ExpertKey> keys;
    for (size_t i = first; i < std::min(compute.size(), first + batch); ++i)
      keys.push_back({compute[i].layer, compute[i].expert});
    const std::vector<const uint8_t*> host_rows = store_->fetch(keys);
    for (size_t i = 0; i < keys.size(); ++i) {
      const std::vector<int64_t>& its = items[size_t(keys[i].expert)];
      host_->compute(host_rows[i], x, top_k, its, results);
      for (int64_t item : its) valid[item] = 1;
      stats_.host_items += int64_t(its.size());
      step_host_.push_back({keys[i].layer, keys[i].expert});
    }
  }
  stats_.host_pairs += int64_t(compute.size());
  stats_.host_seconds += seconds_since(start);
}

double ExpertResidency::heat(int64_t key) const {
  return heat_[size_t(key)] * std::pow(options_.decay, double(tick_ - heat_tick_[size_t(key)]));
}

// The step stands: every routed expert's heat grows by one (all decayed by options_.decay a
// step), and with host experts up to promote_per_step of the experts this step computed on the
// host move into slots, hottest first: a free slot, or the coldest slot this step did not use
// when the newcomer is kPromotionMargin times hotter.
void ExpertResidency::end_step() {
  for (int64_t key = 0; key < int64_t(step_used_.size()); ++key) {
    if (!step_used_[size_t(key)]) continue;
    heat_[size_t(key)] = heat(key) + 1.0;
    heat_tick_[size_t(key)] = tick_;
  }
  if (!host_mode() || options_.promote_per_step <= 0 || slots_.count() == 0 || step_host_.empty()) return;
  std::vector<int64_t> candidates;
  for (const Key& k : step_host_) {
    const int64_t key = index(k.layer, k.expert);
    if (slot_of_[size_t(key)] < 0 && !pool_.tier_present(k.layer, k.expert)) candidates.push_back(key);
  }
  std::sort(candidates.begin(), candidates.end());
  candidates.erase(std::unique(candidates.begin(), candidates.end()), candidates.end());
  std::stable_sort(candidates.begin(), candidates.end(), [&](int64_t a, int64_t b) { return heat(a) > heat(b); });
  // Slots this step did not use, coldest first (free ones coldest of all).
  std::vector<int64_t> open;
  for (int64_t s = 0; s < slots_.count(); ++s)
    if (key_of_[size_t(s)] < 0 || !step_used_[size_t(key_of_[size_t(s)])]) open.push_back(s);
  const auto slot_heat = [&](int64_t s) { return key_of_[size_t(s)] < 0 ? -1.0 : heat(key_of_[size_t(s)]); };
  std::stable_sort(open.begin(), open.end(), [&](int64_t a, int64_t b) { return slot_heat(a) < slot_heat(b); });
  std::vector<Key> promoted;
  std::vector<int64_t> into;
  for (size_t i = 0; i < candidates.size() && i < open.size() && int64_t(i) < options_.promote_per_step; ++i) {
    const double victim = slot_heat(open[i]);
    if (victim >= 0.0 && heat(candidates[i]) < kPromotionMargin * victim) break;
    promoted.push_back({candidates[i] / experts_, candidates[i] % experts_});
    into.push_back(open[i]);
  }
  if (promoted.empty()) return;
  load_into(promoted, into, false);
  stats_.promoted_rows += int64_t(promoted.size());
}

bool ExpertResidency::predicts(int64_t rows) const {
  return options_.prefetch == ExpertPrefetch::next_layer && slots_.count() > 0 && rows <= options_.max_step_rows;
}

// The experts `predicted_ids` names for `layer` become resident before it runs, as many as there
// are slots holding neither one of them nor an expert loaded during this step (least recent first).
void ExpertResidency::prefetch(int64_t layer, std::span<const int32_t> predicted_ids) {
  std::vector<bool>& predicted = predicted_[size_t(layer)];
  predicted.assign(size_t(experts_), false);
  std::vector<bool> keep(size_t(layers_ * experts_), false);
  std::vector<Key> wanted;
  for (int32_t e : predicted_ids) {
    if (e < 0 || e >= experts_ || predicted[size_t(e)]) continue;
    predicted[size_t(e)] = true;
    keep[size_t(index(layer, e))] = true;
    if (slot_of_[size_t(index(layer, e))] < 0 && !pool_.tier_present(layer, e)) wanted.push_back({layer, e});
  }
  size_t open = 0;
  for (int64_t s = 0; s < slots_.count(); ++s) {
    const int64_t key = key_of_[size_t(s)];
    if (key >= 0 && last_use_[size_t(s)] == tick_) keep[size_t(key)] = true;
    open += key < 0 || !keep[size_t(key)];
  }
  wanted.resize(std::min(wanted.size(), open));
  if (wanted.empty()) return;
  load_into(wanted, victims(wanted.size(), keep), false);
  stats_.prefetched_rows += int64_t(wanted.size());
}

// When `layer` runs: how many of its routed experts the prediction named.
void ExpertResidency::score_prediction(int64_t layer, const std::vector<bool>& routed) {
  std::vector<bool>& predicted = predicted_[size_t(layer)];
  if (predicted.empty()) return;
  for (int64_t e = 0; e < experts_; ++e) {
    if (!routed[size_t(e)]) continue;
    ++stats_.predicted_routed;
    stats_.predicted_hits += predicted[size_t(e)];
  }
  predicted.clear();
}

}  // namespace moet
