// The MTP layer (see mtp.h).
#include "models/mtp.h"

#include "core/error.h"

#include <cstring>

namespace moet {
namespace {

std::string mtp_prefix(const ModelConfig& config) { return config.layer_name(config.num_hidden_layers); }

// The MTP layer's copy `name` of one of the model's tensors (`own`, checkpoint name `own_name`):
// the model's tensor when the copy is absent, invented (random weights) or byte-identical.
Tensor shared_copy(WeightLoader& loader, const std::string& name, const std::string& own_name, const Tensor& own,
                   const std::vector<int64_t>& shape) {
  if (loader.checkpoint() == nullptr || !loader.has(name)) return own;
  const HostTensor& copy = loader.info(name, shape);
  const HostTensor& original = loader.info(own_name, shape);
  const bool identical = copy.dtype == original.dtype && copy.bytes == original.bytes &&
                         std::memcmp(copy.data, original.data, copy.bytes) == 0;
  return identical ? own : loader.weight(name, shape);
}

}  // namespace

void mtp_require(const ModelConfig& config, const WeightLoader& loader) {
  const std::string name = mtp_prefix(config) + "eh_proj.weight";
  MOET_CHECK(config.num_nextn_predict_layers > 0 && loader.has(name),
             "--speculative-config method mtp: {} has no MTP layer (config.json num_nextn_predict_layers {}, tensor "
             "'{}' {}); use method ngram",
             loader.checkpoint() ? loader.checkpoint()->dir().string() : std::string("the model"),
             config.num_nextn_predict_layers, name, loader.has(name) ? "present" : "absent");
}

std::unique_ptr<MtpLayer> mtp_layer_load(const ModelConfig& config, WeightLoader& loader, DecoderLayer layer,
                                         const Tensor& embed, const Tensor& head) {
  const std::string p = mtp_prefix(config);
  const int64_t hidden = config.hidden_size, vocab = config.vocab_size;
  auto mtp = std::make_unique<MtpLayer>();
  mtp->enorm = loader.weight_f32(p + "enorm.weight", {hidden});
  mtp->hnorm = loader.weight_f32(p + "hnorm.weight", {hidden});
  mtp->eh_proj = loader.matmul_weight(p + "eh_proj.weight", {hidden, 2 * hidden});
  mtp->head_norm = loader.weight_f32(p + "shared_head.norm.weight", {hidden});
  mtp->embed = shared_copy(loader, p + "embed_tokens.weight", config.embed_name, embed, {vocab, hidden});
  const std::string head_name = config.tie_word_embeddings && !loader.has(config.lm_head_name)
                                    ? config.embed_name : config.lm_head_name;
  mtp->head = shared_copy(loader, p + "shared_head.head.weight", head_name, head, {vocab, hidden});
  layer.input_norm = loader.weight_f32(p + config.input_norm + ".weight", {hidden});
  layer.post_attention_norm = loader.weight_f32(p + config.post_attention_norm + ".weight", {hidden});
  mtp->layer = std::move(layer);
  return mtp;
}

void MtpLayer::forward(StepContext& ctx, const Tensor& hidden, std::span<KvLayerCache> caches, float eps,
                       Tensor& residual, Tensor& normed, Tensor& branch) {
  Backend& b = ctx.backend;
  const int64_t rows = residual.rows(), width = residual.cols();
  MOET_CHECK(hidden.rows() == rows && hidden.cols() == width, "MTP step: hidden [{}, {}] for {} rows of {}",
             hidden.rows(), hidden.cols(), rows, width);
  Tensor h = b.alloc({rows, width});
  b.rmsnorm(hidden, hnorm, eps, h);
  Tensor e = b.alloc({rows, width});
  b.embedding(embed, 0, e);
  b.rmsnorm(e, enorm, eps, e);
  Tensor both = b.alloc({rows, 2 * width});
  b.copy_columns(e, width, 0, both, 2 * width, 0, rows, width);
  b.copy_columns(h, width, 0, both, 2 * width, width, rows, width);
  b.matmul(both, eh_proj, nullptr, residual);
  b.rmsnorm(residual, layer.input_norm, eps, normed);
  layer.attention->forward(ctx, normed, caches, branch);
  b.add_rmsnorm(residual, branch, layer.post_attention_norm, eps, normed);
  layer.ffn->forward(b, normed, branch);
  b.add_rmsnorm(residual, branch, head_norm, eps, normed);
}

}  // namespace moet
