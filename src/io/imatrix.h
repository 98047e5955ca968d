// The importance matrix ("imatrix") of a model's routed experts, what the importance-aware
// quantizers weigh each input column's squared error by. For routed expert e of MoE layer L:
//   gate_up_in [hidden]  mean of x^2 per column over the layer's input rows routed to e
//                        (the input of gate and of up)
//   down_in    [inner]   mean of a^2 per column, a = SiLU(x gate^T) * (x up^T) of those rows
// An expert that received fewer than min_tokens tokens takes its layer's average instead (every
// routed token of the layer, each counted once per expert that took it).
//
// File (safetensors, `moet imatrix` writes it; docs/formats.md "Importance matrix"):
//   layers.<L>.experts.<e>.gate_up_in   F32 [hidden]
//   layers.<L>.experts.<e>.down_in      F32 [inner]
//   layers.<L>.expert_tokens            I32 [experts]   tokens routed to each expert
//   __metadata__ {"format": "moet-imatrix-v1", "checkpoint_identity", "tokens", "min_tokens"}
// `moet imatrix --expert-moments F` also writes the full second moments E[x x^T] (and E[a a^T]) of
// each expert's inputs to F: the same names with shapes [hidden, hidden] and [inner, inner], format
// "moet-imatrix-second-moments-v1", for every expert or (--expert-moments-top N) only for each
// layer's N hottest; expert_tokens always covers every expert. W2K's LDLQ quantizer reads it
// (io/expert_moments.h); an expert without matrices there rounds against its layer's
// (io/layer_moments.h).
// A file belongs to a model when its tensors are exactly these names for the model's MoE layers
// and experts, with these shapes (imatrix_check). Its identity is the xxh64 of the file's bytes;
// packs quantized with an imatrix record it, so a changed imatrix makes them stale.
#pragma once

#include "io/model_config.h"
#include "io/safetensors.h"

#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace moet {

inline constexpr const char* kImatrixFormat = "moet-imatrix-v1";
inline constexpr const char* kSecondMomentsFormat = "moet-imatrix-second-moments-v1";

struct ImatrixExpert {
  std::vector<float> gate_up_in;  // [hidden]
  std::vector<float> down_in;     // [inner]
  // Full second moments, row-major [hidden * hidden] / [inner * inner]; empty unless collected
  // with second moments. Their diagonals are gate_up_in and down_in.
  std::vector<float> gate_up_xx, down_xx;
};

struct Imatrix {
  std::map<int64_t, std::vector<ImatrixExpert>> layers;  // MoE layer -> [experts]
  std::map<int64_t, std::vector<int32_t>> expert_tokens;  // MoE layer -> [experts]
  std::string checkpoint_identity;
  int64_t tokens = 0;      // input tokens observed
  int64_t min_tokens = 0;  // experts below this took the layer average
  std::string hash;        // xxh64 of the file bytes (imatrix_read / imatrix_write)
  std::string path;        // the file it was read from (for messages)

  // The column importance of the weight that `matrix` names ("gate", "up": gate_up_in; "down":
  // down_in) of (layer, expert); null when the imatrix has no such layer or expert.
  const float* input(int64_t layer, int64_t expert, bool down) const;
};

// The xxh64 of a file's bytes as 16 hex digits (the identity packs record of the files their
// quantizer read).
std::string file_xxh64(const std::filesystem::path& path);
// Writes `imatrix` to `path` and returns the file's hash.
std::string imatrix_write(const std::filesystem::path& path, const Imatrix& imatrix);
// Writes the second moments of `imatrix` to `path` (the experts that have them; the others are
// left out) and returns the hash.
std::string imatrix_second_moments_write(const std::filesystem::path& path, const Imatrix& imatrix);
// The tensor name of (layer, expert)'s gate_up_in or down_in entry, and its inverse: "layers.<L>.
// experts.<e>.<what>" or "layers.<L>.expert_tokens" (expert -1) -> the parts; false for any other.
std::string imatrix_expert_key(int64_t layer, int64_t expert, bool down);
bool imatrix_parse_key(const std::string& name, int64_t* layer, int64_t* expert, std::string* what);
// Opens a moet safetensors file whose __metadata__ format is `format`; throws "F is not a moet
// <what> (no __metadata__ format '<format>'; make one with `<how>`)" otherwise.
std::unique_ptr<SafetensorsFile> moet_file_open(const std::filesystem::path& path, std::string_view format,
                                                std::string_view what, std::string_view how);
// Reads a file imatrix_write wrote; throws naming the file when it is not one.
Imatrix imatrix_read(const std::filesystem::path& path);
// Throws "imatrix F was made for another model: ..." unless the layers, experts and vector
// lengths are exactly the MoE layers and shapes of `config`.
void imatrix_check(const Imatrix& imatrix, const ModelConfig& config, const std::string& file);

}  // namespace moet
