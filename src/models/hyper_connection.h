// DeepSeek-V4's hyper-connections as weights the decoder stack hands to the backend's hc_pre /
// hc_post / hc_head ops (kernels/cpu/hyper_connection.h says what they compute). Hub names: a
// layer's "<layer>hc_attn_{fn,base,scale}" and "<layer>hc_ffn_{fn,base,scale}" (fn
// [(2 + hc) * hc, hc * hidden], base [(2 + hc) * hc], scale [3]); the model's final collapse
// "hc_head_{fn,base,scale}" (fn [hc, hc * hidden], base [hc], scale [1]). All F32 in memory, as
// transformers keeps them.
#pragma once

#include "models/blocks.h"

namespace moet {

struct HyperConnection {
  Tensor fn, base, scale;
  HyperConnectionWeights weights(const ModelConfig& config) const;
};

struct HyperConnections {
  HyperConnection attention, ffn;
};

std::unique_ptr<HyperConnections> hyper_layer_load(const ModelConfig& config, WeightLoader& loader, int64_t layer);
std::unique_ptr<HyperConnection> hyper_head_load(const ModelConfig& config, WeightLoader& loader);

}  // namespace moet
