// Feed-forward blocks: the dense SiLU MLP and the MoE block (router -> routed experts, read from
// the model's ExpertPool at every forward, plus shared experts when the family has them). Gate
// and up projections are stacked at load so one
// matmul produces both halves for silu_mul.
#include "models/blocks.h"

#include "core/error.h"

namespace moet {
namespace {

class DenseMlp final : public FfnBlock {
 public:
  DenseMlp(WeightLoader& loader, const std::string& p, int64_t hidden, int64_t inner)
      : inner_(inner),
        gate_up_(loader.matmul_stacked(p + "gate_proj.weight", p + "up_proj.weight", {inner, hidden})),
        down_(loader.matmul_weight(p + "down_proj.weight", {hidden, inner})) {}

  void forward(Backend& b, const Tensor& x, Tensor& out) override {
    Tensor gate_up = b.alloc({x.rows(), 2 * inner_});
    Tensor act = b.alloc({x.rows(), inner_});
    b.matmul(x, gate_up_, nullptr, gate_up);
    b.silu_mul(gate_up, act);
    b.matmul(act, down_, nullptr, out);
  }

 private:
  int64_t inner_;
  Tensor gate_up_, down_;
};

class Moe final : public FfnBlock {
 public:
  Moe(const ModelConfig& c, WeightLoader& loader, int64_t layer, ExpertLoader& experts, ExpertPool& pool)
      : top_k_(c.num_experts_per_tok), layer_(layer), pool_(pool) {
    const std::string p = c.moe_prefix(layer);
    const int64_t hidden = c.hidden_size, inner = c.moe_intermediate_size, count = c.n_routed_experts;
    router_ = loader.weight(p + "gate.weight", {count, hidden});
    router_bias_ = loader.router_bias(layer, count);
    params_ = {count, top_k_, c.scoring == RouterScoring::sigmoid, c.norm_topk_prob,
               float(c.routed_scaling_factor), c.n_group, c.topk_group, nullptr};
    if (c.has_correction_bias) {
      bias_ = loader.weight_f32(p + "gate.e_score_correction_bias", {count});
      params_.correction_bias = bias_.as<float>();
    }
    pool.load_layer(layer, experts, loader);
    pool.set_router(layer, &router_, &router_bias_, params_);  // next-layer prefetch predicts with it
    if (c.n_shared_experts > 0)
      shared_ = dense_mlp_load(loader, p + "shared_experts.", hidden, inner * c.n_shared_experts);
  }

  void forward(Backend& b, const Tensor& x, Tensor& out) override {
    Tensor logits = b.alloc({x.rows(), params_.experts});
    b.matmul(x, router_, &router_bias_, logits);
    Tensor expert_ids = b.alloc({x.rows(), top_k_}, DType::i32);
    Tensor weights = b.alloc({x.rows(), top_k_});
    b.router(params_, logits, expert_ids, weights);
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
  Tensor router_, router_bias_, bias_;
  RouterParams params_{};
  std::unique_ptr<FfnBlock> shared_;
};

}  // namespace

std::unique_ptr<FfnBlock> dense_mlp_load(WeightLoader& loader, const std::string& prefix,
                                         int64_t hidden, int64_t inner) {
  return std::make_unique<DenseMlp>(loader, prefix, hidden, inner);
}

std::unique_ptr<FfnBlock> moe_load(const ModelConfig& config, WeightLoader& loader, int64_t layer,
                                   ExpertLoader& experts, ExpertPool& pool) {
  return std::make_unique<Moe>(config, loader, layer, experts, pool);
}

}  // namespace moet
