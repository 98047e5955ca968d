// Feed-forward blocks: the dense SiLU MLP and the MoE block (router -> routed experts, read from
// the model's ExpertPool at every forward, plus shared experts when the family has them). Gate
// and up projections are stacked at load so one matmul produces both halves for silu_mul.
// DeepSeek-V4: sqrtsoftplus scores, hash routing (the experts of a token from gate.tid2eid) in
// the layers config.layer_hash_routed marks, and the SwiGLU clamp in shared and routed experts.
// A rank of a tensor-parallel model (docs/parallel.md) holds its part of an MLP's intermediate
// columns (gate / up rows, down columns) and its range of the routed experts (the others absent in
// its table; routing is computed whole on every rank); a block's ranks' outputs, routed and shared
// experts together, are summed with one all-reduce. With expert parallelism the routed rows move
// by all-to-all instead (Moe::routed_dispatched).
#include "models/blocks.h"

#include "core/error.h"

namespace moet {
namespace {

// Rows [first, first + count) of a [rows, cols] tensor, in place.
Tensor row_view(const Tensor& t, int64_t first, int64_t count) {
  const int64_t cols = t.cols();
  return Tensor{t.dtype, {count, cols}, t.storage,
                static_cast<uint8_t*>(t.data) + size_t(first * cols) * dtype_size(t.dtype)};
}

class DenseMlp final : public FfnBlock {
 public:
  DenseMlp(WeightLoader& loader, const std::string& p, int64_t hidden, int64_t inner, const MlpNames& n,
           float limit, bool reduce)
      : inner_(loader.shard().end(inner) - loader.shard().begin(inner)), limit_(limit),
        comm_(reduce ? loader.shard().comm : nullptr) {
    const ShardSpec& shard = loader.shard();
    MOET_CHECK(inner_ > 0, "--tensor-parallel-size {}: an MLP of {} intermediate columns cannot be split", shard.size,
               inner);
    const int64_t begin = shard.begin(inner), end = shard.end(inner);
    gate_up_ = loader.matmul_stacked(p + n.gate + ".weight", p + n.up + ".weight", {inner, hidden},
                                     WeightPart::rows(begin, end));
    down_ = loader.matmul_weight(p + n.down + ".weight", {hidden, inner}, WeightPart::cols(begin, end));
  }

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
    if (comm_) comm_->all_reduce(out);
  }

 private:
  int64_t inner_;
  float limit_;
  Communicator* comm_;
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
      : top_k_(c.num_experts_per_tok), layer_(layer), pool_(pool), shard_(loader.shard()) {
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
                               float(c.swiglu_limit), false);
  }

  void forward(Backend& b, const Tensor& x, Tensor& out) override {
    if (shard_.expert_parallel) {
      routed_dispatched(b, x, out);
    } else {
      Tensor expert_ids = b.alloc({x.rows(), top_k_}, DType::i32);
      Tensor weights = b.alloc({x.rows(), top_k_});
      route(b, x, expert_ids, weights);
      pool_.run(layer_, x, expert_ids, weights, out);
    }
    if (shared_) {
      Tensor shared_out = b.alloc({x.rows(), x.cols()});
      shared_->forward(b, x, shared_out);
      b.add(out, shared_out);
    }
    if (shard_.comm) shard_.comm->all_reduce(out);
  }

 private:
  // The experts and weights the router chooses for each row of x.
  void route(Backend& b, const Tensor& x, Tensor& expert_ids, Tensor& weights) {
    Tensor logits = b.alloc({x.rows(), params_.experts});
    b.matmul(x, router_, &router_bias_, logits);
    if (!hash_table_.empty()) {
      b.router_hash(params_, logits, hash_table_, expert_ids, weights);
    } else {
      b.router(params_, logits, expert_ids, weights);
    }
  }

  // Expert parallelism: rank r sends its own rows [T r / N, T (r + 1) / N) with their choices to
  // every rank (all-to-all, part d of the send buffers to rank d; routing is computed for every row
  // on every rank, as hash routing reads the step's tokens by row); each rank runs
  // its experts (the others are absent in its table) over all it received and sends each row's sum
  // back (all-to-all); the owner adds the ranks' sums in rank order into its rows of `out`, whose
  // other rows are zero (the block's all-reduce then assembles every row). Parts are ceil(T / N)
  // rows, a size fixed by the step's shape (what NCCL and a captured graph need); a rank with
  // fewer rows sends zero rows routed to expert 0 with weight 0, which add nothing.
  void routed_dispatched(Backend& b, const Tensor& x, Tensor& out) {
    const int64_t rows = x.rows(), hidden = x.cols(), n = shard_.size;
    const int64_t first = shard_.begin(rows), own = shard_.end(rows) - first, part = (rows + n - 1) / n;
    Tensor send_x = b.alloc({n * part, hidden}), send_ids = b.alloc({n * part, top_k_}, DType::i32);
    Tensor send_weights = b.alloc({n * part, top_k_});
    if (own < part)
      for (Tensor* t : {&send_x, &send_ids, &send_weights}) b.fill_zero(*t);
    if (own > 0) {
      Tensor ids = b.alloc({rows, top_k_}, DType::i32), weights = b.alloc({rows, top_k_});
      route(b, x, ids, weights);
      for (int64_t d = 0; d < n; ++d) {
        b.copy_columns(x, hidden, first * hidden, send_x, hidden, d * part * hidden, own, hidden);
        b.copy_columns(ids, top_k_, first * top_k_, send_ids, top_k_, d * part * top_k_, own, top_k_);
        b.copy_columns(weights, top_k_, first * top_k_, send_weights, top_k_, d * part * top_k_, own, top_k_);
      }
    }
    Tensor recv_x = b.alloc({n * part, hidden}), recv_ids = b.alloc({n * part, top_k_}, DType::i32);
    Tensor recv_weights = b.alloc({n * part, top_k_});
    shard_.comm->all_to_all(send_x, recv_x);
    shard_.comm->all_to_all(send_ids, recv_ids);
    shard_.comm->all_to_all(send_weights, recv_weights);
    Tensor sums = b.alloc({n * part, hidden}), back = b.alloc({n * part, hidden});
    pool_.run(layer_, recv_x, recv_ids, recv_weights, sums);
    shard_.comm->all_to_all(sums, back);
    b.fill_zero(out);
    if (own == 0) return;
    Tensor mine_out = row_view(out, first, own);
    for (int64_t s = 0; s < n; ++s) b.add(mine_out, row_view(back, s * part, own));
  }

  int64_t top_k_, layer_;
  ExpertPool& pool_;
  ShardSpec shard_;
  Tensor router_, router_bias_, bias_, hash_table_;
  RouterParams params_{};
  std::unique_ptr<FfnBlock> shared_;
};

}  // namespace

std::unique_ptr<FfnBlock> dense_mlp_load(WeightLoader& loader, const std::string& prefix, int64_t hidden,
                                         int64_t inner, const MlpNames& names, float swiglu_limit, bool reduce) {
  return std::make_unique<DenseMlp>(loader, prefix, hidden, inner, names, swiglu_limit, reduce);
}

std::unique_ptr<FfnBlock> moe_load(const ModelConfig& config, WeightLoader& loader, int64_t layer,
                                   ExpertLoader& experts, ExpertPool& pool) {
  return std::make_unique<Moe>(config, loader, layer, experts, pool);
}

}  // namespace moet
