// Multi-head latent attention (DeepSeek-V2/V3, Kimi-K2) in the absorbed form. The cache holds,
// per token, the normalised KV latent c (kv_lora_rank) followed by the roped shared key
// (qk_rope_head_dim). Per head h, kv_b_proj splits into W_uk[h] (qk_nope x rank) and W_uv[h]
// (v_head x rank); scores use q_lat = W_uk[h]^T q_nope concatenated with q_rope against the cache
// row, values are the latent part of the same row, and the head output is W_uv[h] o_lat. This is
// the same function as expanding K/V per head, with one cache row per token for all heads.
// GLM-5 (DeepSeek sparse attention): each row attends only to the keys the lightning indexer
// chose (models/dsa_indexer.h): this layer's own indexer, or the last one that ran before it.
// A rank of a tensor-parallel model (docs/parallel.md) holds its part of the heads (q_b_proj /
// q_proj rows, kv_b_proj's heads, o_proj's columns; o_proj's bias on rank 0) and sums the ranks'
// outputs with one all-reduce; the latent projections, the cache row and the indexer are whole on
// every rank (every rank writes the same latent row).
#include "models/blocks.h"

#include "core/error.h"
#include "models/dsa_indexer.h"
#include "models/rope_table.h"

#include <cstring>

namespace moet {
namespace {

class MlaAttention final : public AttentionBlock {
 public:
  MlaAttention(const ModelConfig& c, WeightLoader& loader, const std::string& p, bool sparse, bool runs_indexer)
      : heads_(c.num_attention_heads / loader.shard().size), rank_(c.kv_lora_rank), nope_(c.qk_nope_head_dim),
        rope_dim_(c.qk_rope_head_dim), v_dim_(c.v_head_dim), scale_(float(c.attention_scale())),
        sparse_(sparse), kv_spec_(mla_kv_spec(c)), rope_(rope_table_build(c.rope)), comm_(loader.shard().comm) {
    const ShardSpec& shard = loader.shard();
    MOET_CHECK(c.num_attention_heads % shard.size == 0,
               "--tensor-parallel-size {}: the {} attention heads are not divisible by it", shard.size,
               c.num_attention_heads);
    const int64_t all_heads = c.num_attention_heads, first = shard.rank * heads_;
    // Head h's rows of a per-head [heads * width, k] projection.
    const auto head_rows = [&](int64_t width) { return WeightPart::rows(first * width, (first + heads_) * width); };
    if (runs_indexer) {
      indexer_ = std::make_unique<DsaIndexer>(c, loader, p);
      indexer_spec_ = DsaIndexer::kv_spec(c);
    }
    MOET_CHECK(!sparse_ || c.q_lora_rank > 0, "config.json: DeepSeek sparse attention needs q_lora_rank");
    const int64_t hidden = c.hidden_size, qk = nope_ + rope_dim_;
    if (c.q_lora_rank > 0) {
      q_a_ = loader.matmul_weight(p + "q_a_proj.weight", {c.q_lora_rank, hidden});
      if (c.attention_bias) q_a_bias_ = loader.weight_f32(p + "q_a_proj.bias", {c.q_lora_rank});
      q_a_norm_ = loader.weight_f32(p + "q_a_layernorm.weight", {c.q_lora_rank});
      q_b_ = loader.matmul_weight(p + "q_b_proj.weight", {all_heads * qk, c.q_lora_rank}, head_rows(qk));
    } else {
      q_b_ = loader.matmul_weight(p + "q_proj.weight", {all_heads * qk, hidden}, head_rows(qk));
    }
    kv_a_ = loader.matmul_weight(p + "kv_a_proj_with_mqa.weight", {rank_ + rope_dim_, hidden});
    if (c.attention_bias) kv_a_bias_ = loader.weight_f32(p + "kv_a_proj_with_mqa.bias", {rank_ + rope_dim_});
    kv_a_norm_ = loader.weight_f32(p + "kv_a_layernorm.weight", {rank_});
    // Split per head for head_matmul, which takes no FP8: an FP8 kv_b_proj is decoded to F32.
    split_kv_b(loader.backend(),
               loader.info(p + "kv_b_proj.weight", {all_heads * (nope_ + v_dim_), rank_}, head_rows(nope_ + v_dim_)));
    const WeightPart v_rows = head_rows(v_dim_);
    o_ = loader.matmul_weight(p + "o_proj.weight", {hidden, all_heads * v_dim_},
                              WeightPart::cols(v_rows.row_begin, v_rows.row_end));
    if (c.attention_bias && shard.rank == 0) o_bias_ = loader.weight_f32(p + "o_proj.bias", {hidden});
  }

  std::vector<KvLayerSpec> kv_specs() const override {
    if (!indexer_) return {kv_spec_};
    return {kv_spec_, indexer_spec_};
  }

