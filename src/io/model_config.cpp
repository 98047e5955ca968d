// Generic config.json field readers and the ModelConfig helpers (see model_config.h).
#include "io/model_config.h"

#include "core/error.h"

#include <fmt/ranges.h>

#include <cmath>

namespace moet {

using nlohmann::json;

namespace config_json {

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

}  // namespace config_json

using namespace config_json;

RopeConfig config_read_rope(const json& c, int64_t head_dim, double partial_rotary_factor) {
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

void config_read_common(const json& c, ModelConfig& m) {
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

void config_check(const ModelConfig& m) {
  MOET_CHECK(m.num_experts_per_tok > 0 && m.num_experts_per_tok <= m.n_routed_experts,
             "config.json: num_experts_per_tok {} must be in [1, {}]", m.num_experts_per_tok,
             m.n_routed_experts);
  MOET_CHECK(m.n_group > 0 && m.n_routed_experts % m.n_group == 0 && m.topk_group <= m.n_group,
             "config.json: n_group {} / topk_group {} do not divide {} experts", m.n_group,
             m.topk_group, m.n_routed_experts);
  MOET_CHECK(m.rope.dim % 2 == 0, "config.json: rotary dimension {} must be even", m.rope.dim);
}

double ModelConfig::attention_scale() const {
  double scale = 1.0 / std::sqrt(double(head_dim));
  if (mla && rope.type != "default" && rope.mscale_all_dim != 0.0 && rope.factor > 1.0) {
    const double mscale = 0.1 * rope.mscale_all_dim * std::log(rope.factor) + 1.0;
    scale *= mscale * mscale;
  }
  return scale;
}

std::string ModelConfig::layer_name(int64_t layer) const { return fmt::format("{}{}.", layer_prefix, layer); }

std::string ModelConfig::moe_prefix(int64_t layer) const { return fmt::format("{}{}.", layer_name(layer), moe_block); }

ModelConfig::ExpertNames ModelConfig::expert_tensor_names(int64_t layer, int64_t expert) const {
  const std::string base = fmt::format("{}experts.{}.", moe_prefix(layer), expert);
  return {base + expert_gate + ".weight", base + expert_up + ".weight", base + expert_down + ".weight"};
}

}  // namespace moet
