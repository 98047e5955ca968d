// ExpertResidency implementation (see residency.h).
#include "experts/residency.h"

#include "core/error.h"
#include "core/log.h"
#include "experts/expert_kpis.h"
#include "experts/expert_pool.h"
#include "experts/expert_tracker.h"
#include "experts/host_experts.h"
#include "core/progress.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>
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

ExpertTiering expert_tiering_parse(const std::string& name) {
  if (name == "inclusive") return ExpertTiering::inclusive;
  if (name == "exclusive") return ExpertTiering::exclusive;
  fail("unknown expert tiering '{}' (expected inclusive or exclusive)", name);
}

CpuExperts cpu_experts_parse(const std::string& name) {
  if (name == "off") return CpuExperts::off;
  if (name == "on") return CpuExperts::on;
  if (name == "auto") return CpuExperts::automatic;
  fail("unknown --cpu-experts '{}' (expected off, on or auto)", name);
}

const char* cpu_experts_name(CpuExperts mode) {
  switch (mode) {
    case CpuExperts::off: return "off";
    case CpuExperts::on: return "on";
    case CpuExperts::automatic: return "auto";
  }
  return "?";
}

ExpertPrefetch expert_prefetch_parse(const std::string& name) {
  if (name == "off") return ExpertPrefetch::off;
  if (name == "next-layer") return ExpertPrefetch::next_layer;
  fail("unknown --expert-prefetch '{}' (expected off or next-layer)", name);
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
  MOET_CHECK(!options.host_only || options.cpu_experts == CpuExperts::on,
             "an expert cache without slots computes every expert on the host: --cpu-experts on");
  MOET_CHECK(options.tiering == ExpertTiering::inclusive || store_->exclusive(),
             "--expert-tiering exclusive needs an exclusive host store");
  stats_.total = int64_t(moe_layers_.size()) * experts_;
  slot_of_.assign(size_t(layers_ * experts_), -1);
  step_used_.assign(size_t(layers_ * experts_), false);
  heat_.assign(size_t(layers_ * experts_), 0.0);
  heat_tick_.assign(size_t(layers_ * experts_), 0);
  predicted_.assign(size_t(layers_), {});
  stats_.costs.replay_seconds = std::numeric_limits<double>::infinity();
}

int64_t ExpertResidency::planned_slots() const {
  if (options_.host_only) return 0;
  int64_t count = options_.slots;
  if (count <= 0 && options_.cache_bytes > 0) count = int64_t(options_.cache_bytes / row_.bytes);
  return std::min(count, stats_.total);
}

void ExpertResidency::allocate() {
  if (allocated_) return;
  const int64_t total = stats_.total;
  int64_t count = planned_slots();
  if (count <= 0 && !options_.host_only) {
    const uint64_t left = backend_.memory_available();
    count = left > ResidencyOptions::kAutoReserveBytes
                ? int64_t((left - ResidencyOptions::kAutoReserveBytes) / row_.bytes) : 0;
    MOET_LOG_INFO("expert cache auto: {:.1f} GiB left in {} (after weights and KV), {:.1f} GiB kept for activations",
                  double(left) / double(1ull << 30), backend_.name(),
                  double(ResidencyOptions::kAutoReserveBytes) / double(1ull << 30));
    count = std::min(count, total);
  }
  // Every step's experts must fit the pool to be fetched; computing misses on the host needs no room.
  const int64_t minimum = std::min(experts_, std::max<int64_t>(1, options_.max_step_rows) * top_k_);
  MOET_CHECK(count >= minimum || options_.cpu_experts == CpuExperts::on,
             "the expert cache holds {} experts, fewer than a decode step of {} rows can route to in one layer ({}): "
             "give it at least {} slots ({:.2f} GiB; --expert-cache-gb / --expert-cache-slots)",
             count, options_.max_step_rows, minimum, minimum, double(minimum) * double(row_.bytes) / double(1ull << 30));
  if (count > 0) slots_ = backend_.alloc_expert_slots(pool_.layer(moe_layers_.front()).layout, row_, count);
  key_of_.assign(size_t(count), -1);
  last_use_.assign(size_t(count), 0);
  uses_.assign(size_t(count), 0.0);
  allocated_ = true;
  if (host_mode()) {
    const ExpertLayout& layout = pool_.layer(moe_layers_.front()).layout;
    host_ = std::make_unique<HostExperts>(backend_, layout, row_, options_.cpu_threads, options_.host_isa);
    if (backend_.host_experts_by_mailbox())
      host_->open_mailboxes(moe_layers_, std::max<int64_t>(1, options_.max_step_rows), top_k_, *this);
    for (int64_t l : moe_layers_)
      pool_.link_host(l, {this, l, host_->has_mailboxes() ? host_->mailbox(l) : HostMailbox{}});
    std::vector<Key> all;
    for (int64_t l : moe_layers_)
      for (int64_t e = 0; e < experts_; ++e) all.push_back({l, e});
    point_tables(all, false);  // host entries
    if (options_.tiering == ExpertTiering::inclusive) measure_costs();  // exclusive: once preloaded
  }
  MOET_LOG_INFO("expert cache: {} of {} routed experts in {} ({:.1f}% coverage, {:.2f} GiB), {} store, {} eviction, "
                "{} tiering, host experts {}{}",
                count, total, backend_.name(), 100.0 * double(count) / double(total),
                double(count) * double(row_.bytes) / double(1ull << 30), expert_store_name(store_->kind()),
                options_.policy == VictimPolicy::lru ? "lru" : "frequency",
                options_.tiering == ExpertTiering::exclusive ? "exclusive" : "inclusive",
                cpu_experts_name(options_.cpu_experts),
                host_ ? fmt::format(" ({} threads)", host_->threads()) : std::string());
}

