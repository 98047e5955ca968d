// Grouped-query attention block: q/k/v projections (optional biases; one matmul_group),
// optional per-head q/k RMSNorm before rope (Qwen3, GLM), rope on the first rope.dim values of
// each head (partial rotary for GLM) fused with the KV write of k and v (one op), paged causal
// attention, output projection (optional bias). An FP8 checkpoint's per-tensor KV scales
// (self_attn.k_scale / v_scale, or k_proj.k_scale / v_proj.v_scale as modelopt writes them) go
// into the layer's KV spec: an fp8 cache then quantizes with them instead of per token and head.
// A rank of a tensor-parallel model (docs/parallel.md) holds its part of the query heads and the KV
// heads they read (a KV head is held by several ranks when there are fewer KV heads than ranks),
// the matching columns of o_proj (o_proj's bias on rank 0 only), and sums the ranks' outputs with
// one all-reduce.
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
      : head_dim_(c.head_dim), scale_(float(1.0 / std::sqrt(double(c.head_dim)))), eps_(float(c.rms_norm_eps)),
        rope_(rope_table_build(c.rope)), comm_(loader.shard().comm) {
    const ShardSpec& shard = loader.shard();
    const int64_t hidden = c.hidden_size, all_heads = c.num_attention_heads, all_kv = c.num_key_value_heads;
    const GqaHeads parts = gqa_heads(c, shard);
    heads_ = parts.heads;
    kv_heads_ = parts.kv_heads;
    const WeightPart q_rows = WeightPart::rows(parts.first_head * head_dim_, (parts.first_head + heads_) * head_dim_);
    const WeightPart kv_rows =
        WeightPart::rows(parts.first_kv_head * head_dim_, (parts.first_kv_head + kv_heads_) * head_dim_);
    q_ = loader.matmul_weight(p + "q_proj.weight", {all_heads * head_dim_, hidden}, q_rows);
    k_ = loader.matmul_weight(p + "k_proj.weight", {all_kv * head_dim_, hidden}, kv_rows);
    v_ = loader.matmul_weight(p + "v_proj.weight", {all_kv * head_dim_, hidden}, kv_rows);
    o_ = loader.matmul_weight(p + "o_proj.weight", {hidden, all_heads * head_dim_},
                              WeightPart::cols(q_rows.row_begin, q_rows.row_end));
    if (c.attention_bias) {
      q_bias_ = loader.weight_f32(p + "q_proj.bias", {all_heads * head_dim_}, q_rows);
      k_bias_ = loader.weight_f32(p + "k_proj.bias", {all_kv * head_dim_}, kv_rows);
      v_bias_ = loader.weight_f32(p + "v_proj.bias", {all_kv * head_dim_}, kv_rows);
    }
    if (loader.has(p + "o_proj.bias") && shard.rank == 0) o_bias_ = loader.weight_f32(p + "o_proj.bias", {hidden});
    if (c.qk_norm) {
      q_norm_ = loader.weight_f32(p + "q_norm.weight", {head_dim_});
      k_norm_ = loader.weight_f32(p + "k_norm.weight", {head_dim_});
    }
    kv_spec_ = KvLayerSpec::paged_heads(kv_heads_, head_dim_);
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
    if (comm_) comm_->all_reduce(out);
  }

 private:
  int64_t heads_ = 0, kv_heads_ = 0, head_dim_;
  float scale_, eps_;
  KvLayerSpec kv_spec_;
  RopeTable rope_;
  Communicator* comm_;
  Tensor q_, k_, v_, o_, q_bias_, k_bias_, v_bias_, o_bias_, q_norm_, k_norm_;
};

}  // namespace

KvLayerSpec gqa_kv_spec(const ModelConfig& config) {
  return KvLayerSpec::paged_heads(config.num_key_value_heads, config.head_dim);
}

GqaHeads gqa_heads(const ModelConfig& config, const ShardSpec& shard) {
  const int64_t heads = config.num_attention_heads, kv = config.num_key_value_heads, n = shard.size;
  MOET_CHECK(heads % n == 0 && (kv % n == 0 || n % kv == 0),
             "--tensor-parallel-size {}: the {} attention heads and {} KV heads cannot be split (the heads must be "
             "divisible by it, and the KV heads divisible by it or dividing it)",
             n, heads, kv);
  GqaHeads parts;
  parts.heads = heads / n;
  parts.first_head = shard.rank * parts.heads;
  parts.kv_heads = kv % n == 0 ? kv / n : 1;
  parts.first_kv_head = kv % n == 0 ? shard.rank * parts.kv_heads : shard.rank / (n / kv);
  return parts;
}

std::unique_ptr<AttentionBlock> gqa_attention_load(const ModelConfig& config, WeightLoader& loader,
                                                   const std::string& prefix, int64_t /*layer*/) {
  return std::make_unique<GqaAttention>(config, loader, prefix);
}

}  // namespace moet
