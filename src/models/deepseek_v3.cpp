// DeepSeek-V3 (and Kimi-K2, which ships model_type kimi_k2 with DeepseekV3ForCausalLM): MLA
// (q_lora_rank or plain q, interleaved rope on the rope slice, yarn with mscale), shared
// experts, sigmoid routing with e_score_correction_bias and grouped top-k, routed_scaling_factor,
// first_k_dense_replace dense layers. The MTP layer at index num_hidden_layers is not used yet.
#include "models/architectures.h"

namespace moet {

const ArchSpec& deepseek_v3_arch() {
  static const ArchSpec spec{"deepseek_v3", mla_attention_load};
  return spec;
}

}  // namespace moet
