// config.json parsing, one function per family over shared field readers (see model_config.h).
#include "io/model_config.h"

#include "core/error.h"

#include <fmt/ranges.h>

#include <cmath>
#include <functional>
#include <map>

namespace moet {
namespace {

using nlohmann::json;

bool present(const json& c, const char* key) { return c.contains(key) && !c[key].is_null(); }

int64_t req_int(const json& c, const char* key) {
  MOET_CHECK(present(c, key), "config.json: required field '{}' is missing", key);
  MOET_CHECK(c[key].is_number_integer(), "config.json: '{}' must be an integer", key);
  return c[key].get<int64_t>();
}

int64_t opt_int(const json& c, const char* key, int64_t fallback) {
  return present(c, key) ? req_int(c, key) : fallback;
}

double opt_num(const json& c, const char* key, double fallback) {
  if (!present(c, key)) return fallback;
  MOET_CHECK(c[key].is_number(), "config.json: '{}' must be a number", key);
  return c[key].get<double>();
}

bool opt_bool(const json& c, const char* key, bool fallback) {
  if (!present(c, key)) return fallback;
  MOET_CHECK(c[key].is_boolean(), "config.json: '{}' must be true or false", key);
  return c[key].get<bool>();
}

std::string opt_str(const json& c, const char* key, const std::string& fallback) {
  if (!present(c, key)) return fallback;
  MOET_CHECK(c[key].is_string(), "config.json: '{}' must be a string", key);
  return c[key].get<std::string>();
}

// Rope settings from either style; `head_dim` is the per-head width rope applies to.
RopeConfig parse_rope(const json& c, int64_t head_dim, double partial_rotary_factor) {
  json params = json::object();
  if (present(c, "rope_parameters")) {
    params = c["rope_parameters"];
  } else if (present(c, "rope_scaling")) {
    params = c["rope_scaling"];
  }
  MOET_CHECK(params.is_object(), "config.json: rope_parameters/rope_scaling must be an object");
  RopeConfig rope;
  rope.theta = opt_num(params, "rope_theta", opt_num(c, "rope_theta", 10000.0));
  rope.type = opt_str(params, "rope_type", opt_str(params, "type", "default"));
  partial_rotary_factor = opt_num(params, "partial_rotary_factor", partial_rotary_factor);
  rope.dim = int64_t(double(head_dim) * partial_rotary_factor);
  MOET_CHECK(rope.type == "default" || rope.type == "yarn" || rope.type == "linear",
             "config.json: rope type '{}' is not supported (default, linear, yarn)", rope.type);
  rope.factor = opt_num(params, "factor", 1.0);
  rope.original_max_position_embeddings = opt_int(
      params, "original_max_position_embeddings",
      opt_int(c, "original_max_position_embeddings", opt_int(c, "max_position_embeddings", 0)));
  rope.beta_fast = opt_num(params, "beta_fast", 32.0);
  rope.beta_slow = opt_num(params, "beta_slow", 1.0);
  rope.mscale = opt_num(params, "mscale", 0.0);
  rope.mscale_all_dim = opt_num(params, "mscale_all_dim", 0.0);
  rope.attention_factor = opt_num(params, "attention_factor", 0.0);
  rope.truncate = opt_bool(params, "truncate", true);
  return rope;
}

void parse_common(const json& c, ModelConfig& m) {
  m.vocab_size = req_int(c, "vocab_size");
  m.hidden_size = req_int(c, "hidden_size");
  m.num_hidden_layers = req_int(c, "num_hidden_layers");
  m.num_attention_heads = req_int(c, "num_attention_heads");
  MOET_CHECK(m.num_attention_heads > 0, "config.json: num_attention_heads must be positive (got {})",
             m.num_attention_heads);  // before it divides below
  m.num_key_value_heads = opt_int(c, "num_key_value_heads", m.num_attention_heads);
  m.head_dim = opt_int(c, "head_dim", m.hidden_size / m.num_attention_heads);
  m.intermediate_size = opt_int(c, "intermediate_size", 0);
  m.max_position_embeddings = opt_int(c, "max_position_embeddings", 4096);
  m.rms_norm_eps = opt_num(c, "rms_norm_eps", 1e-6);
  m.tie_word_embeddings = opt_bool(c, "tie_word_embeddings", false);
  m.num_experts_per_tok = req_int(c, "num_experts_per_tok");
  if (present(c, "quantization_config")) m.quantization_config = c["quantization_config"];
  const std::string act = opt_str(c, "hidden_act", "silu");
  MOET_CHECK(act == "silu", "config.json: hidden_act '{}' is not supported (silu)", act);
  MOET_CHECK(m.vocab_size > 0 && m.hidden_size > 0 && m.num_hidden_layers > 0 &&
                 m.num_attention_heads > 0 && m.num_key_value_heads > 0 &&
                 m.num_attention_heads % m.num_key_value_heads == 0,
             "config.json: inconsistent sizes (vocab, hidden, layers, heads, kv heads)");
}

// DeepSeek-V3 / GLM-4.5 style MoE: first_k_dense_replace dense layers, shared experts,
// sigmoid scores with a correction bias and grouped top-k.
void parse_deepseek_moe(const json& c, ModelConfig& m) {
  m.moe_intermediate_size = req_int(c, "moe_intermediate_size");
  m.n_routed_experts = req_int(c, "n_routed_experts");
  m.n_shared_experts = opt_int(c, "n_shared_experts", 0);
  m.scoring = opt_str(c, "scoring_func", "sigmoid") == "softmax" ? RouterScoring::softmax
                                                                : RouterScoring::sigmoid;
  m.has_correction_bias = opt_str(c, "topk_method", "noaux_tc") == "noaux_tc";
  m.norm_topk_prob = opt_bool(c, "norm_topk_prob", true);
  m.routed_scaling_factor = opt_num(c, "routed_scaling_factor", 1.0);
  m.n_group = opt_int(c, "n_group", 1);
  m.topk_group = opt_int(c, "topk_group", 1);
  // As transformers does: every layer from first_k_dense_replace on is MoE (moe_layer_freq is 1
  // in every released checkpoint and transformers ignores it).
  const int64_t first_dense = opt_int(c, "first_k_dense_replace", 0);
  for (int64_t l = 0; l < m.num_hidden_layers; ++l) m.layer_is_moe.push_back(l >= first_dense);
  m.num_nextn_predict_layers = opt_int(c, "num_nextn_predict_layers", 0);
}

void parse_deepseek_v3(const json& c, ModelConfig& m) {
  parse_common(c, m);
  parse_deepseek_moe(c, m);
  m.mla = true;
  m.q_lora_rank = opt_int(c, "q_lora_rank", 0);
  m.kv_lora_rank = req_int(c, "kv_lora_rank");
  m.qk_nope_head_dim = req_int(c, "qk_nope_head_dim");
  m.qk_rope_head_dim = req_int(c, "qk_rope_head_dim");
  m.v_head_dim = req_int(c, "v_head_dim");
  m.attention_bias = opt_bool(c, "attention_bias", false);
  m.head_dim = m.qk_nope_head_dim + m.qk_rope_head_dim;
  m.rope = parse_rope(c, m.qk_rope_head_dim, 1.0);
  m.rope.interleaved = opt_bool(c, "rope_interleave", true);
}

void parse_glm4_moe(const json& c, ModelConfig& m) {
  parse_common(c, m);
  parse_deepseek_moe(c, m);
  m.attention_bias = opt_bool(c, "attention_bias", false);
  m.qk_norm = opt_bool(c, "use_qk_norm", false);
  m.rope = parse_rope(c, m.head_dim, opt_num(c, "partial_rotary_factor", 0.5));
}

void parse_qwen3_moe(const json& c, ModelConfig& m) {
  parse_common(c, m);
  m.qk_norm = true;
  m.attention_bias = opt_bool(c, "attention_bias", false);
  m.moe_intermediate_size = req_int(c, "moe_intermediate_size");
  // The hub writes num_experts; transformers 5 writes num_local_experts.
  m.n_routed_experts = present(c, "num_experts") ? req_int(c, "num_experts") : req_int(c, "num_local_experts");
  m.norm_topk_prob = opt_bool(c, "norm_topk_prob", false);
  const int64_t step = opt_int(c, "decoder_sparse_step", 1);
  std::vector<int64_t> dense_layers;
  if (present(c, "mlp_only_layers")) {
    // Element by element: get<std::vector<int64_t>>() would convert floats unchecked (UB when
    // out of range; found by config_fuzz).
    MOET_CHECK(c["mlp_only_layers"].is_array(), "config.json: 'mlp_only_layers' must be a list of layer indices");
    for (const json& v : c["mlp_only_layers"]) {
      MOET_CHECK(v.is_number_integer(), "config.json: 'mlp_only_layers' must be a list of layer indices");
      dense_layers.push_back(v.get<int64_t>());
    }
  }
  for (int64_t l = 0; l < m.num_hidden_layers; ++l) {
    const bool listed = std::find(dense_layers.begin(), dense_layers.end(), l) != dense_layers.end();
    m.layer_is_moe.push_back(!listed && m.n_routed_experts > 0 && step > 0 && (l + 1) % step == 0);
  }
  m.rope = parse_rope(c, m.head_dim, 1.0);
}

void parse_mixtral(const json& c, ModelConfig& m) {
  parse_common(c, m);
  m.moe_intermediate_size = req_int(c, "intermediate_size");
  m.n_routed_experts = req_int(c, "num_local_experts");
  m.norm_topk_prob = true;
  m.layer_is_moe.assign(size_t(m.num_hidden_layers), true);
  m.rope = parse_rope(c, m.head_dim, 1.0);
}

using Parser = std::function<void(const json&, ModelConfig&)>;

// Family name -> parser, and the architectures / model_type aliases that select it.
const std::map<std::string, Parser>& parsers() {
  static const std::map<std::string, Parser> table = {
      {"deepseek_v3", parse_deepseek_v3},
      {"glm4_moe", parse_glm4_moe},
      {"mixtral", parse_mixtral},
      {"qwen3_moe", parse_qwen3_moe},
  };
  return table;
}

const std::map<std::string, std::string>& architecture_families() {
  static const std::map<std::string, std::string> table = {
      {"DeepseekV3ForCausalLM", "deepseek_v3"},
      {"Glm4MoeForCausalLM", "glm4_moe"},
      {"MixtralForCausalLM", "mixtral"},
      {"Qwen3MoeForCausalLM", "qwen3_moe"},
  };
  return table;
}

std::string resolve_family(const json& c) {
  const std::string model_type = opt_str(c, "model_type", "");
  if (parsers().count(model_type)) return model_type;
  if (present(c, "architectures") && c["architectures"].is_array()) {
    for (const auto& arch : c["architectures"]) {
      if (!arch.is_string()) continue;
      const auto it = architecture_families().find(arch.get<std::string>());
      if (it != architecture_families().end()) return it->second;
    }
  }
  fail("config.json: unsupported model_type '{}' (architectures {}); supported: {}", model_type,
       present(c, "architectures") ? c["architectures"].dump() : "[]",
       fmt::join(model_config_supported(), ", "));
}

}  // namespace

const std::vector<std::string>& model_config_supported() {
  static const std::vector<std::string> names = [] {
    std::vector<std::string> out;
    for (const auto& [name, parser] : parsers()) out.push_back(name);
    out.push_back("kimi_k2 (as deepseek_v3)");
    return out;
  }();
  return names;
}

ModelConfig model_config_parse(const json& config) {
  MOET_CHECK(config.is_object(), "config.json: not a JSON object");
  ModelConfig m;
  m.family = resolve_family(config);
  m.model_type = opt_str(config, "model_type", m.family);
  try {
    parsers().at(m.family)(config, m);
  } catch (const json::exception& e) {
    fail("config.json: {}", e.what());
  }
  MOET_CHECK(m.num_experts_per_tok > 0 && m.num_experts_per_tok <= m.n_routed_experts,
             "config.json: num_experts_per_tok {} must be in [1, {}]", m.num_experts_per_tok,
             m.n_routed_experts);
  MOET_CHECK(m.n_group > 0 && m.n_routed_experts % m.n_group == 0 && m.topk_group <= m.n_group,
             "config.json: n_group {} / topk_group {} do not divide {} experts", m.n_group,
             m.topk_group, m.n_routed_experts);
  MOET_CHECK(m.rope.dim % 2 == 0, "config.json: rotary dimension {} must be even", m.rope.dim);
  return m;
}

double ModelConfig::attention_scale() const {
  double scale = 1.0 / std::sqrt(double(head_dim));
  if (mla && rope.type != "default" && rope.mscale_all_dim != 0.0 && rope.factor > 1.0) {
    const double mscale = 0.1 * rope.mscale_all_dim * std::log(rope.factor) + 1.0;
    scale *= mscale * mscale;
  }
  return scale;
}

std::string ModelConfig::moe_prefix(int64_t layer) const {
  return fmt::format("model.layers.{}.{}.", layer, family == "mixtral" ? "block_sparse_moe" : "mlp");
}

ModelConfig::ExpertNames ModelConfig::expert_tensor_names(int64_t layer, int64_t expert) const {
  const std::string base = fmt::format("{}experts.{}.", moe_prefix(layer), expert);
  if (family == "mixtral") return {base + "w1.weight", base + "w3.weight", base + "w2.weight"};
  return {base + "gate_proj.weight", base + "up_proj.weight", base + "down_proj.weight"};
}

}  // namespace moet
