// config.json -> ModelConfig: one typed description for every supported MoE family, filled by a
// parser per family (model_config.cpp). Both config styles are accepted: as real checkpoints ship
// it (`rope_theta` + `rope_scaling`) and as transformers 5 writes it (`rope_parameters`).
// `model_type` is resolved through `architectures` too (Kimi-K2 ships model_type "kimi_k2" with
// DeepseekV3ForCausalLM), and an unknown family is an error naming the supported ones.
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <string>
#include <vector>

namespace moet {

enum class RouterScoring { softmax, sigmoid };

struct RopeConfig {
  std::string type = "default";   // default | yarn | linear
  double theta = 10000.0;
  int64_t dim = 0;                // rotated dimensions per head (partial rotary included)
  bool interleaved = false;       // pairs (x0,x1),(x2,x3)... instead of halves (DeepSeek MLA)
  double factor = 1.0;
  int64_t original_max_position_embeddings = 0;
  double beta_fast = 32.0;
  double beta_slow = 1.0;
  double mscale = 0.0;            // 0 = absent
  double mscale_all_dim = 0.0;    // 0 = absent
  double attention_factor = 0.0;  // 0 = derive from factor/mscale
  bool truncate = true;
};

struct ModelConfig {
  std::string family;  // qwen3_moe | deepseek_v3 | glm4_moe | mixtral
  std::string model_type;  // as written in config.json
  int64_t vocab_size = 0;
  int64_t hidden_size = 0;
  int64_t num_hidden_layers = 0;
  int64_t num_attention_heads = 0;
  int64_t num_key_value_heads = 0;
  int64_t head_dim = 0;
  int64_t intermediate_size = 0;      // dense MLP layers
  int64_t moe_intermediate_size = 0;  // one routed expert
  int64_t n_routed_experts = 0;
  int64_t num_experts_per_tok = 0;
  int64_t n_shared_experts = 0;       // shared expert width = n_shared_experts * moe_intermediate_size
  int64_t max_position_embeddings = 0;
  double rms_norm_eps = 1e-6;
  bool tie_word_embeddings = false;
  bool attention_bias = false;  // q/k/v projections carry biases (GLM)
  bool qk_norm = false;         // per-head RMSNorm of q and k before rope (Qwen3, GLM)
  // MLA (DeepSeek): q_lora_rank 0 means a plain q_proj.
  bool mla = false;
  int64_t q_lora_rank = 0;
  int64_t kv_lora_rank = 0;
  int64_t qk_nope_head_dim = 0;
  int64_t qk_rope_head_dim = 0;
  int64_t v_head_dim = 0;
  // Routing.
  RouterScoring scoring = RouterScoring::softmax;
  bool norm_topk_prob = true;
  double routed_scaling_factor = 1.0;
  int64_t n_group = 1;
  int64_t topk_group = 1;
  bool has_correction_bias = false;
  RopeConfig rope;
  std::vector<bool> layer_is_moe;  // one entry per layer
  int64_t num_nextn_predict_layers = 0;
  nlohmann::json quantization_config;  // null when the checkpoint is unquantized

  // Softmax scale of attention scores, including yarn's mscale^2 for MLA.
  double attention_scale() const;
  // Hub names of routed expert `expert` in `layer`: gate, up, down projection weights.
  struct ExpertNames {
    std::string gate, up, down;
  };
  ExpertNames expert_tensor_names(int64_t layer, int64_t expert) const;
  // Prefix of the MoE block of a layer ("model.layers.3.mlp." or "...block_sparse_moe.").
  std::string moe_prefix(int64_t layer) const;
};

ModelConfig model_config_parse(const nlohmann::json& config);
// The families model_config_parse accepts, for error messages and --help.
const std::vector<std::string>& model_config_supported();

}  // namespace moet
