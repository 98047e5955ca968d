// DeepSeek-V3 (and Kimi-K2, which ships model_type kimi_k2 with DeepseekV3ForCausalLM): MLA
// (q_lora_rank or plain q, interleaved rope on the rope slice, yarn with mscale), shared
// experts, sigmoid routing with e_score_correction_bias and grouped top-k, routed_scaling_factor,
// first_k_dense_replace dense layers. The MTP layer at index num_hidden_layers is loaded for
// --speculative-config mtp (models/mtp.h).
#include "models/arch/arch.h"

namespace moet {
namespace {

using nlohmann::json;
using namespace config_json;

void read_deepseek_v3(const json& c, ModelConfig& m) {
  config_read_common(c, m);
  read_deepseek_moe(c, m);
  read_mla(c, m);
}

}  // namespace

void read_mla(const json& c, ModelConfig& m) {
  m.mla = true;
  m.q_lora_rank = opt_int(c, "q_lora_rank", 0);
  m.kv_lora_rank = req_int(c, "kv_lora_rank");
  m.qk_nope_head_dim = req_int(c, "qk_nope_head_dim");
  m.qk_rope_head_dim = req_int(c, "qk_rope_head_dim");
  m.v_head_dim = req_int(c, "v_head_dim");
  m.attention_bias = opt_bool(c, "attention_bias", false);
  m.head_dim = m.qk_nope_head_dim + m.qk_rope_head_dim;
  m.rope = config_read_rope(c, m.qk_rope_head_dim, 1.0);
  m.rope.interleaved = opt_bool(c, "rope_interleave", true);
}

void read_deepseek_moe(const json& c, ModelConfig& m) {
  m.moe_intermediate_size = req_int(c, "moe_intermediate_size");
  m.n_routed_experts = req_int(c, "n_routed_experts");
  m.n_shared_experts = opt_int(c, "n_shared_experts", 0);
  m.scoring = opt_str(c, "scoring_func", "sigmoid") == "softmax" ? RouterScoring::softmax : RouterScoring::sigmoid;
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

const ArchSpec& deepseek_v3_arch() {
  static const ArchSpec spec{"deepseek_v3", {"DeepseekV3ForCausalLM"}, "kimi_k2", read_deepseek_v3,
                             mla_attention_load};
  return spec;
}

}  // namespace moet
