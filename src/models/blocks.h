// Shared building blocks of the MoE decoders: attention (GQA with optional q/k norm, biases and
// partial rope; MLA in the absorbed form over a latent KV cache), feed-forward (dense SiLU MLP;
// routed experts + optional shared experts), and the decoder stack that strings them together
// (embedding -> layers [norm, attention, residual, norm, ffn, residual] -> norm -> LM head).
// An architecture file (one per family) only chooses blocks and tensor names.
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
  virtual KvLayerCache create_cache(Backend& backend, int64_t blocks, int64_t block_size) const = 0;
  virtual int64_t kv_floats_per_token() const = 0;
  // x: normalised hidden [rows, hidden]; out: [rows, hidden].
  virtual void forward(StepContext& ctx, const Tensor& x, KvLayerCache& cache, Tensor& out) = 0;
};

class FfnBlock {
 public:
  virtual ~FfnBlock() = default;
  virtual void forward(Backend& backend, const Tensor& x, Tensor& out) = 0;
};

// GQA attention; `prefix` is "model.layers.N.self_attn.".
std::unique_ptr<AttentionBlock> gqa_attention_load(const ModelConfig& config, WeightLoader& loader,
                                                   const std::string& prefix);
std::unique_ptr<AttentionBlock> mla_attention_load(const ModelConfig& config, WeightLoader& loader,
                                                   const std::string& prefix);

// Dense SiLU MLP with gate/up/down names under `prefix` ("model.layers.N.mlp.").
std::unique_ptr<FfnBlock> dense_mlp_load(WeightLoader& loader, const std::string& prefix,
                                         int64_t hidden, int64_t inner);
// Routed experts (names from config.expert_tensor_names), router `<moe_prefix>gate.weight`,
// optional correction bias and shared experts (`<moe_prefix>shared_experts.`).
std::unique_ptr<FfnBlock> moe_load(const ModelConfig& config, WeightLoader& loader, int64_t layer);

// The decoder stack: the same for every family once the blocks are chosen.
struct DecoderLayer {
  Tensor input_norm, post_attention_norm;
  std::unique_ptr<AttentionBlock> attention;
  std::unique_ptr<FfnBlock> ffn;
};

class DecoderModel final : public Model {
 public:
  DecoderModel(ModelConfig config, Backend& backend);
  // Reads embedding, final norm and LM head (tied or not), and the per-layer norms.
  void load_common(WeightLoader& loader);
  std::vector<DecoderLayer>& layers() { return layers_; }

  const ModelConfig& config() const override { return config_; }
  KvCache create_kv_cache(int64_t blocks, int64_t block_size) override;
  int64_t kv_bytes_per_token() const override;
  std::vector<float> forward(const ForwardBatch& batch, KvCache& cache) override;
  TopLogits forward_top(const ForwardBatch& batch, KvCache& cache, int64_t k) override;

 private:
  // Both forwards: checks, begin_step(), forward_body() (through run_graph for a decode step),
  // then with top_k > 0 the best top_k logits of each row packed as top_logits_packed() says.
  // Returns the output tensor (backend memory).
  Tensor run(const ForwardBatch& batch, KvCache& cache, int64_t top_k);
  // The ops of one forward after begin_step(): embedding, layers, final norm of the logit rows,
  // LM head; returns the logits tensor (backend memory).
  Tensor forward_body(const ForwardBatch& batch, KvCache& cache);

  ModelConfig config_;
  Backend& backend_;
  int64_t id_;  // unique per model in the process (graph keys)
  Tensor embed_, final_norm_, lm_head_;
  std::vector<DecoderLayer> layers_;
};

}  // namespace moet
