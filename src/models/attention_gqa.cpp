// Grouped-query attention block: q/k/v projections (optional biases; one matmul_group),
// optional per-head q/k RMSNorm before rope (Qwen3, GLM), rope on the first rope.dim values of
// each head (partial rotary for GLM) fused with the KV write of k and v (one op), paged causal
// attention, output projection (optional bias). An FP8 checkpoint's per-tensor KV scales
// (self_attn.k_scale / v_scale, or k_proj.k_scale / v_proj.v_scale as modelopt writes them) go
// into the layer's KV spec: an fp8 cache then quantizes with them instead of per token and head.
#include "models/blocks.h"

#include "models/rope_table.h"

#include <cmath>
#include <cstring>

namespace moet {
namespace {

// The checkpoint's per-tensor KV scale of `which` ("k" or "v") under attention prefix p, or 0.
float checkpoint_kv_scale(WeightLoader& loader, const std::string& p, const std::string& which) {
  const Checkpoint* checkpoint = loader.checkpoint();
  if (checkpoint == nullptr) return 0.0f;  // invented weights have none
  for (const std::string& name : {p + which + "_scale", p + which + "_proj." + which + "_scale"}) {
    const HostTensor* found = checkpoint->find(name);
    if (found == nullptr) continue;
    MOET_CHECK(found->numel() == 1, "{}: KV scale '{}' must hold one value, not {}", checkpoint->dir().string(), name,
               found->shape_text());
    const HostTensor& info = loader.info(name, found->shape);
    float value = 0.0f;
    switch (info.dtype) {
      case DType::f32: std::memcpy(&value, info.data, sizeof value); break;
      case DType::bf16: value = bf16_to_float(*reinterpret_cast<const uint16_t*>(info.data)); break;
      case DType::f16: value = f16_to_float(*reinterpret_cast<const uint16_t*>(info.data)); break;
      default: fail("{}: KV scale '{}' has dtype {}, not F32/BF16/F16", checkpoint->dir().string(), name,
                    dtype_name(info.dtype));
    }
    MOET_CHECK(std::isfinite(value) && value > 0.0f, "{}: KV scale '{}' is {}, not a positive number",
               checkpoint->dir().string(), name, value);
    return value;
  }
  return 0.0f;
}

class GqaAttention final : public AttentionBlock {
 public:
  GqaAttention(const ModelConfig& c, WeightLoader& loader, const std::string& p)
      : heads_(c.num_attention_heads), kv_heads_(c.num_key_value_heads), head_dim_(c.head_dim),
        scale_(float(1.0 / std::sqrt(double(c.head_dim)))), eps_(float(c.rms_norm_eps)),
        rope_(rope_table_build(c.rope)) {
    const int64_t hidden = c.hidden_size;
    q_ = loader.matmul_weight(p + "q_proj.weight", {heads_ * head_dim_, hidden});
    k_ = loader.matmul_weight(p + "k_proj.weight", {kv_heads_ * head_dim_, hidden});
    v_ = loader.matmul_weight(p + "v_proj.weight", {kv_heads_ * head_dim_, hidden});
    o_ = loader.matmul_weight(p + "o_proj.weight", {hidden, heads_ * head_dim_});
    if (c.attention_bias) {
      q_bias_ = loader.weight_f32(p + "q_proj.bias", {heads_ * head_dim_});
      k_bias_ = loader.weight_f32(p + "k_proj.bias", {kv_heads_ * head_dim_});
      v_bias_ = loader.weight_f32(p + "v_proj.bias", {kv_heads_ * head_dim_});
    }
    if (loader.has(p + "o_proj.bias")) o_bias_ = loader.weight_f32(p + "o_proj.bias", {hidden});
    if (c.qk_norm) {
      q_norm_ = loader.weight_f32(p + "q_norm.weight", {head_dim_});
      k_norm_ = loader.weight_f32(p + "k_norm.weight", {head_dim_});
    }
    kv_spec_ = gqa_kv_spec(c);
    kv_spec_.k_scale = checkpoint_kv_scale(loader, p, "k");
    kv_spec_.v_scale = checkpoint_kv_scale(loader, p, "v");
  }

  std::vector<KvLayerSpec> kv_specs() const override { return {kv_spec_}; }

  void forward(StepContext& ctx, const Tensor& x, std::span<KvLayerCache> caches, Tensor& out) override {
    Backend& b = ctx.backend;
    KvLayerCache& cache = caches[0];
    const int64_t rows = x.rows();
    Tensor q = b.alloc({rows, heads_ * head_dim_});
    Tensor k = b.alloc({rows, kv_heads_ * head_dim_});
    Tensor v = b.alloc({rows, kv_heads_ * head_dim_});
    const MatmulPart projections[] = {{&q_, &q_bias_, &q}, {&k_, &k_bias_, &k}, {&v_, &v_bias_, &v}};
    b.matmul_group(x, projections);
    b.qk_norm_rope_kv_write(rope_, q, heads_, k, kv_heads_, head_dim_, q_norm_, k_norm_, eps_, v, cache);
    Tensor attn = b.alloc({rows, heads_ * head_dim_});
    b.attention(cache, q, heads_, head_dim_, scale_, attn);
    b.matmul(attn, o_, &o_bias_, out);
  }

 private:
  int64_t heads_, kv_heads_, head_dim_;
  float scale_, eps_;
  KvLayerSpec kv_spec_;
  RopeTable rope_;
  Tensor q_, k_, v_, o_, q_bias_, k_bias_, v_bias_, o_bias_, q_norm_, k_norm_;
};

}  // namespace

KvLayerSpec gqa_kv_spec(const ModelConfig& config) {
  return KvLayerSpec::paged_heads(config.num_key_value_heads, config.head_dim);
}

std::unique_ptr<AttentionBlock> gqa_attention_load(const ModelConfig& config, WeightLoader& loader,
                                                   const std::string& prefix, int64_t /*layer*/) {
  return std::make_unique<GqaAttention>(config, loader, prefix);
}

}  // namespace moet
