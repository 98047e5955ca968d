// DeepSeek-V4's attention block (see compressed_attention.h).
#include "models/compressed_attention.h"

#include "core/error.h"
#include "models/rope_table.h"

#include <algorithm>
#include <cmath>

namespace moet {
namespace {

// A compressor's weights: kv and gate projections stacked ([kv | gate] per token, the state cache's
// row), position bias, norm.
struct Compressor {
  Tensor kv_gate, position_bias, norm;
  int64_t ratio = 0, dim = 0;
  bool overlap = false;

  Compressor() = default;
  Compressor(const ModelConfig& c, WeightLoader& loader, const std::string& p, int64_t ratio_, int64_t dim_,
             bool overlap_)
      : ratio(ratio_), dim(dim_), overlap(overlap_) {
    const int64_t width = (overlap ? 2 : 1) * dim;
    kv_gate = loader.matmul_stacked(p + "wkv.weight", p + "wgate.weight", {width, c.hidden_size});
    position_bias = loader.weight_f32(p + "ape", {ratio, width});
    norm = loader.weight_f32(p + "norm.weight", {dim});
  }

  void forward(Backend& b, const Tensor& x, const RopeTable& rope, float eps, KvLayerCache& state,
               KvLayerCache& entries) const {
    Tensor rows = b.alloc({x.rows(), kv_gate.dim(0)});
    b.matmul(x, kv_gate, nullptr, rows);
    b.kv_write(state, rows, nullptr);
    b.kv_compress({ratio, overlap, eps, &position_bias, &norm, &rope}, state, entries);
  }
};

int64_t layer_ratio(const ModelConfig& c, int64_t layer) {
  return layer < int64_t(c.layer_compress_ratio.size()) ? c.layer_compress_ratio[size_t(layer)] : 0;
}

bool layer_indexed(const ModelConfig& c, int64_t layer) {
  return layer < int64_t(c.layer_runs_indexer.size()) && c.layer_runs_indexer[size_t(layer)];
}

RopeTable pairs_rope(const RopeConfig& config) {
  RopeTable table = rope_table_build(config);
  table.interleaved = true;
  table.pairs_in_place = true;
  return table;
}

class CompressedAttention final : public AttentionBlock {
 public:
  CompressedAttention(const ModelConfig& c, WeightLoader& loader, const std::string& p, int64_t layer)
      : dim_(c.head_dim), rope_dim_(c.qk_rope_head_dim), o_rank_(c.o_lora_rank), window_(c.sliding_window),
        ratio_(layer_ratio(c, layer)), eps_(float(c.rms_norm_eps)),
        rope_(pairs_rope(ratio_ > 0 ? c.compress_rope : c.rope)), kv_specs_(compressed_attention_kv_specs(c, layer)),
        comm_(loader.shard().comm) {
    const int64_t all_heads = c.num_attention_heads, all_groups = c.o_groups, size = loader.shard().size;
    MOET_CHECK(all_heads % all_groups == 0, "config.json: o_groups {} must divide num_attention_heads {}", all_groups,
               all_heads);
    // A rank's heads [first, first + heads_) cover whole output groups, or lie inside one group (whose
    // low-rank projection the ranks then sum: it is linear in the group's heads).
    const int64_t group_heads = all_heads / all_groups;
    heads_ = all_heads / size;
    MOET_CHECK(all_heads % size == 0 && (heads_ % group_heads == 0 || group_heads % heads_ == 0),
               "--tensor-parallel-size {}: the {} attention heads in {} output groups cannot be split", size,
               all_heads, all_groups);
    const int64_t first = loader.shard().rank * heads_, first_group = first / group_heads;
    groups_ = std::max<int64_t>(1, heads_ / group_heads);
    const int64_t hidden = c.hidden_size, in_group = group_heads * dim_, in_part = heads_ * dim_ / groups_;
    const int64_t in_first = heads_ < group_heads ? (first % group_heads) * dim_ : 0;
    q_a_ = loader.matmul_weight(p + "wq_a.weight", {c.q_lora_rank, hidden});
    q_norm_ = loader.weight_f32(p + "q_norm.weight", {c.q_lora_rank});
    q_b_ = loader.matmul_weight(p + "wq_b.weight", {all_heads * dim_, c.q_lora_rank},
                                WeightPart::rows(first * dim_, (first + heads_) * dim_));
    kv_ = loader.matmul_weight(p + "wkv.weight", {dim_, hidden});
    kv_norm_ = loader.weight_f32(p + "norm.weight", {dim_});
    // wo_a [groups * o_rank, in_group] is [groups, o_rank, in_group] for head_matmul (no FP8 there).
    const WeightPart group_rows = WeightPart::rows(first_group * o_rank_, (first_group + groups_) * o_rank_);
    o_a_ = loader.weight(p + "wo_a.weight", {all_groups * o_rank_, in_group},
                         {group_rows.row_begin, group_rows.row_end, in_first, in_first + in_part});
    o_a_.shape = {groups_, o_rank_, in_part};
    o_b_ = loader.matmul_weight(p + "wo_b.weight", {hidden, all_groups * o_rank_},
                                WeightPart::cols(group_rows.row_begin, group_rows.row_end));
    sinks_ = loader.weight_f32(p + "attn_sink", {all_heads}, WeightPart::rows(first, first + heads_));
    const std::vector<float> ones(size_t(dim_), 1.0f);
    ones_ = loader.backend().upload(HostTensor{p + "(unweighted q norm)", DType::f32, {dim_},
                                               reinterpret_cast<const uint8_t*>(ones.data()), ones.size() * 4, ""});
    if (ratio_ > 0) compressor_ = Compressor(c, loader, p + "compressor.", ratio_, dim_, layer_indexed(c, layer));
    if (layer_indexed(c, layer)) {
      index_heads_ = c.index_n_heads;
      index_dim_ = c.index_head_dim;
      index_topk_ = c.index_topk;
      index_compressor_ = Compressor(c, loader, p + "indexer.compressor.", ratio_, index_dim_, true);
      index_q_ = loader.matmul_weight(p + "indexer.wq_b.weight", {index_heads_ * index_dim_, c.q_lora_rank});
      index_weights_ = loader.matmul_weight(p + "indexer.weights_proj.weight", {index_heads_, hidden});
    }
  }

