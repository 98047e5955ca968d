// GLM-4.5/4.6 MoE: GQA with q/k/v biases, optional per-head q/k norm and partial rotary (the
// first partial_rotary_factor * head_dim values, NeoX halves); DeepSeek-style MoE: sigmoid
// scores with correction bias, grouped top-k, routed_scaling_factor, shared experts, and
// first_k_dense_replace dense layers.
#include "models/architectures.h"

namespace moet {

const ArchSpec& glm4_moe_arch() {
  static const ArchSpec spec{"glm4_moe", gqa_attention_load};
  return spec;
}

}  // namespace moet
