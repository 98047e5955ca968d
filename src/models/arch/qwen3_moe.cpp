// Qwen3-MoE: GQA with per-head q/k RMSNorm, softmax top-k routing (norm_topk_prob), dense MLP
// layers where mlp_only_layers / decoder_sparse_step say so; no shared experts.
#include "models/arch/arch.h"

#include <algorithm>

namespace moet {
namespace {

using nlohmann::json;
using namespace config_json;

void read_qwen3_moe(const json& c, ModelConfig& m) {
  config_read_common(c, m);
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
    for (const nlohmann::json& v : c["mlp_only_layers"]) {
      MOET_CHECK(v.is_number_integer(), "config.json: 'mlp_only_layers' must be a list of layer indices");
      dense_layers.push_back(v.get<int64_t>());
    }
  }
  for (int64_t l = 0; l < m.num_hidden_layers; ++l) {
    const bool listed = std::find(dense_layers.begin(), dense_layers.end(), l) != dense_layers.end();
    m.layer_is_moe.push_back(!listed && m.n_routed_experts > 0 && step > 0 && (l + 1) % step == 0);
  }
  m.rope = config_read_rope(c, m.head_dim, 1.0);
}

}  // namespace

const ArchSpec& qwen3_moe_arch() {
  static const ArchSpec spec{"qwen3_moe", {"Qwen3MoeForCausalLM"}, "", read_qwen3_moe, gqa_attention_load};
  return spec;
}

}  // namespace moet