  std::vector<KvLayerSpec> kv_specs() const override { return kv_specs_; }

  void forward(StepContext& ctx, const Tensor& x, std::span<KvLayerCache> caches, Tensor& out) override {
    Backend& b = ctx.backend;
    const int64_t rows = x.rows(), offset = dim_ - rope_dim_;
    Tensor q_res = b.alloc({rows, q_a_.dim(0)});
    b.matmul(x, q_a_, nullptr, q_res);
    b.rmsnorm(q_res, q_norm_, eps_, q_res);
    Tensor q = b.alloc({rows, heads_ * dim_});
    b.matmul(q_res, q_b_, nullptr, q);
    b.rmsnorm(q, ones_, eps_, q);
    b.rope(rope_, q, heads_, dim_, offset);
    Tensor kv = b.alloc({rows, dim_});
    b.matmul(x, kv_, nullptr, kv);
    b.rmsnorm(kv, kv_norm_, eps_, kv);
    b.rope(rope_, kv, 1, dim_, offset);
    b.kv_write(caches[0], kv, nullptr);

    std::vector<AttentionKeys> sources{{&caches[0], nullptr, window_, 1}};
    Tensor chosen;
    if (ratio_ > 0) {
      compressor_.forward(b, x, rope_, eps_, caches[1], caches[2]);
      if (index_heads_ > 0) {
        chosen = b.alloc({rows, index_topk_}, DType::i32);
        index(b, x, q_res, caches[3], caches[4], chosen);
        sources.push_back({&caches[2], &chosen, 0, 1});
      } else {
        sources.push_back({&caches[2], nullptr, 0, ratio_});
      }
    }
    Tensor o = b.alloc({rows, heads_ * dim_});
    b.attention_gather(sources, q, heads_, dim_, float(1.0 / std::sqrt(double(dim_))), &sinks_, o);
    b.rope_inverse(rope_, o, heads_, dim_, offset);
    Tensor grouped = b.alloc({rows, groups_ * o_rank_});
    b.head_matmul(o, groups_, heads_ * dim_ / groups_, o_a_, grouped, o_rank_);
    b.matmul(grouped, o_b_, nullptr, out);
    if (comm_) comm_->all_reduce(out);
  }

 private:
  // The lightning indexer of a compressed sparse layer: its compressor's entries, then each row's
  // choice among the closed windows (positions of the entries' slots).
  void index(Backend& b, const Tensor& x, const Tensor& q_res, KvLayerCache& state, KvLayerCache& entries,
             Tensor& chosen) const {
    index_compressor_.forward(b, x, rope_, eps_, state, entries);
    Tensor q = b.alloc({x.rows(), index_heads_ * index_dim_});
    b.matmul(q_res, index_q_, nullptr, q);
    b.rope(rope_, q, index_heads_, index_dim_, index_dim_ - rope_dim_);
    Tensor weights = b.alloc({x.rows(), index_heads_});
    b.matmul(x, index_weights_, nullptr, weights);
    b.indexer_topk(entries, q, index_heads_, weights, float(1.0 / std::sqrt(double(index_dim_))), ratio_, chosen);
  }

  int64_t heads_ = 0, dim_, rope_dim_, groups_ = 0, o_rank_, window_, ratio_;  // heads_, groups_: this rank's
  int64_t index_heads_ = 0, index_dim_ = 0, index_topk_ = 0;
  float eps_;
  RopeTable rope_;
  std::vector<KvLayerSpec> kv_specs_;
  Communicator* comm_;
  Tensor q_a_, q_norm_, q_b_, kv_, kv_norm_, o_a_, o_b_, sinks_, ones_, index_q_, index_weights_;
  Compressor compressor_, index_compressor_;
};

}  // namespace

std::unique_ptr<AttentionBlock> compressed_attention_load(const ModelConfig& config, WeightLoader& loader,
                                                          const std::string& prefix, int64_t layer) {
  return std::make_unique<CompressedAttention>(config, loader, prefix, layer);
}

std::vector<KvLayerSpec> compressed_attention_kv_specs(const ModelConfig& c, int64_t layer) {
  std::vector<KvLayerSpec> specs{KvLayerSpec::latent_row(c.head_dim, c.head_dim)};
  const int64_t ratio = layer_ratio(c, layer);
  if (ratio == 0) return specs;
  const bool indexed = layer_indexed(c, layer);
  // A compressor keeps each token's state (kv and gate) and its entries (one row of dim per slot).
  const auto add = [&](int64_t dim, bool overlap) {
    const int64_t state = 2 * (overlap ? 2 : 1) * dim;
    specs.push_back(KvLayerSpec::latent_row(state, state));
    specs.push_back(KvLayerSpec::latent_row(dim, dim));
  };
  add(c.head_dim, indexed);
  if (indexed) add(c.index_head_dim, true);
  return specs;
}

}  // namespace moet
