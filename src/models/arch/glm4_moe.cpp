// GLM-4.5/4.6 MoE: GQA with q/k/v biases, optional per-head q/k norm and partial rotary (the
// first partial_rotary_factor * head_dim values, NeoX halves); DeepSeek-style MoE: sigmoid
// scores with correction bias, grouped top-k, routed_scaling_factor, shared experts, and
// first_k_dense_replace dense layers.
#include "models/arch/arch.h"

namespace moet {
namespace {

using nlohmann::json;
using namespace config_json;

void read_glm4_moe(const json& c, ModelConfig& m) {
  config_read_common(c, m);
  read_deepseek_moe(c, m);
  m.attention_bias = opt_bool(c, "attention_bias", false);
  m.qk_norm = opt_bool(c, "use_qk_norm", false);
  m.rope = config_read_rope(c, m.head_dim, opt_num(c, "partial_rotary_factor", 0.5));
}

}  // namespace

const ArchSpec& glm4_moe_arch() {
  static const ArchSpec spec{"glm4_moe", {"Glm4MoeForCausalLM"}, "", read_glm4_moe, gqa_attention_load};
  return spec;
}

}  // namespace moet
