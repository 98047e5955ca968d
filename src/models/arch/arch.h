// One file per supported architecture (models/arch/<family>.cpp): its config reader (which
// config.json fields it reads, its tensor names, its layer plan: which layers are MoE) and the
// blocks its layers use. families.cpp lists them, resolves a config.json to one of them
// (model_type, or the HF class in `architectures`: Kimi-K2 ships model_type "kimi_k2" with
// DeepseekV3ForCausalLM) and parses it; model_load() (models/registry.cpp) assembles the stack.
// Adding a family means adding a file and its line in families.cpp.
#pragma once

#include "io/model_config.h"
#include "models/blocks.h"

#include <nlohmann/json.hpp>

#include <functional>
#include <string>
#include <vector>

namespace moet {

struct ArchSpec {
  std::string family;                      // the model_type it reads
  std::vector<std::string> architectures;  // HF class names that select it too
  std::string also_for;                    // other model_types it serves, for messages ("" = none)
  // Fills `config` from config.json (config_read_common() and the family's own fields).
  std::function<void(const nlohmann::json&, ModelConfig&)> read_config;
  // Loads layer N's attention from "model.layers.N.self_attn." (the layer's prefix and N).
  std::function<std::unique_ptr<AttentionBlock>(const ModelConfig&, WeightLoader&, const std::string&, int64_t)>
      attention;
  // The KV specs of layer N without weights (null: one MLA or GQA cache as config.mla says).
  std::function<std::vector<KvLayerSpec>(const ModelConfig&, int64_t)> layer_kv_specs = nullptr;
};

const ArchSpec& qwen3_moe_arch();
const ArchSpec& deepseek_v3_arch();
const ArchSpec& glm4_moe_arch();
const ArchSpec& mixtral_arch();
const ArchSpec& glm_moe_dsa_arch();
const ArchSpec& deepseek_v4_arch();

// DeepSeek-style MoE fields (first_k_dense_replace dense layers, shared experts, sigmoid scores
// with a correction bias, grouped top-k), read by deepseek_v3, glm4_moe and glm_moe_dsa.
void read_deepseek_moe(const nlohmann::json& c, ModelConfig& m);
// DeepSeek-V3's MLA fields (q_lora_rank, kv_lora_rank, the head dims, interleaved rope), read by
// deepseek_v3 and glm_moe_dsa.
void read_mla(const nlohmann::json& c, ModelConfig& m);
// A per-layer list of strings (mlp_layer_types, indexer_types, layer_types): each entry must be
// one of `allowed`, and there must be one per layer (the first num_hidden_layers of a longer list).
std::vector<std::string> read_layer_types(const nlohmann::json& c, const char* key, int64_t layers,
                                          const std::vector<std::string>& allowed);

// The spec a config.json names; an unknown family is an error naming the supported ones.
const ArchSpec& arch_for_config(const nlohmann::json& config);
const ArchSpec& arch_for_family(const std::string& family);
// config.json -> ModelConfig through its family's reader, then config_check().
ModelConfig model_config_parse(const nlohmann::json& config);
// The families model_config_parse accepts, for error messages and --help.
const std::vector<std::string>& model_config_supported();

}  // namespace moet
