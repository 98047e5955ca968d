// Pack files: a persistent cache of quantized routed experts, one per (format, rank).
//   <dir>/experts-<format>-rank<r>of<w>.pack  raw slots, slot of (layer, local expert) at
//                                             (layer * experts + expert) * stride
//   <dir>/experts-<format>-rank<r>of<w>.json  the sidecar: what the pack was built from and how
//   <dir>/experts-<format>-rank<r>of<w>.lock  flock target serialising writers
// A slot is [codes13 | scales13 | codes2 | scales2]: w13 = gate rows then up rows [2I, H],
// w2 = down [H, I], each in the row-major block-of-32 layout of formats/mx_block.h; the stride is
// the slot size rounded up to 4 KiB (the tail is zero). Rank r of w holds the contiguous expert
// range [r*E/w, (r+1)*E/w). A pack is usable only when every sidecar field equals what the
// caller expects (PackSpec) and the file has exactly the size the sidecar implies; anything
// else is stale. A pack quantized with an importance matrix records its hash, W2-opt and W2K's
// LDLQ their quantizer, and LDLQ the hash of its layer-moments file, so a changed imatrix, file
// or quantizer makes the pack stale (the fields are written only when set: packs of the
// reference quantizers keep their sidecars). The sidecar carries an xxh64
// checksum of its own canonical body.
#pragma once

#include "formats/mx_block.h"
#include "formats/requant.h"

#include <nlohmann/json.hpp>

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

namespace moet {

inline constexpr int kPackFormatVersion = 1;
inline constexpr uint64_t kPackAlign = 4096;

// Identifies the quantizer's output bytes; bump when the codes a source maps to change.
const char* pack_quantizer_abi(StoreFormat format);

struct SlotLayout {
  int64_t hidden = 0;        // H
  int64_t intermediate = 0;  // I (one expert)
  uint64_t codes13 = 0, scales13 = 0, codes2 = 0, scales2 = 0;  // byte offsets in the slot
  uint64_t slot_bytes = 0;
  uint64_t stride = 0;
};
SlotLayout slot_layout(StoreFormat format, int64_t hidden, int64_t intermediate);

// Everything a pack must match to be used.
struct PackSpec {
  StoreFormat format = StoreFormat::w2;
  ZeroMode zero_mode = ZeroMode::automatic;
  W2Quantizer w2_quantizer = W2Quantizer::reference;  // sidecar "w2_quantizer" when not reference
  std::string imatrix;        // hash of the imatrix the quantizer weighed by (sidecar "imatrix"); "": none
  W2kQuantizer w2k_quantizer = W2kQuantizer::reference;  // sidecar "w2k_quantizer" when not reference
  std::string layer_moments;  // hash of the layer moments LDLQ rounded against (sidecar "layer_moments"); "": none
  std::string expert_moments;  // hash of the expert moments LDLQ rounded against (sidecar "expert_moments"); "": none
  int64_t expert_moments_prior = 0;  // n0 of their blend with the layer moments (sidecar field with both files)
  std::string identity;       // checkpoint identity (hash of index + headers + config)
  int64_t n_layers = 0;
  int64_t n_experts = 0;      // E of the model
  int64_t hidden = 0;
  int64_t intermediate = 0;
  int rank = 0;
  int world = 1;
  std::vector<int64_t> layers;  // MoE layers, ascending

  int64_t expert_begin() const { return int64_t(rank) * n_experts / world; }
  int64_t expert_count() const { return int64_t(rank + 1) * n_experts / world - expert_begin(); }
  SlotLayout layout() const { return slot_layout(format, hidden, intermediate); }
  uint64_t file_bytes() const { return uint64_t(n_layers * expert_count()) * layout().stride; }
  uint64_t row_offset(int64_t layer, int64_t local_expert) const {
    return uint64_t(layer * expert_count() + local_expert) * layout().stride;
  }
};

struct PackPaths {
  std::filesystem::path pack, sidecar, lock;
};
PackPaths pack_paths(const std::filesystem::path& dir, StoreFormat format, int rank, int world);

nlohmann::json pack_sidecar_json(const PackSpec& spec);  // includes "checksum"
// Parses a sidecar; throws moet::Error naming the file when it is unreadable, not JSON, has a
// wrong checksum or misses a field.
PackSpec pack_sidecar_read(const std::filesystem::path& path);

// "" when the pack at `paths` is complete and matches `expected`; otherwise why it is stale
// (missing file, corrupt sidecar, which field differs, wrong file size).
std::string pack_check(const PackPaths& paths, const PackSpec& expected);

}  // namespace moet
