// LRU arena over pack rows (see pack_arena.h).
#include "io/pack_arena.h"

#include "core/error.h"

#include <cstdlib>
#include <unordered_set>

namespace moet {
namespace {

class AlignedMemory final : public ArenaMemory {
 public:
  uint8_t* allocate(size_t bytes) override {
    void* p = std::aligned_alloc(kPackAlign, (bytes + kPackAlign - 1) / kPackAlign * kPackAlign);
    MOET_CHECK(p != nullptr, "arena: cannot allocate {} bytes", bytes);
    return static_cast<uint8_t*>(p);
  }
  void release(uint8_t* data, size_t) override { std::free(data); }
};

}  // namespace

ArenaMemory& arena_memory_aligned() {
  static AlignedMemory memory;
  return memory;
}

PackArena::PackArena(PackReader& reader, size_t slots, ArenaMemory& memory)
    : reader_(reader), memory_(memory), slots_(slots), slot_key_(slots, UINT64_MAX) {
  MOET_CHECK(slots > 0, "arena: needs at least one slot");
  data_ = memory_.allocate(slots * reader.stride());
  for (size_t i = 0; i < slots; ++i) lru_.push_back(i);
  for (auto it = lru_.begin(); it != lru_.end(); ++it) position_.push_back(it);
}

PackArena::~PackArena() { memory_.release(data_, slots_ * reader_.stride()); }

const uint8_t* PackArena::lookup(ExpertKey key) const {
  const auto it = slot_of_.find(key_id(key));
  return it == slot_of_.end() ? nullptr : data_ + it->second * reader_.stride();
}

std::vector<const uint8_t*> PackArena::fetch(std::span<const ExpertKey> keys) {
  std::unordered_set<uint64_t> batch;
  for (const ExpertKey& k : keys) batch.insert(key_id(k));
  MOET_CHECK(batch.size() <= slots_, "arena: a batch of {} rows does not fit {} slots", batch.size(), slots_);
  std::vector<const uint8_t*> out(keys.size(), nullptr);
  std::vector<PackRead> reads;
  std::unordered_map<uint64_t, size_t> placed;  // misses already given a slot in this batch
  // Victims come from the LRU tail, skipping slots that hold a key of this batch.
  auto victim = lru_.end();
  for (size_t i = 0; i < keys.size(); ++i) {
    const uint64_t id = key_id(keys[i]);
    auto it = slot_of_.find(id);
    size_t slot;
    if (it != slot_of_.end()) {
      slot = it->second;
      if (!placed.count(id)) ++hits_;
    } else {
      do {
        --victim;
      } while (batch.count(slot_key_[*victim]));
      slot = *victim;
      if (slot_key_[slot] != UINT64_MAX) slot_of_.erase(slot_key_[slot]);
      slot_key_[slot] = id;
      slot_of_[id] = slot;
      placed[id] = slot;
      ++misses_;
      reads.push_back({keys[i].layer, keys[i].expert, data_ + slot * reader_.stride()});
    }
    out[i] = data_ + slot * reader_.stride();
  }
  // Most recent first: move the batch's slots to the front (in reverse so keys[0] ends first).
  for (size_t i = keys.size(); i-- > 0;) {
    const size_t slot = slot_of_.at(key_id(keys[i]));
    lru_.splice(lru_.begin(), lru_, position_[slot]);
  }
  try {
    if (!reads.empty()) reader_.read(reads);
  } catch (...) {
    for (const auto& [id, slot] : placed) {
      slot_of_.erase(id);
      slot_key_[slot] = UINT64_MAX;
    }
    throw;
  }
  return out;
}

}  // namespace moet
