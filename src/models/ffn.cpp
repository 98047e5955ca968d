// Feed-forward blocks: the dense SiLU MLP and the MoE block (router -> routed experts, read from
// the model's ExpertPool at every forward, plus shared experts when the family has them). Gate
// and up projections are stacked at load so one matmul produces both halves for silu_mul.
// DeepSeek-V4: sqrtsoftplus scores, hash routing (the experts of a token from gate.tid2eid) in
// the layers config.layer_hash_routed marks, and the SwiGLU clamp in shared and routed experts.
#include "models/blocks.h"

#include "core/error.h"

namespace moet {
namespace {

class DenseMlp final : public FfnBlock {
 public:
  DenseMlp(WeightLoader& loader, const std::string& p, int64_t hidden, int64_t inner, const MlpNames& n,
           float limit)
      : inner_(inner), limit_(limit),
        gate_up_(loader.matmul_stacked(p + n.gate + ".weight", p + n.up + ".weight", {inner, hidden})),
        down_(loader.matmul_weight(p + n.down + ".weight", {hidden, inner})) {}

  void forward(Backend& b, const Tensor& x, Tensor& out) override {
    Tensor gate_up = b.alloc({x.rows(), 2 * inner_});
    Tensor act = b.alloc({x.rows(), inner_});
    b.matmul(x, gate_up_, nullptr, gate_up);
    if (limit_ > 0.0f) {
      b.silu_mul_clamped(gate_up, limit_, act);
    } else {
      b.silu_mul(gate_up, act);
    }
    b.matmul(act, down_, nullptr, out);
  }

 private:
  int64_t inner_;
  float limit_;
  Tensor gate_up_, down_;
};

// The checkpoint's token -> experts table of a hash-routed layer as I32 [vocab, top_k].
Tensor hash_table_load(WeightLoader& loader, const std::string& name, int64_t vocab, int64_t top_k, int64_t experts) {
  const std::vector<int64_t> shape = {vocab, top_k};
  std::vector<int32_t> ids(size_t(vocab * top_k));
  if (loader.checkpoint() == nullptr) {  // invented weights: a fixed spread over the experts
    for (size_t i = 0; i < ids.size(); ++i)
      ids[i] = int32_t((i / size_t(top_k) * 7 + i % size_t(top_k)) % size_t(experts));
  } else {
    const HostTensor* found = loader.checkpoint()->find(name);
    MOET_CHECK(found != nullptr && found->shape == shape, "{}: tensor '{}' must be [{}, {}] (hash routing)",
               loader.checkpoint()->dir().string(), name, vocab, top_k);
    loader.mark_used(name);
    const HostTensor& t = *found;
    for (size_t i = 0; i < ids.size(); ++i) {
      const int64_t id = t.dtype == DType::i64 ? reinterpret_cast<const int64_t*>(t.data)[i]
                         : t.dtype == DType::i32 ? reinterpret_cast<const int32_t*>(t.data)[i]
                                                 : -1;
      MOET_CHECK(t.dtype == DType::i64 || t.dtype == DType::i32, "tensor '{}': dtype {}, expected I64 or I32", name,
                 dtype_name(t.dtype));
      MOET_CHECK(id >= 0 && id < experts, "tensor '{}': expert id {} outside [0, {})", name, id, experts);
      ids[i] = int32_t(id);
    }
  }
  return loader.backend().upload(HostTensor{name, DType::i32, shape, reinterpret_cast<const uint8_t*>(ids.data()),
                                            ids.size() * sizeof(int32_t), ""});
}

class Moe final : public FfnBlock {
 public:
  Moe(const ModelConfig& c, WeightLoader& loader, int64_t layer, ExpertLoader& experts, ExpertPool& pool)
      : top_k_(c.num_experts_per_tok), layer_(layer), pool_(pool) {
    const std::string p = c.moe_prefix(layer);
    const int64_t hidden = c.hidden_size, inner = c.moe_intermediate_size, count = c.n_routed_experts;
    router_ = loader.weight(p + "gate.weight", {count, hidden});
    router_bias_ = loader.router_bias(layer, count);
    params_ = {count, top_k_, c.scoring == RouterScoring::sigmoid, c.norm_topk_prob,
               float(c.routed_scaling_factor), c.n_group, c.topk_group, nullptr,
               c.scoring == RouterScoring::sqrtsoftplus};
    const bool hashed = layer < int64_t(c.layer_hash_routed.size()) && c.layer_hash_routed[size_t(layer)];
    if (hashed) {
      hash_table_ = hash_table_load(loader, p + "gate.tid2eid", c.vocab_size, top_k_, count);
    } else if (c.has_correction_bias) {
      bias_ = loader.weight_f32(p + "gate." + c.router_bias, {count});
      params_.correction_bias = bias_.as<float>();
    }
    pool.load_layer(layer, experts, loader);
    // Next-layer prefetch predicts with the router (a hash-routed layer has none to predict with).
    if (!hashed) pool.set_router(layer, &router_, &router_bias_, params_);
    const MlpNames names{c.expert_gate, c.expert_up, c.expert_down};
    if (c.n_shared_experts > 0)
      shared_ = dense_mlp_load(loader, p + "shared_experts.", hidden, inner * c.n_shared_experts, names,
                               float(c.swiglu_limit));
  }

  void forward(Backend& b, const Tensor& x, Tensor& out) override {
    Tensor logits = b.alloc({x.rows(), params_.experts});
    b.matmul(x, router_, &router_bias_, logits);
    Tensor expert_ids = b.alloc({x.rows(), top_k_}, DType::i32);
    Tensor weights = b.alloc({x.rows(), top_k_});
    if (!hash_table_.empty()) {
      b.router_hash(params_, logits, hash_table_, expert_ids, weights);
    } else {
      b.router(params_, logits, expert_ids, weights);
    }
    pool_.run(layer_, x, expert_ids, weights, out);
    if (shared_) {
      Tensor shared_out = b.alloc({x.rows(), x.cols()});
      shared_->forward(b, x, shared_out);
      b.add(out, shared_out);
    }
  }

 private:
  int64_t top_k_, layer_;
  ExpertPool& pool_;
  Tensor router_, router_bias_, bias_, hash_table_;
  RouterParams params_{};
  std::unique_ptr<FfnBlock> shared_;
};

}  // namespace

std::unique_ptr<FfnBlock> dense_mlp_load(WeightLoader& loader, const std::string& prefix, int64_t hidden,
                                         int64_t inner, const MlpNames& names, float swiglu_limit) {
  return std::make_unique<DenseMlp>(loader, prefix, hidden, inner, names, swiglu_limit);
}

std::unique_ptr<FfnBlock> moe_load(const ModelConfig& config, WeightLoader& loader, int64_t layer,
                                   ExpertLoader& experts, ExpertPool& pool) {
  return std::make_unique<Moe>(config, loader, layer, experts, pool);
}

}  // namespace moet
