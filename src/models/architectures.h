// One entry per supported architecture. An architecture file (qwen3_moe.cpp, deepseek_v3.cpp,
// glm4_moe.cpp, mixtral.cpp) says which blocks its layers use; decoder_build() assembles the
// stack from that, so adding a family means adding a file and a line in registry.cpp.
#pragma once

#include "models/blocks.h"

#include <functional>
#include <string>

namespace moet {

struct ArchSpec {
  std::string family;
  // Loads layer `layer`'s attention from "model.layers.N.self_attn.".
  std::function<std::unique_ptr<AttentionBlock>(const ModelConfig&, WeightLoader&, const std::string&)> attention;
};

const ArchSpec& qwen3_moe_arch();
const ArchSpec& deepseek_v3_arch();
const ArchSpec& glm4_moe_arch();
const ArchSpec& mixtral_arch();

// Builds a DecoderModel: common weights, then per layer the spec's attention and either the
// MoE block or the dense MLP (intermediate_size) as config.layer_is_moe says.
std::unique_ptr<Model> decoder_build(const ArchSpec& spec, const ModelConfig& config,
                                     WeightLoader& loader, Backend& backend);

}  // namespace moet
