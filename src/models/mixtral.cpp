// Mixtral: GQA without q/k norm, every layer MoE (block_sparse_moe, experts w1/w3/w2) with
// softmax top-2 routing renormalised over the chosen experts.
#include "models/architectures.h"

namespace moet {

const ArchSpec& mixtral_arch() {
  static const ArchSpec spec{"mixtral", gqa_attention_load};
  return spec;
}

}  // namespace moet
