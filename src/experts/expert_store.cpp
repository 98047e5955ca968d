// The expert stores (see expert_store.h).
#include "experts/expert_store.h"

#include "core/error.h"
#include "core/log.h"
#include "core/progress.h"
#include "core/thread_pool.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstring>
#include <fstream>
#include <unordered_map>

namespace moet {
namespace {

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

// Every row in pinned memory, one allocation per layer.
class RamStore final : public ExpertStore {
 public:
  RamStore(Backend& backend, std::span<const int64_t> layers, int64_t experts, uint64_t row_bytes,
           const ExpertRowFn& fill)
      : experts_(experts), row_bytes_(row_bytes) {
    Progress progress("expert rows into pinned RAM", uint64_t(layers.size()) * uint64_t(experts) * row_bytes, true);
    for (int64_t layer : layers) {
      if (layer >= int64_t(rows_.size())) rows_.resize(size_t(layer + 1));
      rows_[size_t(layer)] = backend.alloc_pinned(size_t(row_bytes * uint64_t(experts)));
      for (int64_t e = 0; e < experts; ++e) {
        fill(layer, e, rows_[size_t(layer)].get() + uint64_t(e) * row_bytes);
        progress.advance(row_bytes);
      }
    }
    progress.finish();
  }
  ExpertStoreKind kind() const override { return ExpertStoreKind::ram; }
  uint64_t row_bytes() const override { return row_bytes_; }
  size_t max_batch() const override { return SIZE_MAX; }

 protected:
  std::vector<const uint8_t*> fetch_rows(std::span<const ExpertKey> keys, bool) override {
    std::vector<const uint8_t*> out;
    for (const ExpertKey& k : keys) {
      MOET_CHECK(k.layer >= 0 && size_t(k.layer) < rows_.size() && rows_[size_t(k.layer)] && k.expert >= 0 &&
                     k.expert < experts_,
                 "expert store: no row for layer {} expert {}", k.layer, k.expert);
      out.push_back(rows_[size_t(k.layer)].get() + uint64_t(k.expert) * row_bytes_);
    }
    return out;
  }

 private:
  int64_t experts_;
  uint64_t row_bytes_;
  std::vector<std::shared_ptr<uint8_t>> rows_;  // [layer]: [experts] rows (null: not a MoE layer)
};

// Exclusive tiering's RAM store: only the rows the backend does not hold, plus `spare` rows for
// the victims of one batch (its max_batch()), in pinned chunks of `experts` rows; a row index per
// key (-1: in the backend) and a free list.
constexpr size_t kExclusiveSpareRows = 64;

class ExclusiveRamStore final : public ExpertStore {
 public:
  ExclusiveRamStore(Backend& backend, std::span<const int64_t> layers, int64_t experts, uint64_t row_bytes,
                    const ExpertRowFn& fill, const std::function<bool(const ExpertKey&)>& held_elsewhere, size_t spare)
      : experts_(experts), row_bytes_(row_bytes), spare_(spare) {
    std::vector<ExpertKey> held;
    for (int64_t layer : layers) {
      if (layer >= int64_t(position_.size())) position_.resize(size_t(layer + 1), -1);
      position_[size_t(layer)] = int64_t(row_of_.size() / size_t(experts));
      row_of_.resize(row_of_.size() + size_t(experts), -1);
      for (int64_t e = 0; e < experts; ++e)
        if (!held_elsewhere || !held_elsewhere({layer, e})) held.push_back({layer, e});
    }
    const int64_t capacity = int64_t(held.size() + spare);
    for (int64_t first = 0; first < capacity; first += experts)
      chunks_.push_back(backend.alloc_pinned(size_t(row_bytes * uint64_t(std::min(experts, capacity - first)))));
    for (int64_t r = capacity; r-- > 0;) free_.push_back(r);
    Progress progress("expert rows into pinned RAM (exclusive)", uint64_t(held.size()) * row_bytes, true);
    for (const ExpertKey& k : held) {
      fill(k.layer, k.expert, take(k));
      progress.advance(row_bytes);
    }
    progress.finish();
  }
  ExpertStoreKind kind() const override { return ExpertStoreKind::ram; }
  uint64_t row_bytes() const override { return row_bytes_; }
  size_t max_batch() const override { return spare_; }
  bool exclusive() const override { return true; }
  std::vector<uint8_t*> admit(std::span<const ExpertKey> keys, std::span<const ExpertKey>) override {
    std::vector<uint8_t*> out;
    for (const ExpertKey& k : keys) out.push_back(take(k));
    return out;
  }
  void release(std::span<const ExpertKey> keys) override {
    for (const ExpertKey& k : keys) {
      int64_t& row = row_of_[size_t(index(k))];
      MOET_CHECK(row >= 0, "expert store: layer {} expert {} is not on the host", k.layer, k.expert);
      free_.push_back(row);
      row = -1;
    }
  }

