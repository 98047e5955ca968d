// Qwen3-MoE: GQA with per-head q/k RMSNorm, softmax top-k routing (norm_topk_prob), dense MLP
// layers where mlp_only_layers / decoder_sparse_step say so; no shared experts.
#include "models/architectures.h"

namespace moet {

const ArchSpec& qwen3_moe_arch() {
  static const ArchSpec spec{"qwen3_moe", gqa_attention_load};
  return spec;
}

}  // namespace moet