void ExpertResidency::preload(std::span<const ExpertKey> keys, const ExpertRowFn& fill) {
  allocate();
  MOET_CHECK(int64_t(keys.size()) <= slots_.count(), "expert cache: {} experts to preload into {} slots", keys.size(),
             slots_.count());
  const size_t batch = 16;
  std::shared_ptr<uint8_t> staging = backend_.alloc_pinned(size_t(row_.bytes * batch));
  std::vector<Key> loaded;
  Progress progress("expert rows into the cache", uint64_t(keys.size()) * row_.bytes, true);
  for (size_t first = 0; first < keys.size(); first += batch) {
    const size_t n = std::min(batch, keys.size() - first);
    std::vector<const uint8_t*> rows;
    std::vector<int64_t> ids;
    for (size_t i = 0; i < n; ++i) {
      const ExpertKey& k = keys[first + i];
      fill(k.layer, k.expert, staging.get() + i * row_.bytes);
      rows.push_back(staging.get() + i * row_.bytes);
      ids.push_back(int64_t(first + i));
      slot_of_[size_t(index(k.layer, k.expert))] = int64_t(first + i);
      key_of_[first + i] = index(k.layer, k.expert);
      loaded.push_back({k.layer, k.expert});
      progress.advance(row_.bytes);
    }
    backend_.expert_slots_load(slots_, ids, rows);
  }
  progress.finish();
  point_tables(loaded, true);
  if (host_) measure_costs();
}

ExpertResidency::~ExpertResidency() = default;

bool ExpertResidency::begin_pass(int64_t rows, bool recurring, int64_t pass) {
  MOET_CHECK(allocated_, "expert residency: the slot pool was not allocated");
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
    // Host entries let a graph pass run whatever the pool holds; prefetch needs the host between layers.
    layerwise_ = !recurring || (step_set > slots_.count() && !host_mode()) || prefer_layerwise_ ||
                 (options_.prefetch == ExpertPrefetch::next_layer && predicts(rows));
    if (layerwise_) ++stats_.layerwise_steps;
    step_rows_ = rows;
    step_fetched_ = stats_.fetched_rows;
    std::fill(step_used_.begin(), step_used_.end(), false);
    step_host_.clear();
  }
  pass_ = pass;
  skips_left_ = options_.miss_tolerance;
  replay_chosen_ = false;
  pass_fetches_.clear();
  pass_start_ = std::chrono::steady_clock::now();
  if (host_) host_->begin_pass();
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
  const ExpertWeights gone = host_mode() ? ExpertWeights::on_host() : ExpertWeights{};
  for (const Key& k : keys) {
    auto& [experts, weights] = by_layer[k.layer];
    experts.push_back(k.expert);
    weights.push_back(present ? slots_.weights[size_t(slot_of_[size_t(index(k.layer, k.expert))])] : gone);
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
  load_into(missing, chosen, scan);
  return true;
}