 protected:
  std::vector<const uint8_t*> fetch_rows(std::span<const ExpertKey> keys, bool) override {
    std::vector<const uint8_t*> out;
    for (const ExpertKey& k : keys) {
      const int64_t row = row_of_[size_t(index(k))];
      MOET_CHECK(row >= 0, "expert store: layer {} expert {} is not on the host (exclusive tiering: it is in the "
                           "backend)", k.layer, k.expert);
      out.push_back(address(row));
    }
    return out;
  }

 private:
  int64_t index(const ExpertKey& k) const {
    MOET_CHECK(k.layer >= 0 && size_t(k.layer) < position_.size() && position_[size_t(k.layer)] >= 0 &&
                   k.expert >= 0 && k.expert < experts_,
               "expert store: no row for layer {} expert {}", k.layer, k.expert);
    return position_[size_t(k.layer)] * experts_ + k.expert;
  }
  uint8_t* address(int64_t row) const {
    return chunks_[size_t(row / experts_)].get() + uint64_t(row % experts_) * row_bytes_;
  }
  // A free row for k (which must not have one).
  uint8_t* take(const ExpertKey& k) {
    int64_t& row = row_of_[size_t(index(k))];
    MOET_CHECK(row < 0, "expert store: layer {} expert {} is on the host already", k.layer, k.expert);
    MOET_CHECK(!free_.empty(), "expert store: no free row (more than {} rows left the backend at once)", spare_);
    row = free_.back();
    free_.pop_back();
    return address(row);
  }

  int64_t experts_;
  uint64_t row_bytes_;
  size_t spare_;
  std::vector<int64_t> position_;  // [layer]: its index among the store's layers, or -1
  std::vector<int64_t> row_of_;    // [position * experts + expert]: row or -1
  std::vector<int64_t> free_;
  std::vector<std::shared_ptr<uint8_t>> chunks_;
};

// Rows read from the pack into a pinned staging area of max_batch strides.
class PackStore final : public ExpertStore {
 public:
  PackStore(Backend& backend, std::unique_ptr<PackReader> reader, size_t max_batch)
      : reader_(std::move(reader)), max_batch_(max_batch),
        staging_(backend.alloc_pinned(size_t(reader_->stride() * max_batch))) {}
  ExpertStoreKind kind() const override { return ExpertStoreKind::pack; }
  uint64_t row_bytes() const override { return reader_->spec().layout().slot_bytes; }
  size_t max_batch() const override { return max_batch_; }

 protected:
  std::vector<const uint8_t*> fetch_rows(std::span<const ExpertKey> keys, bool) override {
    MOET_CHECK(keys.size() <= max_batch_, "pack store: {} rows in one fetch (at most {})", keys.size(), max_batch_);
    std::vector<PackRead> reads;
    std::vector<const uint8_t*> out;
    for (size_t i = 0; i < keys.size(); ++i) {
      uint8_t* dst = staging_.get() + i * reader_->stride();
      reads.push_back({keys[i].layer, keys[i].expert, dst});
      out.push_back(dst);
    }
    reader_->read(reads);
    return out;
  }

 private:
  std::unique_ptr<PackReader> reader_;
  size_t max_batch_;
  std::shared_ptr<uint8_t> staging_;
};

// Pinned memory for an arena, from the backend.
class PinnedArenaMemory final : public ArenaMemory {
 public:
  explicit PinnedArenaMemory(Backend& backend) : backend_(backend) {}
  uint8_t* allocate(size_t bytes) override {
    held_ = backend_.alloc_pinned(bytes);
    return held_.get();
  }
  void release(uint8_t*, size_t) override { held_.reset(); }

