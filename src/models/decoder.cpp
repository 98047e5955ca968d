// The generic decoder stack (see blocks.h). A rank of a tensor-parallel model (docs/parallel.md)
// holds its part of the vocabulary: its embedding rows (other tokens look up zeros; one all-reduce
// assembles the lookup exactly) and its LM-head rows (each rank's logit columns, gathered).
#include "models/arch/arch.h"
#include "models/blocks.h"
#include "models/hyper_connection.h"
#include "models/mtp.h"

#include "core/error.h"

#include <algorithm>
#include <cstring>

namespace moet {

DecoderModel::DecoderModel(ModelConfig config, Backend& backend, bool with_mtp)
    : config_(std::move(config)),
      backend_(backend),
      experts_(backend, config_.num_hidden_layers + (with_mtp ? 1 : 0), config_.n_routed_experts) {}

DecoderModel::~DecoderModel() = default;

DecoderLayer::DecoderLayer() = default;
DecoderLayer::DecoderLayer(DecoderLayer&&) noexcept = default;
DecoderLayer& DecoderLayer::operator=(DecoderLayer&&) noexcept = default;
DecoderLayer::~DecoderLayer() = default;

void DecoderModel::set_mtp(std::unique_ptr<MtpLayer> mtp) {
  MOET_CHECK(experts_.layers() == config_.num_hidden_layers + 1, "the model was not built with room for an MTP layer");
  mtp_ = std::move(mtp);
}

void DecoderModel::load_common(WeightLoader& loader) {
  const int64_t vocab = config_.vocab_size, hidden = config_.hidden_size;
  shard_ = loader.shard();
  MOET_CHECK(shard_.end(vocab) > shard_.begin(vocab), "--tensor-parallel-size {} exceeds the vocabulary of {}",
             shard_.size, vocab);
  const WeightPart rows = WeightPart::rows(shard_.begin(vocab), shard_.end(vocab));
  // The embedding (and an LM head, which may be the same tensor) stays BF16/F32: FP8 ones decode.
  embed_ = loader.weight(config_.embed_name, {vocab, hidden}, rows);
  final_norm_ = loader.weight_f32(config_.final_norm_name, {hidden});
  if (config_.tie_word_embeddings && !loader.has(config_.lm_head_name)) {
    lm_head_ = embed_;
  } else {
    lm_head_ = loader.weight(config_.lm_head_name, {vocab, hidden}, rows);
  }
  layers_.resize(size_t(config_.num_hidden_layers));
  for (int64_t l = 0; l < config_.num_hidden_layers; ++l) {
    const std::string prefix = config_.layer_name(l);
    layers_[size_t(l)].input_norm = loader.weight_f32(prefix + config_.input_norm + ".weight", {hidden});
    layers_[size_t(l)].post_attention_norm =
        loader.weight_f32(prefix + config_.post_attention_norm + ".weight", {hidden});
    if (config_.hc_mult > 0) layers_[size_t(l)].hyper = hyper_layer_load(config_, loader, l);
  }
  if (config_.hc_mult > 0) hyper_head_ = hyper_head_load(config_, loader);
}

std::vector<KvLayerSpec> kv_layer_specs_for(const ModelConfig& config, KvDtype dtype) {
  const ArchSpec& arch = arch_for_family(config.family);
  std::vector<KvLayerSpec> specs;
  for (int64_t l = 0; l < config.num_hidden_layers; ++l) {
    const std::vector<KvLayerSpec> layer =
        arch.layer_kv_specs ? arch.layer_kv_specs(config, l)
                            : std::vector<KvLayerSpec>{config.mla ? mla_kv_spec(config) : gqa_kv_spec(config)};
    for (const KvLayerSpec& spec : layer) specs.push_back(kv_layer_spec_with_dtype(spec, dtype));
  }
  return specs;
}

void DecoderModel::finish_load() { set_kv_cache_dtype(KvDtype::f32); }

void DecoderModel::set_kv_cache_dtype(KvDtype dtype) {
  std::vector<KvLayerSpec> specs;
  std::vector<size_t> offsets;
  const auto add = [&](const AttentionBlock& attention) {
    offsets.push_back(specs.size());
    for (const KvLayerSpec& spec : attention.kv_specs()) specs.push_back(kv_layer_spec_with_dtype(spec, dtype));
  };
  for (const DecoderLayer& layer : layers_) add(*layer.attention);
  if (mtp_) add(*mtp_->layer.attention);
  kv_specs_ = std::move(specs);
  cache_offset_ = std::move(offsets);
}

std::span<KvLayerCache> DecoderModel::layer_caches(KvCache& cache, size_t l) const {
  const size_t begin = cache_offset_[l], end = l + 1 < cache_offset_.size() ? cache_offset_[l + 1] : kv_specs_.size();
  MOET_CHECK(cache.layers.size() == kv_specs_.size(), "forward: a KV cache of {} layer caches for a model of {}",
             cache.layers.size(), kv_specs_.size());
  return std::span<KvLayerCache>(cache.layers).subspan(begin, end - begin);
}

namespace {

// Where a forward's results sit in its one output tensor (4-byte elements): the logit rows'
// logits [rows, vocab] as F32, or their best k as values [rows, k] (F32) then ids [rows, k] (I32);
// then the hidden rows [hidden_rows, hidden] as F32; then the confidence rows [rows, 2] as F32.
struct OutputLayout {
  int64_t logit_elements = 0, hidden_elements = 0, confidence_elements = 0;
  int64_t total() const { return logit_elements + hidden_elements + confidence_elements; }
};

OutputLayout output_layout(const ForwardBatch& batch, int64_t vocab, int64_t hidden) {
  const int64_t rows = int64_t(batch.logit_rows.size());
  return {batch.top_k > 0 ? 2 * rows * batch.top_k : rows * vocab, int64_t(batch.hidden_rows.size()) * hidden,
          2 * int64_t(batch.confidence_rows.size())};
}

// The output tensor of a forward (at least one element, so that a step without outputs has one).
Tensor output_tensor(Backend& backend, const ForwardBatch& batch, int64_t vocab, int64_t hidden) {
  return backend.alloc({std::max<int64_t>(1, output_layout(batch, vocab, hidden).total())}, DType::i32);
}

// A view of `count` 4-byte elements of `packed` from element `offset`, shaped `shape`.
Tensor output_view(const Tensor& packed, int64_t offset, DType dtype, std::vector<int64_t> shape) {
  return Tensor{dtype, std::move(shape), packed.storage, static_cast<uint8_t*>(packed.data) + offset * 4};
}

}  // namespace

StepOutput DecoderModel::forward(const ForwardBatch& batch, KvCache& cache) {
  const int64_t rows = int64_t(batch.tokens.size()), vocab = config_.vocab_size;
  MOET_CHECK(rows > 0 && batch.positions.size() == size_t(rows) && batch.slots.size() == size_t(rows) &&
                 batch.row_seq.size() == size_t(rows),
             "malformed forward batch");
  MOET_CHECK(batch.top_k == 0 || (batch.top_k >= 1 && batch.top_k <= std::min(vocab, kMaxTopLogits)),
             "forward: top_k must be in [1, {}] (got {})", std::min(vocab, kMaxTopLogits), batch.top_k);
  for (const auto* list : {&batch.logit_rows, &batch.hidden_rows})
    for (int32_t r : *list) MOET_CHECK(r >= 0 && r < rows, "forward: row {} outside the batch of {}", r, rows);
  for (int32_t r : batch.confidence_rows)
    MOET_CHECK(r >= 0 && size_t(r) < batch.logit_rows.size(), "forward: confidence of logit row {} of {}", r,
               batch.logit_rows.size());
  for (int64_t slot : batch.slots)
    MOET_CHECK(slot >= 0 && slot < cache.blocks * cache.block_size, "KV slot {} outside the cache", slot);
  backend_.begin_step({rows, batch.tokens.data(), batch.positions.data(), batch.row_seq.data(), batch.slots.data(),
                       int64_t(batch.block_tables.size()), batch.block_tables.data(), cache.block_size, vocab,
                       batch.row_invariant});
  MOET_CHECK(!batch.mtp_hidden || mtp_, "forward: a draft step on a model loaded without its MTP layer");
  // A draft step's hidden rows are staged outside the graph; where they sit is part of its key.
  GraphKey key = batch.graph ? *batch.graph : GraphKey{};
  Tensor hidden;
  if (batch.mtp_hidden) {
    hidden = stage_mtp_hidden(*batch.mtp_hidden);
    key.values.push_back(int64_t(reinterpret_cast<intptr_t>(mtp_input_.data)));
  }
  const auto body = [&] { return batch.mtp_hidden ? mtp_body(batch, cache, hidden) : forward_body(batch, cache); };
  const Tensor packed = batch.graph ? backend_.run_graph(key, body) : body();
  const OutputLayout layout = output_layout(batch, vocab, config_.hidden_size);
  // One copy to the host, straight into the vector the logits are returned in (at a large
  // vocabulary and batch these are megabytes: no second pass over them).
  std::vector<float> host(size_t(packed.numel()));
  backend_.to_host(packed, host.data());  // also waits for the step (a step is done when forward returns)
  StepOutput out;
  const auto from = host.begin() + layout.logit_elements;
  out.hidden.assign(from, from + layout.hidden_elements);
  out.confidence.assign(from + layout.hidden_elements, from + layout.hidden_elements + layout.confidence_elements);
  if (batch.top_k > 0) {
    const size_t n = size_t(layout.logit_elements / 2);
    out.top = {batch.top_k, std::vector<float>(host.begin(), host.begin() + ptrdiff_t(n)), std::vector<int32_t>(n)};
    if (n > 0) std::memcpy(out.top.ids.data(), host.data() + n, n * sizeof(int32_t));
  } else {
    host.resize(size_t(layout.logit_elements));
    out.logits = std::move(host);
  }
  return out;
}

// Replay-safe (docs/design.md, "CUDA graphs"): every launch depends only on the batch's shape,
// its logit and hidden rows and top_k, and the per-row inputs are read from the step buffer.
Tensor DecoderModel::forward_body(const ForwardBatch& batch, KvCache& cache) {
  const int64_t rows = int64_t(batch.tokens.size()), hidden = config_.hidden_size, vocab = config_.vocab_size;
  StepContext ctx{backend_, {}};
  Tensor normed = backend_.alloc({rows, hidden});
  experts_.begin_forward();
  if (hyper_head_) {
    forward_hyper(ctx, cache, normed);
    Tensor packed = output_tensor(backend_, batch, vocab, hidden);
    write_outputs(batch, normed, lm_head_, packed);
    return packed;
  }
  Tensor residual = backend_.alloc({rows, hidden});
  Tensor branch = backend_.alloc({rows, hidden});
  const float eps = float(config_.rms_norm_eps);
  // Each block's output joins the residual stream in one op with the norm that follows it.
  embed(residual);
  backend_.rmsnorm(residual, layers_.front().input_norm, eps, normed);
  for (size_t l = 0; l < layers_.size(); ++l) {
    DecoderLayer& layer = layers_[l];
    layer.attention->forward(ctx, normed, layer_caches(cache, l), branch);
    backend_.add_rmsnorm(residual, branch, layer.post_attention_norm, eps, normed);
    layer.ffn->forward(backend_, normed, branch);
    if (l + 1 < layers_.size()) backend_.add_rmsnorm(residual, branch, layers_[l + 1].input_norm, eps, normed);
  }
  Tensor packed = output_tensor(backend_, batch, vocab, hidden);
  if (batch.logit_rows.empty() && batch.hidden_rows.empty()) return packed;  // a prefill chunk that samples nothing
  backend_.add_rmsnorm(residual, branch, final_norm_, eps, normed);  // row-wise: gathering after is exact
  write_outputs(batch, normed, lm_head_, packed);
  return packed;
}

// The residual is hc streams: each block reads their mix (hc_pre) and is mixed back in (hc_post);
// at the end the streams collapse (hc_head) before the final norm.
void DecoderModel::forward_hyper(StepContext& ctx, KvCache& cache, Tensor& normed) {
  Backend& b = backend_;
  const int64_t rows = normed.rows(), hidden = config_.hidden_size, hc = config_.hc_mult;
  const float eps = float(config_.rms_norm_eps);
  Tensor streams = b.alloc({rows, hc, hidden});
  Tensor collapsed = b.alloc({rows, hidden}), branch = b.alloc({rows, hidden});
  Tensor post = b.alloc({rows, hc}), comb = b.alloc({rows, hc, hc});
  embed(collapsed);
  for (int64_t i = 0; i < hc; ++i) b.copy_columns(collapsed, hidden, 0, streams, hc * hidden, i * hidden, rows, hidden);
  const auto block = [&](const HyperConnection& hyper, const Tensor& norm, const auto& run) {
    const HyperConnectionWeights w = hyper.weights(config_);
    b.hc_pre(w, streams, post, comb, collapsed);
    b.rmsnorm(collapsed, norm, eps, normed);
    run();
    b.hc_post(w, streams, branch, post, comb);
  };
  for (size_t l = 0; l < layers_.size(); ++l) {
    DecoderLayer& layer = layers_[l];
    block(layer.hyper->attention, layer.input_norm,
          [&] { layer.attention->forward(ctx, normed, layer_caches(cache, l), branch); });
    block(layer.hyper->ffn, layer.post_attention_norm, [&] { layer.ffn->forward(b, normed, branch); });
  }
  b.hc_head(hyper_head_->weights(config_), streams, collapsed);
  b.rmsnorm(collapsed, final_norm_, eps, normed);
}

// A draft step (mtp.h): the MTP layer's output after its norm goes through its head.
Tensor DecoderModel::stage_mtp_hidden(const std::vector<float>& hidden) {
  const int64_t width = config_.hidden_size, rows = int64_t(hidden.size()) / width;
  MOET_CHECK(rows > 0 && int64_t(hidden.size()) == rows * width, "draft step: {} hidden values are not rows of {}",
             hidden.size(), width);
  if (mtp_input_.numel() < int64_t(hidden.size())) mtp_input_ = backend_.alloc({int64_t(hidden.size())});
  Tensor rows_view = mtp_input_;
  rows_view.shape = {rows, width};
  backend_.from_host(hidden.data(), rows_view);
  return rows_view;
}

Tensor DecoderModel::mtp_body(const ForwardBatch& batch, KvCache& cache, const Tensor& hidden_rows) {
  const int64_t rows = int64_t(batch.tokens.size()), hidden = config_.hidden_size;
  StepContext ctx{backend_, {}};
  Tensor residual = backend_.alloc({rows, hidden});
  Tensor normed = backend_.alloc({rows, hidden});
  Tensor branch = backend_.alloc({rows, hidden});
  experts_.begin_forward();
  mtp_->forward(ctx, hidden_rows, layer_caches(cache, layers_.size()), float(config_.rms_norm_eps), residual, normed,
                branch);
  Tensor packed = output_tensor(backend_, batch, config_.vocab_size, hidden);
  write_outputs(batch, normed, mtp_->head, packed);
  return packed;
}

void DecoderModel::embed(Tensor& out) {
  backend_.embedding(embed_, shard_.begin(config_.vocab_size), out);
  if (shard_.comm) shard_.comm->all_reduce(out);
}

void DecoderModel::head_logits(const Tensor& normed, const Tensor& head, Tensor& logits) {
  if (!shard_.comm) return backend_.matmul(normed, head, nullptr, logits);
  // Each rank's columns into a part of ceil(vocab / N) columns (equal parts for the gather), then
  // every part into its place in the rows.
  const int64_t rows = normed.rows(), vocab = config_.vocab_size, n = shard_.size, part = (vocab + n - 1) / n;
  const int64_t width = head.dim(0);
  Tensor mine = backend_.alloc({rows, part});
  if (width == part) {
    backend_.matmul(normed, head, nullptr, mine);
  } else {
    Tensor own = backend_.alloc({rows, width});
    backend_.matmul(normed, head, nullptr, own);
    backend_.copy_columns(own, width, 0, mine, part, 0, rows, width);
  }
  Tensor all = backend_.alloc({n * rows, part});
  shard_.comm->all_gather(mine, all);
  for (int64_t r = 0; r < n; ++r) {
    const int64_t begin = vocab * r / n, end = vocab * (r + 1) / n;
    backend_.copy_columns(all, part, r * rows * part, logits, vocab, begin, rows, end - begin);
  }
}

void DecoderModel::write_outputs(const ForwardBatch& batch, const Tensor& normed, const Tensor& head, Tensor& packed) {
  const int64_t rows = int64_t(batch.tokens.size()), hidden = config_.hidden_size, vocab = config_.vocab_size;
  const OutputLayout layout = output_layout(batch, vocab, hidden);
  const int64_t out_rows = int64_t(batch.logit_rows.size()), hidden_rows = int64_t(batch.hidden_rows.size());
  // The rows of `normed` a list names, gathered (all rows in order: `normed` itself).
  const auto gathered = [&](const std::vector<int32_t>& list, Tensor into) {
    bool all_rows = int64_t(list.size()) == rows;
    for (int64_t i = 0; all_rows && i < rows; ++i) all_rows = list[size_t(i)] == i;
    if (all_rows && into.empty()) return normed;
    if (into.empty()) into = backend_.alloc({int64_t(list.size()), hidden});
    for (size_t i = 0; i < list.size(); ++i)
      backend_.copy_columns(normed, hidden, int64_t(list[i]) * hidden, into, hidden, int64_t(i) * hidden, 1, hidden);
    return into;
  };
  if (hidden_rows > 0)
    gathered(batch.hidden_rows, output_view(packed, layout.logit_elements, DType::f32, {hidden_rows, hidden}));
  if (out_rows == 0) return;
  const Tensor last_normed = gathered(batch.logit_rows, {});
  Tensor logits = batch.top_k == 0 ? output_view(packed, 0, DType::f32, {out_rows, vocab})
                                   : backend_.alloc({out_rows, vocab});
  head_logits(last_normed, head, logits);
  if (batch.top_k > 0) {
    Tensor values = output_view(packed, 0, DType::f32, {out_rows, batch.top_k});
    Tensor ids = output_view(packed, out_rows * batch.top_k, DType::i32, {out_rows, batch.top_k});
    backend_.top_logits(logits, batch.top_k, values, ids);
  }
  if (!batch.confidence_rows.empty()) {
    Tensor confidence = backend_.alloc({out_rows, 2});
    backend_.logit_confidence(logits, confidence);
    Tensor rows_out = output_view(packed, layout.logit_elements + layout.hidden_elements, DType::f32,
                                  {int64_t(batch.confidence_rows.size()), 2});
    for (size_t i = 0; i < batch.confidence_rows.size(); ++i)
      backend_.copy_columns(confidence, 2, int64_t(batch.confidence_rows[i]) * 2, rows_out, 2, int64_t(i) * 2, 1, 2);
  }
}

}  // namespace moet
