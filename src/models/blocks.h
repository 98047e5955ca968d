// Shared building blocks of the MoE decoders: attention (GQA with optional q/k norm, biases and
// partial rope; MLA in the absorbed form over a latent KV cache), feed-forward (dense SiLU MLP;
// routed experts + optional shared experts), and the decoder stack that strings them together
// (embedding -> layers [norm, attention, residual, norm, ffn, residual] -> norm -> LM head).
// An architecture file (models/arch/, one per family) only chooses blocks and tensor names.
#pragma once

#include "models/model.h"
#include "models/weight_loader.h"

#include <memory>
#include <string>

namespace moet {

// Everything a block needs during a forward besides its own weights (the step's per-row
// inputs were handed to the backend with begin_step()).
struct StepContext {
  Backend& backend;
};

class AttentionBlock {
 public:
  virtual ~AttentionBlock() = default;
  // What the layer keeps per token in the KV cache (F32; DecoderModel applies the cache dtype).
  virtual KvLayerSpec kv_spec() const = 0;
  // x: normalised hidden [rows, hidden]; out: [rows, hidden].
  virtual void forward(StepContext& ctx, const Tensor& x, KvLayerCache& cache, Tensor& out) = 0;
};

class FfnBlock {
 public:
  virtual ~FfnBlock() = default;
  virtual void forward(Backend& backend, const Tensor& x, Tensor& out) = 0;
};

// What a GQA / MLA layer of `config` keeps per token (F32, no checkpoint scales): the blocks'
// kv_spec() without weights (capacity tables of configs).
KvLayerSpec gqa_kv_spec(const ModelConfig& config);
KvLayerSpec mla_kv_spec(const ModelConfig& config);

// GQA attention; `prefix` is "model.layers.N.self_attn.".
std::unique_ptr<AttentionBlock> gqa_attention_load(const ModelConfig& config, WeightLoader& loader,
                                                   const std::string& prefix);
std::unique_ptr<AttentionBlock> mla_attention_load(const ModelConfig& config, WeightLoader& loader,
                                                   const std::string& prefix);

// Dense SiLU MLP with gate/up/down names under `prefix` ("model.layers.N.mlp.").
std::unique_ptr<FfnBlock> dense_mlp_load(WeightLoader& loader, const std::string& prefix,
                                         int64_t hidden, int64_t inner);
// The MoE block of `layer`: router `<moe_prefix>gate.weight`, optional correction bias, the routed
// experts (names from config.expert_tensor_names) loaded by `experts` into the pool's layer
// `layer`, where the block reads them at every forward, and shared experts
// (`<moe_prefix>shared_experts.`).
std::unique_ptr<FfnBlock> moe_load(const ModelConfig& config, WeightLoader& loader, int64_t layer,
                                   ExpertLoader& experts, ExpertPool& pool);

struct MtpLayer;

// The decoder stack: the same for every family once the blocks are chosen.
struct DecoderLayer {
  Tensor input_norm, post_attention_norm;
  std::unique_ptr<AttentionBlock> attention;
  std::unique_ptr<FfnBlock> ffn;
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
  // Records each layer's KV spec (F32; the MTP layer's last) once every attention block is loaded.
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
  // The same for a draft step: the MTP layer, its norm and head.
  Tensor mtp_body(const ForwardBatch& batch, KvCache& cache);
  // Fills the output tensor of a step whose rows, after their last norm, are `normed`: the logit
  // rows through `head` (whole or their best top_k), then the hidden rows.
  void write_outputs(const ForwardBatch& batch, const Tensor& normed, const Tensor& head, Tensor& packed);

  ModelConfig config_;
  Backend& backend_;
  Tensor embed_, final_norm_, lm_head_;
  std::vector<DecoderLayer> layers_;
  std::vector<KvLayerSpec> kv_specs_;
  ExpertPool experts_;
  std::unique_ptr<MtpLayer> mtp_;
};

}  // namespace moet