void ExpertResidency::load_into(std::span<const Key> keys, std::span<const int64_t> into, bool scan) {
  const auto start = std::chrono::steady_clock::now();
  const bool exclusive = options_.tiering == ExpertTiering::exclusive;
  std::vector<int64_t> old_key(into.size(), -1);
  std::vector<Key> evicted;
  for (size_t i = 0; i < into.size(); ++i) {
    const int64_t old = key_of_[size_t(into[i])];
    old_key[i] = old;
    if (old < 0) continue;
    evicted.push_back({old / experts_, old % experts_});
    slot_of_[size_t(old)] = -1;
    key_of_[size_t(into[i])] = -1;
  }
  point_tables(evicted, false);
  const size_t batch = std::min(store_->max_batch(), keys.size());
  for (size_t first = 0; first < keys.size(); first += batch) {
    const size_t n = std::min(batch, keys.size() - first);
    std::vector<ExpertKey> store_keys;
    for (size_t i = first; i < first + n; ++i) store_keys.push_back({keys[i].layer, keys[i].expert});
    const std::vector<const uint8_t*> rows = store_->fetch(store_keys, scan);
    // Exclusive: occupied slots exchange their rows with the store, free ones just load.
    std::vector<int64_t> load_ids, swap_ids;
    std::vector<const uint8_t*> load_rows, swap_rows;
    std::vector<ExpertKey> leaving;
    for (size_t i = first; i < first + n; ++i) {
      const bool swap = exclusive && old_key[i] >= 0;
      (swap ? swap_ids : load_ids).push_back(into[i]);
      (swap ? swap_rows : load_rows).push_back(rows[i - first]);
      if (swap) leaving.push_back({old_key[i] / experts_, old_key[i] % experts_});
    }
    if (!load_ids.empty()) backend_.expert_slots_load(slots_, load_ids, load_rows);
    if (!swap_ids.empty()) {
      const std::vector<uint8_t*> out = store_->admit(leaving, store_keys);
      backend_.expert_slots_exchange(slots_, swap_ids, swap_rows, out);
      stats_.written_back_rows += int64_t(swap_ids.size());
      stats_.written_back_bytes += swap_ids.size() * store_->row_bytes();
    }
    if (exclusive) store_->release(store_keys);
    for (size_t i = first; i < first + n; ++i) {
      const int64_t key = index(keys[i].layer, keys[i].expert);
      slot_of_[size_t(key)] = into[i];
      key_of_[size_t(into[i])] = key;
      touch(into[i]);
    }
  }
  point_tables(keys, true);
  stats_.fetched_rows += int64_t(keys.size());
  stats_.fetched_bytes += keys.size() * store_->row_bytes();
  stats_.fetch_seconds += seconds_since(start);
}

