// ModelConfig: one typed description for every supported MoE family, and the generic readers of
// config.json fields it is filled with. Which fields a family reads, its tensor names and its
// layer plan live with the family (models/arch/<family>.cpp, where model_config_parse() is); this
// file names no family. Both rope styles are read: as real checkpoints ship it (`rope_theta` +
// `rope_scaling`) and as transformers 5 writes it (`rope_parameters`).
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <string>
#include <vector>

namespace moet {

enum class RouterScoring { softmax, sigmoid, sqrtsoftplus };

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
  std::string family;      // the architecture file that read it (models/arch/)
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
  // DeepSeek sparse attention's lightning indexer (GLM-5; DeepSeek-V4's compressed layers): index
  // heads and head dim, keys kept per query; GLM-5 layers whose indexer_types entry is "full" run
  // their own indexer, the others reuse the previous full layer's choice.
  int64_t index_topk = 0, index_head_dim = 0, index_n_heads = 0;
  std::vector<bool> layer_runs_indexer;  // one entry per layer (GLM-5)
  // DeepSeek-V4: hc_mult residual streams mixed by hyper-connections (0: a plain residual), the
  // SwiGLU clamp of its MLPs (0: none), the sliding window of every layer, per layer its KV
  // compression ratio (0: sliding window only; 4: compressed sparse attention with the indexer;
  // 128: heavily compressed) and whether its MoE routes by token hash, the grouped low-rank
  // output projection and the rope of the compressed layers.
  int64_t hc_mult = 0, hc_sinkhorn_iters = 0;
  double hc_eps = 0.0;
  double swiglu_limit = 0.0;
  int64_t sliding_window = 0;
  std::vector<int64_t> layer_compress_ratio;
  std::vector<bool> layer_hash_routed;
  int64_t o_groups = 0, o_lora_rank = 0;
  RopeConfig compress_rope;
  // Tensor names, set by the family: a MoE layer's block is "model.layers.N.<moe_block>." and
  // its routed expert E's projections "<block>experts.E.<name>.weight" (gate, up, down).
  std::string moe_block = "mlp";
  std::string expert_gate = "gate_proj", expert_up = "up_proj", expert_down = "down_proj";
  std::string router_bias = "e_score_correction_bias";  // "<block>gate.<router_bias>"
  // Where a layer's tensors sit ("<layer_prefix>N.<attention_block>.", its norms
  // "<layer_prefix>N.<input_norm>.weight"), and the embedding, final norm and LM head: the
  // transformers names unless the family's hub checkpoints use their own (DeepSeek-V4).
  std::string layer_prefix = "model.layers.";
  std::string attention_block = "self_attn", input_norm = "input_layernorm",
              post_attention_norm = "post_attention_layernorm";
  std::string embed_name = "model.embed_tokens.weight", final_norm_name = "model.norm.weight",
              lm_head_name = "lm_head.weight";

  // Softmax scale of attention scores, including yarn's mscale^2 for MLA.
  double attention_scale() const;
  // Hub names of routed expert `expert` in `layer`: gate, up, down projection weights.
  struct ExpertNames {
    std::string gate, up, down;
  };
  ExpertNames expert_tensor_names(int64_t layer, int64_t expert) const;
  // Prefix of the MoE block of a layer ("model.layers.3.mlp." or "...block_sparse_moe.").
  std::string moe_prefix(int64_t layer) const;
  // "<layer_prefix>N." (model.layers.N.).
  std::string layer_name(int64_t layer) const;
};

// Readers of config.json fields, for the families' config readers: each names the field in its
// error ("config.json: required field 'x' is missing", "... must be an integer").
namespace config_json {
bool present(const nlohmann::json& c, const char* key);
int64_t req_int(const nlohmann::json& c, const char* key);
int64_t opt_int(const nlohmann::json& c, const char* key, int64_t fallback);
double opt_num(const nlohmann::json& c, const char* key, double fallback);
bool opt_bool(const nlohmann::json& c, const char* key, bool fallback);
std::string opt_str(const nlohmann::json& c, const char* key, const std::string& fallback);
}  // namespace config_json

// Rope settings from either style; `head_dim` is the per-head width rope applies to.
RopeConfig config_read_rope(const nlohmann::json& c, int64_t head_dim, double partial_rotary_factor);
// The fields every family shares (sizes, heads, norm eps, tying, top-k, quantization_config).
void config_read_common(const nlohmann::json& c, ModelConfig& m);
// The checks every parsed config must pass (top-k within the experts, groups dividing them, an
// even rotary dimension).
void config_check(const ModelConfig& m);

}  // namespace moet
