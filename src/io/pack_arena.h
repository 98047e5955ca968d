// An LRU arena of stride-sized slots over a PackReader: the host-side cache of expert rows.
// fetch() makes a batch of (layer, expert) rows resident, reading all misses with one
// PackReader::read into the least recently used slots not in the batch, and returns pointers
// into the arena (zero-copy on hits). Pointers stay valid until the next fetch(). A batch larger
// than the arena is an error. A fetch with evict = false (a prefill scanning many experts) puts
// its misses only in free slots and reads the rest into `bypass` slots outside the cache, so it
// never displaces what decode keeps hot; a batch may then hold at most `bypass` such rows. Memory comes from an ArenaMemory: plain 4 KiB aligned memory by
// default; the CUDA backend passes a pinned allocator so slots are direct sources for H2D copies.
#pragma once

#include "io/pack_reader.h"

#include <cstdint>
#include <list>
#include <span>
#include <unordered_map>
#include <vector>

namespace moet {

class ArenaMemory {
 public:
  virtual ~ArenaMemory() = default;
  virtual uint8_t* allocate(size_t bytes) = 0;  // 4 KiB aligned
  virtual void release(uint8_t* data, size_t bytes) = 0;
};
ArenaMemory& arena_memory_aligned();

struct ExpertKey {
  int64_t layer;
  int64_t expert;
  bool operator==(const ExpertKey&) const = default;
};

class PackArena {
 public:
  PackArena(PackReader& reader, size_t slots, ArenaMemory& memory = arena_memory_aligned(), size_t bypass = 0);
  ~PackArena();
  PackArena(const PackArena&) = delete;
  PackArena& operator=(const PackArena&) = delete;

  std::vector<const uint8_t*> fetch(std::span<const ExpertKey> keys, bool evict = true);
  // Exclusive use (tiered residency keeping a row either in the device's slots or here): drop()
  // forgets key (its slot becomes the least recent, free); admit() gives key a slot, a free one or
  // the least recently used whose key `protect` does not name, most recent now, and returns its
  // memory for the caller to fill before the next call (nothing is read from the pack).
  void drop(ExpertKey key);
  uint8_t* admit(ExpertKey key, std::span<const ExpertKey> protect);
  // The resident row of key or nullptr; does not touch the LRU order.
  const uint8_t* lookup(ExpertKey key) const;
  // The cached keys, most recently used first.
  std::vector<ExpertKey> recent() const;
  size_t slots() const { return slots_; }
  uint64_t hits() const { return hits_; }
  uint64_t misses() const { return misses_; }

 private:
  static uint64_t key_id(ExpertKey k) { return uint64_t(k.layer) << 32 | uint64_t(k.expert); }

  PackReader& reader_;
  ArenaMemory& memory_;
  size_t slots_, bypass_;
  uint8_t* data_;  // [slots_ + bypass_] strides
  std::list<size_t> lru_;  // front = most recent
  std::vector<std::list<size_t>::iterator> position_;
  std::vector<uint64_t> slot_key_;  // key id per slot, UINT64_MAX when empty
  std::unordered_map<uint64_t, size_t> slot_of_;
  uint64_t hits_ = 0, misses_ = 0;
};

}  // namespace moet
