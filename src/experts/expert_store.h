// Where routed experts' rows live on the host when the backend holds only some of them (tiered
// residency, experts/residency.h): the pack slot bytes of (layer, expert) served in batches into
// memory the backend copies from at full speed (page-locked on CUDA). Three stores
// (--expert-store):
//   ram    every row in pinned memory, filled at boot (quantized, read from the pack, or invented);
//          fetches are views, no copy;
//   pack   rows read from the pack file through the page cache (or O_DIRECT) by a pool of
//          reader threads into a pinned staging area: host memory stays small;
//   arena  pack plus a pinned LRU arena over it: hits are views, misses are read into an arena
//          slot; a prefill (a scan of many experts) fills free slots only and reads the rest
//          around the arena, so it never evicts what decode keeps hot. The hot set is saved to
//          <pack>.heat.json and read back into the arena at boot (unless told not to).
// A store serves exactly the bytes a resident load would upload (tested with memcmp per store).
// Exclusive stores (--expert-tiering exclusive: a row lives in the backend's slots or here, never
// both) hold only the rows the backend does not: `ram` keeps those rows plus a spare batch's (the
// victims of one fetch land there before the fetched rows' memory is let go); `arena` never keeps
// a row the backend holds (a fetched row leaves the arena, a victim's row is written into it from
// the backend, the pack still holding every row); `pack` has no host copy to make exclusive and
// is refused with it.
#pragma once

#include "backend/backend.h"
#include "io/pack_arena.h"
#include "io/pack_reader.h"

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

namespace moet {

enum class ExpertStoreKind { ram, pack, arena };
ExpertStoreKind expert_store_parse(const std::string& name);  // "ram" | "pack" | "arena"
const char* expert_store_name(ExpertStoreKind kind);

// What a store has served since it was made.
struct ExpertStoreCounters {
  uint64_t fetches = 0, rows = 0, bytes = 0;
  uint64_t arena_hits = 0, arena_misses = 0;  // arena only
  std::vector<double> fetch_seconds;          // the last kFetchTimes fetches, oldest first
};

class ExpertStore {
 public:
  static constexpr size_t kFetchTimes = 1024;

  virtual ~ExpertStore() = default;
  virtual ExpertStoreKind kind() const = 0;
  // Bytes of one row (the pack slot; what a fetch points at).
  virtual uint64_t row_bytes() const = 0;
  // The most keys one fetch takes.
  virtual size_t max_batch() const = 0;
  // The rows of `keys`, each row_bytes() in memory the backend copies from at full speed; valid
  // until the next fetch. scan: many experts of one pass (a prefill), which an arena does not
  // let displace its hot set.
  std::vector<const uint8_t*> fetch(std::span<const ExpertKey> keys, bool scan = false);
  const ExpertStoreCounters& counters() const { return counters_; }

  // Exclusive stores: memory for the rows of `keys` (experts leaving the backend), each row_bytes(),
  // to be written before the next call, never the memory of `loading` (rows the last fetch gave,
  // being loaded); and release() of rows now loaded into the backend (the store lets them go).
  virtual bool exclusive() const { return false; }
  virtual std::vector<uint8_t*> admit(std::span<const ExpertKey> keys, std::span<const ExpertKey> loading);
  virtual void release(std::span<const ExpertKey> keys);

 protected:
  virtual std::vector<const uint8_t*> fetch_rows(std::span<const ExpertKey> keys, bool scan) = 0;
  ExpertStoreCounters counters_;
};

// Fills `row` (row_bytes) with the expert's pack slot.
using ExpertRowFn = std::function<void(int64_t layer, int64_t expert, uint8_t* row)>;

struct ExpertStoreOptions {
  ExpertStoreKind kind = ExpertStoreKind::ram;
  PackPaths pack;               // pack / arena: the pack file (built before)
  PackSpec spec;                // what it must match
  int threads = 8;              // pack / arena: reader threads
  bool direct_io = false;       // pack / arena: O_DIRECT reads
  uint64_t arena_bytes = 0;     // arena: its size (0: 25% of the pack)
  bool preheat = true;          // arena: read the saved hot set back at boot
  size_t max_batch = 256;       // rows one fetch may take (pack: the staging area; arena: its scan bypass)
  // Exclusive (ram, arena): the keys the backend holds from the start, whose rows the store does not
  // take (ram: fill is not called for them; arena: not preheated).
  bool exclusive = false;
  std::function<bool(const ExpertKey&)> held_elsewhere;
};

// The store `options` names. ram: rows of `layers` x `experts` filled through fill (a progress
// bar while it runs; exclusive: only those not held elsewhere, with max_batch spare rows); pack /
// arena: read from options.pack, which must match options.spec (otherwise the error says why:
// stale, truncated).
std::unique_ptr<ExpertStore> expert_store_create(const ExpertStoreOptions& options, Backend& backend,
                                                 std::span<const int64_t> layers, int64_t experts, uint64_t row_bytes,
                                                 const ExpertRowFn& fill);

}  // namespace moet