 private:
  Backend& backend_;
  std::shared_ptr<uint8_t> held_;
};

// The pack behind an LRU arena; the hot set persists in <pack>.heat.json.
class ArenaStore final : public ExpertStore {
 public:
  ArenaStore(Backend& backend, std::unique_ptr<PackReader> reader, const ExpertStoreOptions& options)
      : reader_(std::move(reader)), memory_(backend), max_batch_(options.max_batch),
        heat_path_(options.pack.pack.string() + ".heat.json"), exclusive_(options.exclusive),
        held_elsewhere_(options.held_elsewhere) {
    const uint64_t pack_bytes = reader_->spec().file_bytes();
    const uint64_t bytes = options.arena_bytes > 0 ? options.arena_bytes : pack_bytes / 4;
    const size_t slots = size_t(std::max<uint64_t>(1, std::min(bytes, pack_bytes) / reader_->stride()));
    arena_ = std::make_unique<PackArena>(*reader_, slots, memory_, max_batch_);
    MOET_LOG_INFO("expert arena: {} slots ({:.1f} GiB pinned) over {} ({:.1f} GiB)", slots,
                  double(slots * reader_->stride()) / double(1ull << 30), options.pack.pack.string(),
                  double(pack_bytes) / double(1ull << 30));
    if (options.preheat) preheat();
  }
  ~ArenaStore() override {
    try {
      save_heat();
    } catch (const std::exception& e) {
      MOET_LOG_WARN("expert arena: could not save the hot set to {}: {}", heat_path_, e.what());
    }
  }
  ExpertStoreKind kind() const override { return ExpertStoreKind::arena; }
  uint64_t row_bytes() const override { return reader_->spec().layout().slot_bytes; }
  size_t max_batch() const override { return std::min(max_batch_, arena_->slots() / (exclusive_ ? 2 : 1)); }
  bool exclusive() const override { return exclusive_; }
  std::vector<uint8_t*> admit(std::span<const ExpertKey> keys, std::span<const ExpertKey> loading) override {
    std::vector<uint8_t*> out;
    for (const ExpertKey& k : keys) out.push_back(arena_->admit(k, loading));
    return out;
  }
  void release(std::span<const ExpertKey> keys) override {
    for (const ExpertKey& k : keys) arena_->drop(k);
  }

 protected:
  std::vector<const uint8_t*> fetch_rows(std::span<const ExpertKey> keys, bool scan) override {
    std::vector<const uint8_t*> out = arena_->fetch(keys, !scan);
    counters_.arena_hits = arena_->hits();
    counters_.arena_misses = arena_->misses();
    return out;
  }

 private:
  // The hot set of the last run, least recent first so that the most recent ends up first.
  void preheat() {
    std::ifstream in(heat_path_);
    if (!in.good()) return;
    std::vector<ExpertKey> keys;
    try {
      const nlohmann::json heat = nlohmann::json::parse(in);
      if (heat.value("identity", "") != reader_->spec().identity) {
        MOET_LOG_INFO("expert arena: {} is for another pack; not preheating", heat_path_);
        return;
      }
      for (const auto& k : heat.at("rows")) keys.push_back({k.at(0).get<int64_t>(), k.at(1).get<int64_t>()});
    } catch (const nlohmann::json::exception& e) {
      MOET_LOG_WARN("expert arena: {} is unreadable ({}); not preheating", heat_path_, e.what());
      return;
    }
    keys.resize(std::min(keys.size(), arena_->slots()));
    std::erase_if(keys, [&](const ExpertKey& k) {
      return (exclusive_ && held_elsewhere_ && held_elsewhere_(k)) ||
             std::find(reader_->spec().layers.begin(), reader_->spec().layers.end(), k.layer) ==
                 reader_->spec().layers.end() ||
             k.expert < 0 || k.expert >= reader_->spec().n_experts;
    });
    std::reverse(keys.begin(), keys.end());
    const auto start = std::chrono::steady_clock::now();
    for (size_t first = 0; first < keys.size(); first += max_batch()) {
      const size_t n = std::min(max_batch(), keys.size() - first);
      arena_->fetch(std::span<const ExpertKey>(keys).subspan(first, n));
    }
    MOET_LOG_INFO("expert arena: preheated {} rows from {} in {:.1f} s", keys.size(), heat_path_, seconds_since(start));
  }

