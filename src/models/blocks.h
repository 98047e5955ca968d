// Shared building blocks of the MoE decoders: attention (GQA with optional q/k norm, biases and
// partial rope; MLA in the absorbed form over a latent KV cache, optionally with DeepSeek sparse
// attention's indexer: models/dsa_indexer.h; DeepSeek-V4's compressed attention:
// models/compressed_attention.h), feed-forward (dense SiLU MLP; routed experts + optional shared
// experts; hash routing), and the decoder stack that strings them together (embedding -> layers
// [norm, attention, residual, norm, ffn, residual] -> norm -> LM head; with hyper-connections,
// models/hyper_connection.h, the residual is several streams mixed around each block).
// An architecture file (models/arch/, one per family) only chooses blocks and tensor names.
#pragma once

#include "models/model.h"
#include "models/weight_loader.h"

#include <memory>
#include <span>
#include <string>
#include <vector>

namespace moet {

// Everything a block needs during a forward besides its own weights (the step's per-row
// inputs were handed to the backend with begin_step()).
struct StepContext {
  Backend& backend;
  // The keys the last GLM-5 layer that ran its indexer chose (I32 [rows, index_topk]), for the
  // layers that share its choice (indexer_types "shared").
  Tensor dsa_topk;
};

class AttentionBlock {
 public:
  virtual ~AttentionBlock() = default;
  // What the layer keeps per token in the KV cache: one cache or several (a DSA layer's indexer
  // keys, DeepSeek-V4's compressor states and compressed entries), F32 (DecoderModel applies the
  // cache dtype).
  virtual std::vector<KvLayerSpec> kv_specs() const = 0;
  // x: normalised hidden [rows, hidden]; caches: the layer's, as kv_specs() lists them; out:
  // [rows, hidden].
  virtual void forward(StepContext& ctx, const Tensor& x, std::span<KvLayerCache> caches, Tensor& out) = 0;
};

class FfnBlock {
 public:
  virtual ~FfnBlock() = default;
  virtual void forward(Backend& backend, const Tensor& x, Tensor& out) = 0;
};

// What a GQA / MLA layer of `config` keeps per token (F32, no checkpoint scales): the blocks'
// kv_specs() without weights (capacity tables of configs).
KvLayerSpec gqa_kv_spec(const ModelConfig& config);
KvLayerSpec mla_kv_spec(const ModelConfig& config);

// The heads a rank of a tensor-parallel model holds: query heads [first_head, first_head + heads)
// and the KV heads they read, [first_kv_head, first_kv_head + kv_heads). With fewer KV heads than
// ranks each rank holds the one KV head of its query heads (size / KV ranks hold each). Fails with
// a one-line error naming --tensor-parallel-size when the heads cannot be split.
struct GqaHeads {
  int64_t heads = 0, first_head = 0, kv_heads = 0, first_kv_head = 0;
};
GqaHeads gqa_heads(const ModelConfig& config, const ShardSpec& shard);

// GQA attention; `prefix` is "model.layers.N.self_attn.", `layer` N.
std::unique_ptr<AttentionBlock> gqa_attention_load(const ModelConfig& config, WeightLoader& loader,
                                                   const std::string& prefix, int64_t layer);
// MLA; with config.index_topk > 0 (GLM-5) DeepSeek sparse attention: a layer that runs its
// indexer (config.layer_runs_indexer; the MTP layer when it has indexer weights) also keeps the
// indexer's keys (a second cache) and chooses the keys every layer up to the next such layer
// attends to.
std::unique_ptr<AttentionBlock> mla_attention_load(const ModelConfig& config, WeightLoader& loader,
                                                   const std::string& prefix, int64_t layer);
// The caches an MLA layer keeps (with DSA: and its indexer's keys when the layer runs one).
std::vector<KvLayerSpec> mla_layer_kv_specs(const ModelConfig& config, int64_t layer);

// Dense SiLU MLP with gate/up/down names under `prefix` ("model.layers.N.mlp."); names: the
// checkpoint's names of the three projections; swiglu_limit > 0: the SwiGLU clamp. Tensor-parallel
// (loader.shard()): each rank holds a part of the intermediate columns; reduce: the ranks' outputs
// are summed by the block (false: a MoE block's shared experts, summed by the MoE block).
struct MlpNames {
  std::string gate = "gate_proj", up = "up_proj", down = "down_proj";
};
std::unique_ptr<FfnBlock> dense_mlp_load(WeightLoader& loader, const std::string& prefix, int64_t hidden,
                                         int64_t inner, const MlpNames& names = {}, float swiglu_limit = 0.0f,
                                         bool reduce = true);
// The MoE block of `layer`: router `<moe_prefix>gate.weight`, optional correction bias, the routed
// experts (names from config.expert_tensor_names) loaded by `experts` into the pool's layer
// `layer`, where the block reads them at every forward, and shared experts
// (`<moe_prefix>shared_experts.`). A DeepSeek-V4 layer routed by token hash
// (config.layer_hash_routed) reads `<moe_prefix>gate.tid2eid` instead of choosing top-k.
std::unique_ptr<FfnBlock> moe_load(const ModelConfig& config, WeightLoader& loader, int64_t layer,
                                   ExpertLoader& experts, ExpertPool& pool);

struct MtpLayer;
struct HyperConnections;
struct HyperConnection;

// The decoder stack: the same for every family once the blocks are chosen.
struct DecoderLayer {
  DecoderLayer();
  DecoderLayer(DecoderLayer&&) noexcept;
  DecoderLayer& operator=(DecoderLayer&&) noexcept;
  ~DecoderLayer();
  Tensor input_norm, post_attention_norm;
  std::unique_ptr<AttentionBlock> attention;
  std::unique_ptr<FfnBlock> ffn;
  std::unique_ptr<HyperConnections> hyper;  // DeepSeek-V4 (config.hc_mult > 0)
};

class DecoderModel final : public Model {
 public:
  // with_mtp: the expert pool has a layer more, for the MTP layer's experts (set_mtp()).
  DecoderModel(ModelConfig config, Backend& backend, bool with_mtp = false);
  ~DecoderModel() override;
  // Reads embedding, final norm and LM head (tied or not), and the per-layer norms.
  void load_common(WeightLoader& loader);
  std::vector<DecoderLayer>& layers() { return layers_; }
  const Tensor& embedding() const { return embed_; }
  const Tensor& lm_head() const { return lm_head_; }
  void set_mtp(std::unique_ptr<MtpLayer> mtp);
  // Records each layer's KV specs (F32; the MTP layer's last) once every attention block is loaded.
  void finish_load();

