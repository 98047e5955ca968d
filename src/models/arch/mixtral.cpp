// Mixtral: GQA without q/k norm, every layer MoE (block_sparse_moe, experts w1/w3/w2) with
// softmax top-2 routing renormalised over the chosen experts.
#include "models/arch/arch.h"

namespace moet {
namespace {

using nlohmann::json;
using namespace config_json;

void read_mixtral(const json& c, ModelConfig& m) {
  config_read_common(c, m);
  m.moe_intermediate_size = req_int(c, "intermediate_size");
  m.n_routed_experts = req_int(c, "num_local_experts");
  m.norm_topk_prob = true;
  m.layer_is_moe.assign(size_t(m.num_hidden_layers), true);
  m.rope = config_read_rope(c, m.head_dim, 1.0);
  m.moe_block = "block_sparse_moe";
  m.expert_gate = "w1";
  m.expert_up = "w3";
  m.expert_down = "w2";
}

}  // namespace

const ArchSpec& mixtral_arch() {
  static const ArchSpec spec{"mixtral", {"MixtralForCausalLM"}, "", read_mixtral, gqa_attention_load};
  return spec;
}

}  // namespace moet