  void save_heat() const {
    nlohmann::json rows = nlohmann::json::array();
    for (const ExpertKey& k : arena_->recent()) rows.push_back({k.layer, k.expert});
    const std::string tmp = heat_path_ + ".tmp";
    {
      std::ofstream out(tmp, std::ios::trunc);
      out << nlohmann::json{{"identity", reader_->spec().identity}, {"rows", rows}}.dump() << "\n";
      MOET_CHECK(out.good(), "{}: write failed", tmp);
    }
    std::filesystem::rename(tmp, heat_path_);
  }

  std::unique_ptr<PackReader> reader_;
  PinnedArenaMemory memory_;
  std::unique_ptr<PackArena> arena_;
  size_t max_batch_;
  std::string heat_path_;
  bool exclusive_;
  std::function<bool(const ExpertKey&)> held_elsewhere_;
};

}  // namespace

ExpertStoreKind expert_store_parse(const std::string& name) {
  if (name == "ram") return ExpertStoreKind::ram;
  if (name == "pack") return ExpertStoreKind::pack;
  if (name == "arena") return ExpertStoreKind::arena;
  fail("unknown expert store '{}' (expected ram, pack or arena)", name);
}

const char* expert_store_name(ExpertStoreKind kind) {
  switch (kind) {
    case ExpertStoreKind::ram: return "ram";
    case ExpertStoreKind::pack: return "pack";
    case ExpertStoreKind::arena: return "arena";
  }
  return "?";
}

std::vector<uint8_t*> ExpertStore::admit(std::span<const ExpertKey>, std::span<const ExpertKey>) {
  fail("the {} store is not exclusive", expert_store_name(kind()));
}

void ExpertStore::release(std::span<const ExpertKey>) {
  fail("the {} store is not exclusive", expert_store_name(kind()));
}

std::vector<const uint8_t*> ExpertStore::fetch(std::span<const ExpertKey> keys, bool scan) {
  const auto start = std::chrono::steady_clock::now();
  std::vector<const uint8_t*> rows = fetch_rows(keys, scan);
  counters_.fetches += 1;
  counters_.rows += keys.size();
  counters_.bytes += keys.size() * row_bytes();
  if (counters_.fetch_seconds.size() == kFetchTimes) counters_.fetch_seconds.erase(counters_.fetch_seconds.begin());
  counters_.fetch_seconds.push_back(seconds_since(start));
  return rows;
}

std::unique_ptr<ExpertStore> expert_store_create(const ExpertStoreOptions& options, Backend& backend,
                                                 std::span<const int64_t> layers, int64_t experts, uint64_t row_bytes,
                                                 const ExpertRowFn& fill) {
  MOET_CHECK(!options.exclusive || options.kind != ExpertStoreKind::pack,
             "--expert-tiering exclusive with --expert-store pack: the pack store keeps no row in RAM, so there is "
             "nothing to make exclusive (use ram or arena)");
  if (options.kind == ExpertStoreKind::ram && options.exclusive)
    return std::make_unique<ExclusiveRamStore>(backend, layers, experts, row_bytes, fill, options.held_elsewhere,
                                               std::min(options.max_batch, kExclusiveSpareRows));
  if (options.kind == ExpertStoreKind::ram) return std::make_unique<RamStore>(backend, layers, experts, row_bytes, fill);
  const PackIo io = options.direct_io ? PackIo::direct : PackIo::pread;
  std::unique_ptr<PackReader> reader = PackReader::open(options.pack, options.spec, io, options.threads);
  if (options.kind == ExpertStoreKind::pack)
    return std::make_unique<PackStore>(backend, std::move(reader), options.max_batch);
  return std::make_unique<ArenaStore>(backend, std::move(reader), options);
}

}  // namespace moet