  const ModelConfig& config() const override { return config_; }
  Backend& backend() override { return backend_; }
  const std::vector<KvLayerSpec>& kv_layer_specs() const override { return kv_specs_; }
  void set_kv_cache_dtype(KvDtype dtype) override;
  ExpertPool& experts() override { return experts_; }
  bool has_mtp() const override { return mtp_ != nullptr; }
  StepOutput forward(const ForwardBatch& batch, KvCache& cache) override;

 private:
  // The ops of one forward after begin_step(): embedding, layers, final norm, the logit rows'
  // LM head (and their best top_k logits) and the hidden rows' copies, all into one output tensor
  // (backend memory, one copy to the host) laid out as output_layout() says.
  Tensor forward_body(const ForwardBatch& batch, KvCache& cache);
  // The same for a draft step: the MTP layer over `hidden` (the step's h_i rows, staged on the
  // backend before the body so that a captured draft step reads them in place), its norm and head.
  Tensor mtp_body(const ForwardBatch& batch, KvCache& cache, const Tensor& hidden);
  // A draft step's hidden rows in mtp_input_ (grown, never shrunk: its address is part of a draft
  // step's graph key); the view of them.
  Tensor stage_mtp_hidden(const std::vector<float>& hidden);
  // Fills the output tensor of a step whose rows, after their last norm, are `normed`: the logit
  // rows through `head` (whole or their best top_k), then the hidden rows.
  void write_outputs(const ForwardBatch& batch, const Tensor& normed, const Tensor& head, Tensor& packed);
  // The caches of layer l (the MTP layer: l = num_hidden_layers) in `cache`.
  std::span<KvLayerCache> layer_caches(KvCache& cache, size_t l) const;
  // The layers with hyper-connections into `normed` (the final norm's output): DeepSeek-V4.
  void forward_hyper(StepContext& ctx, KvCache& cache, Tensor& normed);
  // The step's token embeddings into `out` (a vocab-parallel rank: its rows, then all-reduced).
  void embed(Tensor& out);
  // logits [rows, vocab] = normed @ head^T (a vocab-parallel rank: its columns, then gathered).
  void head_logits(const Tensor& normed, const Tensor& head, Tensor& logits);

  ModelConfig config_;
  Backend& backend_;
  Tensor embed_, final_norm_, lm_head_;
  std::vector<DecoderLayer> layers_;
  std::unique_ptr<HyperConnection> hyper_head_;  // DeepSeek-V4's final collapse of the streams
  std::vector<KvLayerSpec> kv_specs_;
  std::vector<size_t> cache_offset_;  // per layer (MTP last), its first cache in kv_specs_
  ExpertPool experts_;
  std::unique_ptr<MtpLayer> mtp_;
  Tensor mtp_input_;  // draft steps' hidden rows (stage_mtp_hidden())
  ShardSpec shard_;  // this rank of a parallel model (load_common() takes the loader's)
};

}  // namespace moet