bool ExpertResidency::after_pass(int64_t pass) {
  replayed_ = false;
  if (host_) host_->end_pass();
  const int64_t one_layer = std::min(experts_, step_rows_ * top_k_);
  if (layerwise_) {  // complete; graphs again once a step needs at most one layer's worth
    if (stats_.fetched_rows - step_fetched_ <= one_layer) prefer_layerwise_ = false;
    end_step();
    return false;
  }
  const double seconds = seconds_since(pass_start_);  // a replay's cost, for the policy
  double& replay = stats_.costs.replay_seconds;
  replay = std::isinf(replay) ? seconds : 0.8 * replay + 0.2 * seconds;
  tracker_.read();
  if (pass == 0) {
    const int64_t found = tracker_.routed_items(0) + tracker_.routed_items(2);
    stats_.resident_items += found;
    stats_.routed_items += found + tracker_.routed_items(1);
  }
  stats_.missing_pairs += tracker_.misses();  // host entries' misses are counted by serve()
  std::vector<bool> keep(size_t(layers_ * experts_), false);
  std::vector<Key> missing = pass_fetches_;
  for (const Key& k : missing) keep[size_t(index(k.layer, k.expert))] = true;
  for (int64_t l : moe_layers_) {
    for (int64_t e = 0; e < experts_; ++e) {
      if (tracker_.used(l, e) && !pool_.tier_present(l, e)) {  // a tier expert needs no slot
        keep[size_t(index(l, e))] = true;
        step_used_[size_t(index(l, e))] = true;
        if (slot_of_[size_t(index(l, e))] >= 0) touch(slot_of_[size_t(index(l, e))]);
      }
      if (tracker_.absent(l, e)) {
        keep[size_t(index(l, e))] = true;
        missing.push_back({l, e});
      }
    }
  }
  const int64_t misses = int64_t(missing.size());
  // Without host experts a pass stands within the tolerance; with them, unless auto chose fetches.
  if (host_mode() ? misses == 0 : misses <= options_.miss_tolerance) {
    stats_.accepted_misses += host_mode() ? 0 : misses;
    end_step();
    return false;
  }
  if (pass >= options_.max_replays) {
    if (!warned_max_replays_)
      MOET_LOG_WARN("expert cache: a step still missed {} experts after {} replays (--max-replays); accepting it "
                    "(said once)", misses, pass);
    warned_max_replays_ = true;
    stats_.accepted_misses += misses;
    end_step();
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
  std::vector<int64_t> rows_of(size_t(experts_), 0);  // items routed to each expert
  std::vector<bool> routed(size_t(experts_), false);
  for (int32_t e : ids)
    if (e >= 0 && e < experts_) {
      routed[size_t(e)] = true;
      ++rows_of[size_t(e)];
    }
  score_prediction(layer, routed);
  // The routed experts that need a W2 slot (the FP4 tier's resolve there).
  std::vector<Key> keys;
  for (int64_t e = 0; e < experts_; ++e)
    if (routed[size_t(e)] && !pool_.tier_present(layer, e)) keys.push_back({layer, e});
  stats_.routed_items += int64_t(ids.size());
  for (int32_t e : ids)
    if (e >= 0 && e < experts_ && (slot_of_[size_t(index(layer, e))] >= 0 || pool_.tier_present(layer, e)))
      stats_.resident_items += 1;
  // Misses: fetched (found missing, then made resident), or with host experts what decide() says.
  std::vector<bool> needs_slot(size_t(experts_), false);
  layer_actions_.assign(size_t(experts_), MissAction::host);
  std::vector<Key> slot_keys;
  for (const Key& k : keys) {
    step_used_[size_t(index(k.layer, k.expert))] = true;
    const bool resident = slot_of_[size_t(index(k.layer, k.expert))] >= 0;
    if (!resident) stats_.missing_pairs += 1;
    if (!resident && host_mode()) layer_actions_[size_t(k.expert)] = decide(rows_of[size_t(k.expert)], true, pass_);
    needs_slot[size_t(k.expert)] = resident || layer_actions_[size_t(k.expert)] == MissAction::fetch || !host_mode();
    if (needs_slot[size_t(k.expert)]) slot_keys.push_back(k);
  }
  const int64_t chunk = slots_.count();
  const bool scan = x.rows() > options_.max_step_rows;  // a prefill: do not let it evict the decode hot set
  if (slot_keys.size() > size_t(chunk))
    return run_chunked(layer, keys, needs_slot, chunk, scan, x, expert_ids, weights, out);
  std::vector<bool> keep(size_t(layers_ * experts_), false);
  for (const Key& k : slot_keys) keep[size_t(index(k.layer, k.expert))] = true;
  MOET_CHECK(ensure(slot_keys, keep, scan), "expert cache: {} experts do not fit {} slots", slot_keys.size(), chunk);
  backend_.moe_experts(x, pool_.layer(layer), expert_ids, weights, out, false);
}

void ExpertResidency::run_chunked(int64_t layer, std::span<const Key> keys, const std::vector<bool>& needs_slot,
                                  int64_t chunk, bool scan, const Tensor& x, const Tensor& expert_ids,
                                  const Tensor& weights, Tensor& out) {
  tracker_.set_inexact();  // masked experts count as absent in every chunk but their own
  const auto run_only = [&](const std::vector<bool>& present, bool accumulate) {
    pool_.mask_layer(layer, present);
    backend_.moe_experts(x, pool_.layer(layer), expert_ids, weights, out, accumulate);
    if (host_ && host_->has_mailboxes()) {  // the host serves the op when the device runs it: with this mask
      Tensor first = out;
      first.shape = {1};
      float sink = 0.0f;
      backend_.to_host(first, &sink);
    }
    pool_.restore_layer(layer);
  };
  bool first = true;
  for (size_t begin = 0; begin < keys.size();) {
    // The next chunk: keys in order until `chunk` of them need a slot (host entries ride along).
    std::vector<Key> part;
    std::vector<bool> keep(size_t(layers_ * experts_), false), present(size_t(experts_), false);
    size_t end = begin, slotted = 0;
    for (; end < keys.size() && (slotted < size_t(chunk) || !needs_slot[size_t(keys[end].expert)]); ++end) {
      const Key& k = keys[end];
      present[size_t(k.expert)] = true;
      if (!needs_slot[size_t(k.expert)]) continue;
      part.push_back(k);
      keep[size_t(index(k.layer, k.expert))] = true;
      ++slotted;
    }
    MOET_CHECK(ensure(part, keep, scan), "expert cache: {} experts do not fit {} slots", part.size(), chunk);
    run_only(present, !first);
    first = false;
    begin = end;
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
