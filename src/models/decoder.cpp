// The generic decoder stack (see blocks.h).
#include "models/blocks.h"

#include "core/error.h"

namespace moet {

void DecoderModel::load_common(WeightLoader& loader) {
  const int64_t vocab = config_.vocab_size, hidden = config_.hidden_size;
  embed_ = loader.weight("model.embed_tokens.weight", {vocab, hidden});
  final_norm_ = loader.weight_f32("model.norm.weight", {hidden});
  if (config_.tie_word_embeddings && !loader.has("lm_head.weight")) {
    lm_head_ = embed_;
  } else {
    lm_head_ = loader.weight("lm_head.weight", {vocab, hidden});
  }
  layers_.resize(size_t(config_.num_hidden_layers));
  for (int64_t l = 0; l < config_.num_hidden_layers; ++l) {
    const std::string prefix = fmt::format("model.layers.{}.", l);
    layers_[size_t(l)].input_norm = loader.weight_f32(prefix + "input_layernorm.weight", {hidden});
    layers_[size_t(l)].post_attention_norm = loader.weight_f32(prefix + "post_attention_layernorm.weight", {hidden});
  }
}

KvCache DecoderModel::create_kv_cache(int64_t blocks, int64_t block_size) {
  KvCache cache{blocks, block_size, {}};
  for (auto& layer : layers_) cache.layers.push_back(layer.attention->create_cache(backend_, blocks, block_size));
  return cache;
}

int64_t DecoderModel::kv_bytes_per_token() const {
  int64_t floats = 0;
  for (const auto& layer : layers_) floats += layer.attention->kv_floats_per_token();
  return floats * int64_t(sizeof(float));
}

std::vector<float> DecoderModel::forward(const ForwardBatch& batch, KvCache& cache) {
  const int64_t rows = int64_t(batch.tokens.size()), hidden = config_.hidden_size;
  MOET_CHECK(rows > 0 && batch.positions.size() == size_t(rows) && batch.slots.size() == size_t(rows) &&
                 batch.row_seq.size() == size_t(rows),
             "malformed forward batch");
  for (int64_t slot : batch.slots)
    MOET_CHECK(slot >= 0 && slot < cache.blocks * cache.block_size, "KV slot {} outside the cache", slot);
  backend_.begin_step({rows, batch.tokens.data(), batch.positions.data(), batch.row_seq.data(), batch.slots.data(),
                       int64_t(batch.block_tables.size()), batch.block_tables.data(), cache.block_size});
  StepContext ctx{backend_};
  Tensor residual = backend_.alloc({rows, hidden});
  Tensor normed = backend_.alloc({rows, hidden});
  Tensor branch = backend_.alloc({rows, hidden});
  backend_.embedding(embed_, residual);
  for (size_t l = 0; l < layers_.size(); ++l) {
    DecoderLayer& layer = layers_[l];
    backend_.rmsnorm(residual, layer.input_norm, float(config_.rms_norm_eps), normed);
    layer.attention->forward(ctx, normed, cache.layers[l], branch);
    backend_.add(residual, branch);
    backend_.rmsnorm(residual, layer.post_attention_norm, float(config_.rms_norm_eps), normed);
    layer.ffn->forward(backend_, normed, branch);
    backend_.add(residual, branch);
  }
  const int64_t out_rows = int64_t(batch.logit_rows.size());
  Tensor last = backend_.alloc({out_rows, hidden});
  for (int64_t i = 0; i < out_rows; ++i)
    backend_.copy_columns(residual, hidden, int64_t(batch.logit_rows[size_t(i)]) * hidden, last, hidden,
                          i * hidden, 1, hidden);
  Tensor last_normed = backend_.alloc({out_rows, hidden});
  backend_.rmsnorm(last, final_norm_, float(config_.rms_norm_eps), last_normed);
  Tensor logits = backend_.alloc({out_rows, config_.vocab_size});
  backend_.matmul(last_normed, lm_head_, nullptr, logits);
  std::vector<float> host(size_t(logits.numel()));
  backend_.to_host(logits, host.data());
  return host;
}

}  // namespace moet