  void forward(StepContext& ctx, const Tensor& x, std::span<KvLayerCache> caches, Tensor& out) override {
    Backend& b = ctx.backend;
    KvLayerCache& cache = caches[0];
    const int64_t rows = x.rows(), qk = nope_ + rope_dim_, row = rank_ + rope_dim_;
    Tensor q = b.alloc({rows, heads_ * qk});
    if (!q_a_.empty()) {
      Tensor qa = b.alloc({rows, q_a_.dim(0)});
      b.matmul(x, q_a_, &q_a_bias_, qa);
      b.rmsnorm(qa, q_a_norm_, eps_, qa);
      b.matmul(qa, q_b_, nullptr, q);
      if (indexer_) {
        ctx.dsa_topk = b.alloc({rows, indexer_->topk()}, DType::i32);
        indexer_->forward(b, x, qa, rope_, caches[1], ctx.dsa_topk);
      }
    } else {
      b.matmul(x, q_b_, nullptr, q);
    }
    Tensor kv = b.alloc({rows, row});
    b.matmul(x, kv_a_, &kv_a_bias_, kv);
    Tensor latent = b.alloc({rows, rank_});
    b.copy_columns(kv, row, 0, latent, rank_, 0, rows, rank_);
    b.rmsnorm(latent, kv_a_norm_, eps_, latent);
    b.copy_columns(latent, rank_, 0, kv, row, 0, rows, rank_);
    b.rope(rope_, kv, 1, row, rank_);
    b.rope(rope_, q, heads_, qk, nope_);
    b.kv_write(cache, kv, nullptr);

    Tensor q_full = b.alloc({rows, heads_, row});
    b.head_matmul(q, heads_, qk, w_uk_t_, q_full, row);
    b.copy_columns(q, qk, nope_, q_full, row, rank_, rows * heads_, rope_dim_);
    Tensor o_latent = b.alloc({rows, heads_, rank_});
    if (sparse_) {
      MOET_CHECK(!ctx.dsa_topk.empty() && ctx.dsa_topk.rows() == rows,
                 "DeepSeek sparse attention: a layer sharing the indexer's choice runs before any indexer");
      const AttentionKeys chosen{&cache, &ctx.dsa_topk};
      b.attention_gather({&chosen, 1}, q_full, heads_, row, scale_, nullptr, o_latent);
    } else {
      b.attention(cache, q_full, heads_, row, scale_, o_latent);
    }
    Tensor o_heads = b.alloc({rows, heads_ * v_dim_});
    b.head_matmul(o_latent, heads_, rank_, w_uv_, o_heads, v_dim_);
    b.matmul(o_heads, o_, &o_bias_, out);
    if (comm_) comm_->all_reduce(out);
  }

 private:
  // kv_b_proj [heads * (nope + v), rank] -> W_uk^T [heads, rank, nope] and W_uv [heads, v, rank],
  // both in the checkpoint's dtype (a permutation: values are unchanged).
  void split_kv_b(Backend& backend, const HostTensor& kv_b) {
    const size_t elem = dtype_size(kv_b.dtype);
    std::vector<uint8_t> uk(static_cast<size_t>(heads_ * rank_ * nope_) * elem);
    std::vector<uint8_t> uv(static_cast<size_t>(heads_ * v_dim_ * rank_) * elem);
    for (int64_t h = 0; h < heads_; ++h) {
      const int64_t base = h * (nope_ + v_dim_);
      for (int64_t i = 0; i < nope_; ++i)
        for (int64_t r = 0; r < rank_; ++r)
          std::memcpy(&uk[size_t((h * rank_ + r) * nope_ + i) * elem], kv_b.data + size_t((base + i) * rank_ + r) * elem, elem);
      std::memcpy(&uv[size_t(h * v_dim_ * rank_) * elem], kv_b.data + size_t((base + nope_) * rank_) * elem,
                  size_t(v_dim_ * rank_) * elem);
    }
    w_uk_t_ = backend.upload(HostTensor{kv_b.name + " (W_uk^T)", kv_b.dtype, {heads_, rank_, nope_}, uk.data(), uk.size(), kv_b.file});
    w_uv_ = backend.upload(HostTensor{kv_b.name + " (W_uv)", kv_b.dtype, {heads_, v_dim_, rank_}, uv.data(), uv.size(), kv_b.file});
  }

  int64_t heads_, rank_, nope_, rope_dim_, v_dim_;
  // transformers builds q_a_layernorm and kv_a_layernorm with eps 1e-6 whatever rms_norm_eps says.
  static constexpr float eps_ = 1e-6f;
  float scale_;
  bool sparse_;
  KvLayerSpec kv_spec_, indexer_spec_;
  RopeTable rope_;
  std::unique_ptr<DsaIndexer> indexer_;
  Communicator* comm_;
  Tensor q_a_, q_a_bias_, q_a_norm_, q_b_, kv_a_, kv_a_bias_, kv_a_norm_, w_uk_t_, w_uv_, o_, o_bias_;
};

}  // namespace

KvLayerSpec mla_kv_spec(const ModelConfig& config) {
  return KvLayerSpec::latent_row(config.kv_lora_rank + config.qk_rope_head_dim, config.kv_lora_rank);
}

namespace {

// Whether layer `layer` runs its own indexer: GLM-5's indexer_types, the MTP layer when its
// checkpoint has indexer weights (invented weights: always).
bool layer_runs_indexer(const ModelConfig& config, const WeightLoader* loader, const std::string& prefix,
                        int64_t layer) {
  if (config.index_topk <= 0) return false;
  if (layer < int64_t(config.layer_runs_indexer.size())) return config.layer_runs_indexer[size_t(layer)];
  return loader == nullptr || loader->checkpoint() == nullptr || loader->has(prefix + "indexer.wk.weight");
}

}  // namespace

std::vector<KvLayerSpec> mla_layer_kv_specs(const ModelConfig& config, int64_t layer) {
  if (!layer_runs_indexer(config, nullptr, "", layer)) return {mla_kv_spec(config)};
  return {mla_kv_spec(config), DsaIndexer::kv_spec(config)};
}

std::unique_ptr<AttentionBlock> mla_attention_load(const ModelConfig& config, WeightLoader& loader,
                                                   const std::string& prefix, int64_t layer) {
  return std::make_unique<MlaAttention>(config, loader, prefix, config.index_topk > 0,
                                        layer_runs_indexer(config, &loader, prefix, layer));
}

}  // namespace moet
