// The generic decoder stack (see blocks.h).
#include "models/blocks.h"

#include "core/error.h"

#include <algorithm>
#include <atomic>
#include <cstring>

namespace moet {

namespace {
std::atomic<int64_t> next_model_id{1};
}  // namespace

DecoderModel::DecoderModel(ModelConfig config, Backend& backend)
    : config_(std::move(config)), backend_(backend), id_(next_model_id++) {}

void DecoderModel::load_common(WeightLoader& loader) {
  const int64_t vocab = config_.vocab_size, hidden = config_.hidden_size;
  // The embedding (and an LM head, which may be the same tensor) stays BF16/F32: FP8 ones decode.
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

namespace {

// The best k logits of each row in one tensor, so that they reach the host in one copy: I32
// [2, rows, k], the values' bits then the ids.
struct PackedTop {
  Tensor packed, values, ids;
};

PackedTop top_logits_packed(Backend& backend, int64_t rows, int64_t k) {
  PackedTop t;
  t.packed = backend.alloc({2, rows, k}, DType::i32);
  t.values = Tensor{DType::f32, {rows, k}, t.packed.storage, t.packed.data};
  t.ids = Tensor{DType::i32, {rows, k}, t.packed.storage, t.packed.as<int32_t>() + rows * k};
  return t;
}

}  // namespace

Tensor DecoderModel::run(const ForwardBatch& batch, KvCache& cache, int64_t top_k) {
  const int64_t rows = int64_t(batch.tokens.size());
  MOET_CHECK(rows > 0 && batch.positions.size() == size_t(rows) && batch.slots.size() == size_t(rows) &&
                 batch.row_seq.size() == size_t(rows),
             "malformed forward batch");
  for (int64_t slot : batch.slots)
    MOET_CHECK(slot >= 0 && slot < cache.blocks * cache.block_size, "KV slot {} outside the cache", slot);
  backend_.begin_step({rows, batch.tokens.data(), batch.positions.data(), batch.row_seq.data(), batch.slots.data(),
                       int64_t(batch.block_tables.size()), batch.block_tables.data(), cache.block_size,
                       config_.vocab_size});
  const auto body = [&] {
    Tensor logits = forward_body(batch, cache);
    if (top_k == 0) return logits;
    PackedTop top = top_logits_packed(backend_, logits.dim(0), top_k);
    backend_.top_logits(logits, top_k, top.values, top.ids);
    return top.packed;
  };
  if (!batch.decode) return body();
  // Everything body() bakes into its launches besides the step inputs: this model, the KV cache's
  // memory, the logit rows and the top-k width (the backend adds rows, sequences and table stride).
  GraphKey key;
  key.values = {id_, top_k, int64_t(batch.logit_rows.size())};
  key.values.insert(key.values.end(), batch.logit_rows.begin(), batch.logit_rows.end());
  for (const KvLayerCache& layer : cache.layers) {
    key.values.push_back(int64_t(reinterpret_cast<intptr_t>(layer.k.data)));
    key.values.push_back(int64_t(reinterpret_cast<intptr_t>(layer.v.data)));
  }
  return backend_.run_graph(key, body);
}

std::vector<float> DecoderModel::forward(const ForwardBatch& batch, KvCache& cache) {
  const Tensor logits = run(batch, cache, 0);
  std::vector<float> host(size_t(logits.numel()));
  backend_.to_host(logits, host.data());
  return host;
}

TopLogits DecoderModel::forward_top(const ForwardBatch& batch, KvCache& cache, int64_t k) {
  MOET_CHECK(k >= 1 && k <= std::min(config_.vocab_size, kMaxTopLogits),
             "forward_top: k must be in [1, {}] (got {})", std::min(config_.vocab_size, kMaxTopLogits), k);
  const Tensor packed = run(batch, cache, k);
  const size_t n = size_t(packed.numel() / 2);
  std::vector<int32_t> host(2 * n);
  backend_.to_host(packed, host.data());
  TopLogits top{k, std::vector<float>(n), std::vector<int32_t>(host.begin() + ptrdiff_t(n), host.end())};
  std::memcpy(top.values.data(), host.data(), n * sizeof(float));
  return top;
}

// Replay-safe (docs/design.md, "CUDA graphs"): every launch depends only on the batch's shape and
// logit rows, and the per-row inputs are read from the backend's step buffer.
Tensor DecoderModel::forward_body(const ForwardBatch& batch, KvCache& cache) {
  const int64_t rows = int64_t(batch.tokens.size()), hidden = config_.hidden_size;
  StepContext ctx{backend_};
  Tensor residual = backend_.alloc({rows, hidden});
  Tensor normed = backend_.alloc({rows, hidden});
  Tensor branch = backend_.alloc({rows, hidden});
  const float eps = float(config_.rms_norm_eps);
  // Each block's output joins the residual stream in one op with the norm that follows it.
  backend_.embedding(embed_, residual);
  backend_.rmsnorm(residual, layers_.front().input_norm, eps, normed);
  for (size_t l = 0; l < layers_.size(); ++l) {
    DecoderLayer& layer = layers_[l];
    layer.attention->forward(ctx, normed, cache.layers[l], branch);
    backend_.add_rmsnorm(residual, branch, layer.post_attention_norm, eps, normed);
    layer.ffn->forward(backend_, normed, branch);
    if (l + 1 < layers_.size()) backend_.add_rmsnorm(residual, branch, layers_[l + 1].input_norm, eps, normed);
  }
  const int64_t out_rows = int64_t(batch.logit_rows.size());
  if (out_rows == 0) return backend_.alloc({0, config_.vocab_size});  // a prefill chunk that samples nothing
  bool all_rows = out_rows == rows;  // logits of every row in order (decode): no gather needed
  for (int64_t i = 0; all_rows && i < out_rows; ++i) all_rows = batch.logit_rows[size_t(i)] == i;
  backend_.add_rmsnorm(residual, branch, final_norm_, eps, normed);  // row-wise: gathering after is exact
  Tensor last_normed = all_rows ? normed : backend_.alloc({out_rows, hidden});
  for (int64_t i = 0; !all_rows && i < out_rows; ++i)
    backend_.copy_columns(normed, hidden, int64_t(batch.logit_rows[size_t(i)]) * hidden, last_normed, hidden,
                          i * hidden, 1, hidden);
  Tensor logits = backend_.alloc({out_rows, config_.vocab_size});
  backend_.matmul(last_normed, lm_head_, nullptr, logits);
  return logits;
}

}  // namespace moet
