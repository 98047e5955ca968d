// A model's layer moments: one second-moment matrix per MoE layer and expert input, shared by
// the layer's routed experts, what W2K's LDLQ quantizer (formats/w2k_ldlq.h) rounds against.
// For MoE layer L, over every (token, expert) pair the router made (each token counted once per
// expert that took it):
//   gate_up_in [hidden, hidden]  mean of x x^T, x the layer's input row (gate's and up's input)
//   down_in    [inner, inner]    mean of a a^T, a = SiLU(x gate_e^T) * (x up_e^T) of that expert
// A per-expert matrix would be K^2 floats per expert and input (205 MB per matrix at K = 7168);
// one per layer is what a full-size model can afford (docs/quality.md measures the difference).
//
// File (safetensors, `moet imatrix --layer-moments F` writes it; docs/formats.md section 4a):
//   layers.<L>.gate_up_in   F32 [hidden, hidden]   symmetric
//   layers.<L>.down_in      F32 [inner, inner]     symmetric
//   __metadata__ {"format": "moet-layer-moments-v1", "checkpoint_identity", "tokens", "pairs"}
// A file belongs to a model when its tensors are exactly these names for the model's MoE layers
// with these shapes (LayerMoments::check). Its identity is the xxh64 of the file's bytes; packs
// quantized with it record it, so a changed file makes them stale. The matrices stay in the
// memory-mapped file until a quantizer copies one out (io/ldlq_moments.h).
#pragma once

#include "io/model_config.h"
#include "io/safetensors.h"

#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <vector>

namespace moet {

inline constexpr const char* kLayerMomentsFormat = "moet-layer-moments-v1";

// What the collector hands to layer_moments_write: per MoE layer the two symmetric matrices.
struct LayerMomentsData {
  struct Layer {
    std::vector<float> gate_up_in, down_in;  // row-major [hidden * hidden], [inner * inner]
  };
  int64_t hidden = 0, inner = 0;
  std::map<int64_t, Layer> layers;
  std::string checkpoint_identity;
  int64_t tokens = 0;  // input tokens observed
  int64_t pairs = 0;   // (token, expert) pairs averaged over, summed over the layers
};

// Writes the file and returns its hash.
std::string layer_moments_write(const std::filesystem::path& path, const LayerMomentsData& data);

// A layer-moments file, read.
class LayerMoments {
 public:
  // Throws naming the file when it is not one.
  static std::shared_ptr<const LayerMoments> read(const std::filesystem::path& path);
  // Throws "layer moments F were made for another model: ..." unless the layers are exactly the
  // MoE layers of `config` with its shapes.
  void check(const ModelConfig& config) const;
  // The F32 [K, K] matrix of (layer, input) in the mapped file; null when the file has no such layer.
  const HostTensor* matrix(int64_t layer, bool down) const;
  const std::string& hash() const { return hash_; }
  const std::string& path() const { return path_; }

 private:
  std::unique_ptr<SafetensorsFile> file_;
  std::map<std::pair<int64_t, bool>, const HostTensor*> tensors_;  // (layer, down) -> its tensor
  std::string hash_, path_;
};

}  // namespace moet
