// The lightning indexer of DeepSeek sparse attention as GLM-5 runs it (transformers'
// GlmMoeDsaIndexer). Per token it keeps one key in a cache of its own (index_head_dim values):
//   k = LayerNorm(wk x) (weight and bias, eps 1e-6), roped on its first qk_rope_head_dim values
//       with the layer's interleaved rope
// and per query row t it scores every earlier key j (its own included)
//   score(t, j) = sum_h w[t, h] * relu(q[t, h] . k_j / sqrt(index_head_dim))
//   q = wq_b q_resid (index_n_heads heads, roped like k), w = weights_proj x
// (transformers also multiplies w by index_n_heads^-0.5: one positive factor for every score of a
// row, which changes no choice, so it is left out) and keeps the index_topk best keys; with fewer
// keys than that it keeps them all. q_resid is the MLA block's q_a_layernorm(q_a_proj x).
#pragma once

#include "models/blocks.h"

namespace moet {

class DsaIndexer {
 public:
  // `prefix` is the attention block's ("model.layers.N.self_attn."): tensors under "indexer.".
  DsaIndexer(const ModelConfig& config, WeightLoader& loader, const std::string& prefix);
  static KvLayerSpec kv_spec(const ModelConfig& config);
  // Writes the step rows' keys into `keys` and their choice into topk (I32 [rows, index_topk],
  // ascending positions, -1 after the last).
  void forward(Backend& b, const Tensor& x, const Tensor& q_resid, const RopeTable& rope, KvLayerCache& keys,
               Tensor& topk) const;
  int64_t topk() const { return topk_; }

 private:
  int64_t heads_, dim_, topk_;
  float scale_;
  Tensor wq_b_, wk_, k_norm_, k_norm_bias_, weights_proj_;
};

}  // namespace moet
