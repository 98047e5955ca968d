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

PackArena::PackArena(PackReader& reader, size_t slots, ArenaMemory& memory, size_t bypass)
    : reader_(reader), memory_(memory), slots_(slots), bypass_(bypass), slot_key_(slots, UINT64_MAX) {
  MOET_CHECK(slots > 0, "arena: needs at least one slot");
  data_ = memory_.allocate((slots + bypass) * reader.stride());
  for (size_t i = 0; i < slots; ++i) lru_.push_back(i);
  for (auto it = lru_.begin(); it != lru_.end(); ++it) position_.push_back(it);
}

PackArena::~PackArena() { memory_.release(data_, (slots_ + bypass_) * reader_.stride()); }

std::vector<ExpertKey> PackArena::recent() const {
  std::vector<ExpertKey> keys;
  for (size_t slot : lru_)
    if (slot_key_[slot] != UINT64_MAX) keys.push_back({int64_t(slot_key_[slot] >> 32), int64_t(slot_key_[slot] & 0xffffffffu)});
  return keys;
}

const uint8_t* PackArena::lookup(ExpertKey key) const {
  const auto it = slot_of_.find(key_id(key));
  return it == slot_of_.end() ? nullptr : data_ + it->second * reader_.stride();
}

void PackArena::drop(ExpertKey key) {
  const auto it = slot_of_.find(key_id(key));
  if (it == slot_of_.end()) return;
  const size_t slot = it->second;
  slot_key_[slot] = UINT64_MAX;
  slot_of_.erase(it);
  lru_.splice(lru_.end(), lru_, position_[slot]);
}

uint8_t* PackArena::admit(ExpertKey key, std::span<const ExpertKey> protect) {
  const uint64_t id = key_id(key);
  size_t slot;
  if (const auto it = slot_of_.find(id); it != slot_of_.end()) {
    slot = it->second;
  } else {
    std::unordered_set<uint64_t> kept;
    for (const ExpertKey& k : protect) kept.insert(key_id(k));
    auto victim = lru_.end();
    do {
      MOET_CHECK(victim != lru_.begin(), "arena: no slot to admit a row into ({} slots, all protected)", slots_);
      --victim;
    } while (slot_key_[*victim] != UINT64_MAX && kept.count(slot_key_[*victim]));
    slot = *victim;
    if (slot_key_[slot] != UINT64_MAX) slot_of_.erase(slot_key_[slot]);
    slot_key_[slot] = id;
    slot_of_[id] = slot;
  }
  lru_.splice(lru_.begin(), lru_, position_[slot]);
  return data_ + slot * reader_.stride();
}

std::vector<const uint8_t*> PackArena::fetch(std::span<const ExpertKey> keys, bool evict) {
  std::unordered_set<uint64_t> batch;
  for (const ExpertKey& k : keys) batch.insert(key_id(k));
  MOET_CHECK(batch.size() <= slots_ + (evict ? 0 : bypass_), "arena: a batch of {} rows does not fit {} slots",
             batch.size(), slots_ + (evict ? 0 : bypass_));
  std::vector<const uint8_t*> out(keys.size(), nullptr);
  std::vector<PackRead> reads;
  std::unordered_map<uint64_t, size_t> placed;  // misses already given a slot in this batch
  // Victims come from the LRU tail, skipping slots that hold a key of this batch; without
  // eviction, only free slots are taken and the other misses go to the bypass slots.
  auto victim = lru_.end();
  std::vector<size_t> free_slots;
  if (!evict)
    for (auto it = lru_.rbegin(); it != lru_.rend(); ++it)
      if (slot_key_[*it] == UINT64_MAX) free_slots.push_back(*it);
  size_t next_free = 0, bypassed = 0;
  std::unordered_map<uint64_t, size_t> bypass_of;
  for (size_t i = 0; i < keys.size(); ++i) {
    const uint64_t id = key_id(keys[i]);
    auto it = slot_of_.find(id);
    size_t slot;
    if (it != slot_of_.end()) {
      slot = it->second;
      if (!placed.count(id)) ++hits_;
    } else if (const auto b = bypass_of.find(id); b != bypass_of.end()) {
      slot = b->second;
    } else if (!evict && next_free == free_slots.size()) {  // no free slot left: read around the cache
      MOET_CHECK(bypassed < bypass_, "arena: a scan of more than {} uncached rows does not fit its bypass slots",
                 bypass_);
      slot = slots_ + bypassed++;
      bypass_of[id] = slot;
      ++misses_;
      reads.push_back({keys[i].layer, keys[i].expert, data_ + slot * reader_.stride()});
    } else {
      if (evict) {
        do {
          --victim;
        } while (batch.count(slot_key_[*victim]));
        slot = *victim;
      } else {
        slot = free_slots[next_free++];
      }
      if (slot_key_[slot] != UINT64_MAX) slot_of_.erase(slot_key_[slot]);
      slot_key_[slot] = id;
      slot_of_[id] = slot;
      placed[id] = slot;
      ++misses_;
      reads.push_back({keys[i].layer, keys[i].expert, data_ + slot * reader_.stride()});
    }
    out[i] = data_ + slot * reader_.stride();
  }
  // Most recent first: move the batch's cached slots to the front (in reverse so keys[0] ends first).
  for (size_t i = keys.size(); i-- > 0;) {
    const auto it = slot_of_.find(key_id(keys[i]));
    if (it != slot_of_.end()) lru_.splice(lru_.begin(), lru_, position_[it->second]);
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
