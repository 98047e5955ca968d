// GLM-5's lightning indexer (see dsa_indexer.h).
#include "models/dsa_indexer.h"

#include <cmath>

namespace moet {

DsaIndexer::DsaIndexer(const ModelConfig& c, WeightLoader& loader, const std::string& prefix)
    : heads_(c.index_n_heads), dim_(c.index_head_dim), topk_(c.index_topk),
      scale_(float(1.0 / std::sqrt(double(c.index_head_dim)))) {
  const std::string p = prefix + "indexer.";
  wq_b_ = loader.matmul_weight(p + "wq_b.weight", {heads_ * dim_, c.q_lora_rank});
  wk_ = loader.matmul_weight(p + "wk.weight", {dim_, c.hidden_size});
  k_norm_ = loader.weight_f32(p + "k_norm.weight", {dim_});
  k_norm_bias_ = loader.weight_f32(p + "k_norm.bias", {dim_});
  weights_proj_ = loader.matmul_weight(p + "weights_proj.weight", {heads_, c.hidden_size});
}

KvLayerSpec DsaIndexer::kv_spec(const ModelConfig& config) {
  return KvLayerSpec::latent_row(config.index_head_dim, config.index_head_dim);
}

void DsaIndexer::forward(Backend& b, const Tensor& x, const Tensor& q_resid, const RopeTable& rope, KvLayerCache& keys,
                         Tensor& topk) const {
  const int64_t rows = x.rows();
  Tensor k = b.alloc({rows, dim_});
  b.matmul(x, wk_, nullptr, k);
  b.layernorm(k, k_norm_, k_norm_bias_, 1e-6f, k);
  b.rope(rope, k, 1, dim_, 0);
  b.kv_write(keys, k, nullptr);
  Tensor q = b.alloc({rows, heads_ * dim_});
  b.matmul(q_resid, wq_b_, nullptr, q);
  b.rope(rope, q, heads_, dim_, 0);
  Tensor weights = b.alloc({rows, heads_});
  b.matmul(x, weights_proj_, nullptr, weights);
  b.indexer_topk(keys, q, heads_, weights, scale_, 1, topk);
}

}  // namespace moet
