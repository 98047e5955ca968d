// Building pack files (pack_format.h describes the layout). pack_build quantizes every routed
// expert of the rank's range in every MoE layer into a temporary file, fdatasyncs it, writes the
// sidecar the same way, and renames both into place (old sidecar removed first), then fsyncs the
// directory: a reader sees either no valid pack or a complete one, whatever moment a writer dies.
// Writers of one pack serialise on flock(<base>.lock); pack_ensure re-checks after taking the lock,
// so of two concurrent builders the second reuses the first one's pack. Temp files left by a
// killed writer are removed by the next writer (it holds the lock, so they are dead).
#pragma once

#include "core/thread_pool.h"
#include "formats/source.h"
#include "io/pack_format.h"

#include <functional>
#include <memory>

namespace moet {

// The source matrices of one routed expert: gate [I, H], up [I, H], down [H, I], the column
// importance of their inputs (an imatrix's gate_up_in [H] and down_in [I]; null: none) and the
// LDLQ decompositions of their inputs' second moments (W2K's LDLQ quantizer; null: none).
struct ExpertSources {
  SourceView gate, up, down;
  const float* gate_up_importance = nullptr;
  const float* down_importance = nullptr;
  std::shared_ptr<const W2kLdlqFactor> gate_up_ldlq, down_ldlq;
};
// Called for each (layer, global expert index) to be packed; may be called from one thread only.
using ExpertSourceFn = std::function<ExpertSources(int64_t layer, int64_t expert)>;
// Fills the slot (layout().stride bytes, zeroed) of (layer, global expert index) directly: packs
// of slots that come from no checkpoint (invented experts); called in (layer, expert) order.
using PackRowFn = std::function<void(int64_t layer, int64_t expert, uint8_t* slot)>;

// Quantizes one expert into a slot buffer of layout.slot_bytes (the W2, W2K or FP4 slot layout).
void pack_quantize_slot(const PackSpec& spec, const ExpertSources& sources, ThreadPool& pool,
                        uint8_t* slot);

// Builds the pack unconditionally (under the lock). `progress` shows throughput and ETA.
void pack_build(const PackPaths& paths, const PackSpec& spec, const ExpertSourceFn& sources,
                ThreadPool& pool, bool progress = true);

// Returns false when a valid pack already exists (checked again under the lock), else logs why
// the pack is stale, builds it and returns true.
bool pack_ensure(const PackPaths& paths, const PackSpec& spec, const ExpertSourceFn& sources,
                 ThreadPool& pool, bool progress = true);
// The same from slots made by `rows`.
bool pack_ensure_rows(const PackPaths& paths, const PackSpec& spec, const PackRowFn& rows, bool progress = true);

}  // namespace moet
