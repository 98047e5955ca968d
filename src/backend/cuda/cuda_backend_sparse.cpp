// The CUDA backend's GLM-5 / DeepSeek-V4 ops (backend.h: layernorm, rope_inverse and rope with
// pairs in place, silu_mul_clamped, attention_gather, indexer_topk, kv_compress, hc_pre / hc_post /
// hc_head, router_hash) through kernels/cuda/sparse_ops.h; checked against the CPU by
// tests/cpp/cuda/cuda_sparse_ops_test.cpp (docs/families.md).
#include "backend/cuda/cuda_backend_impl.h"

#include "kernels/cuda/sparse_ops.h"

namespace moet {

using namespace moet::cuda;

StepRowsArgs CudaBackend::step_rows() const {
  return {step_ints(kPositions), step_ints(kRowSeq), step_tables(), table_stride_, step_.rows};
}

void CudaBackend::rope_inverse(const RopeTable& table, Tensor& x, int64_t heads, int64_t head_stride, int64_t offset) {
  rope_rotate_launch(rope_args(table), table.pairs_in_place, true, x.as<float>(), step_.rows, heads,
                     x.numel() / step_.rows, head_stride, offset, step_ints(kPositions), stream_);
  check_launch("rope_inverse");
}

void CudaBackend::layernorm(const Tensor& x, const Tensor& weight, const Tensor& bias, float eps, Tensor& out) {
  const int64_t dim = weight.numel();
  layernorm_launch(x.as<float>(), x.numel() / dim, dim, weight.as<float>(), bias.as<float>(), eps, out.as<float>(),
                   stream_);
  check_launch("layernorm");
}

void CudaBackend::silu_mul_clamped(const Tensor& gate_up, float limit, Tensor& out) {
  silu_mul_clamped_launch(gate_up.as<float>(), gate_up.rows(), gate_up.cols() / 2, limit, out.as<float>(), stream_);
  check_launch("silu_mul");
}

void CudaBackend::attention_gather(std::span<const AttentionKeys> sources, const Tensor& q, int64_t q_heads,
                                   int64_t q_stride, float scale, const Tensor* sinks, Tensor& out) {
  MOET_CHECK(!sources.empty() && sources.size() <= size_t(kMaxKeySources),
             "attention_gather: 1 to {} key sources on CUDA (got {})", kMaxKeySources, sources.size());
  GatherArgs args{};
  for (size_t i = 0; i < sources.size(); ++i) {
    const AttentionKeys& s = sources[i];
    const PagedKv& view = s.cache->view;
    MOET_CHECK(view.k_dim <= kAttentionMaxKDim && view.v_dim <= kAttentionMaxVDim && q_heads % view.kv_heads == 0 &&
                   view.kv_heads == sources[0].cache->view.kv_heads && view.k_dim == sources[0].cache->view.k_dim &&
                   view.v_dim == sources[0].cache->view.v_dim,
               "attention_gather: key sources of {} heads of {} / {} floats are not supported on CUDA", view.kv_heads,
               view.k_dim, view.v_dim);
    args.sources[i] = {view, s.positions ? s.positions->as<int32_t>() : nullptr, s.positions ? s.positions->cols() : 0,
                       s.window, s.stride};
  }
  args.count = int(sources.size());
  args.q = q.as<float>();
  args.q_heads = q_heads;
  args.q_stride = q_stride;
  args.scale = scale;
  args.sinks = sinks ? sinks->as<float>() : nullptr;
  args.out = out.as<float>();
  attention_gather_launch(args, step_rows(), stream_);
  check_launch("attention_gather");
}

void CudaBackend::indexer_topk(KvLayerCache& keys, const Tensor& q, int64_t heads, const Tensor& weights, float scale,
                               int64_t stride, Tensor& positions) {
  const int64_t max_candidates = std::max<int64_t>(1, table_stride_ * step_.block_size / stride);
  Tensor scores = alloc({step_.rows, max_candidates});  // scratch: a size from the step layout only
  indexer_topk_launch({keys.view, q.as<float>(), weights.as<float>(), heads, scale, stride, positions.cols(),
                       positions.as<int32_t>(), scores.as<float>(), max_candidates},
                      step_rows(), stream_);
  check_launch("indexer_topk");
}

void CudaBackend::kv_compress(const KvCompressOp& op, KvLayerCache& state, KvLayerCache& out) {
  MOET_CHECK(out.view.k_dim <= 1024, "kv_compress: entries of {} values are not supported on CUDA", out.view.k_dim);
  kv_compress_launch({state.view, out.view, op.ratio, out.view.k_dim, op.overlap, op.eps, op.position_bias->as<float>(),
                      op.norm->as<float>(), rope_args(*op.rope)},
                     step_rows(), stream_);
  check_launch("kv_compress");
}

namespace {

HyperArgs hyper_args(const HyperConnectionWeights& w, int64_t dim) {
  MOET_CHECK(w.hc >= 1 && w.hc <= kMaxHyperStreams, "hyper-connections of {} streams are not supported on CUDA", w.hc);
  return {w.hc, dim, w.iters, w.eps, w.norm_eps, w.fn->as<float>(), w.base->as<float>(), w.scale->as<float>()};
}

}  // namespace

void CudaBackend::hc_pre(const HyperConnectionWeights& w, const Tensor& streams, Tensor& post, Tensor& comb,
                         Tensor& collapsed) {
  hc_pre_launch(hyper_args(w, collapsed.cols()), streams.as<float>(), collapsed.rows(), post.as<float>(),
                comb.as<float>(), collapsed.as<float>(), stream_);
  check_launch("hc_pre");
}

void CudaBackend::hc_post(const HyperConnectionWeights& w, Tensor& streams, const Tensor& block_out, const Tensor& post,
                          const Tensor& comb) {
  hc_post_launch(hyper_args(w, block_out.cols()), streams.as<float>(), block_out.rows(), block_out.as<float>(),
                 post.as<float>(), comb.as<float>(), stream_);
  check_launch("hc_post");
}

void CudaBackend::hc_head(const HyperConnectionWeights& w, const Tensor& streams, Tensor& out) {
  hc_head_launch(hyper_args(w, out.cols()), streams.as<float>(), out.rows(), out.as<float>(), stream_);
  check_launch("hc_head");
}

void CudaBackend::router_hash(const RouterParams& p, const Tensor& logits, const Tensor& table, Tensor& expert_ids,
                              Tensor& weights) {
  router_hash_launch(logits.as<float>(), logits.rows(), p.experts, p.top_k, step_ints(kTokens), table.as<int32_t>(),
                     table.dim(0), p.normalize, p.scaling, expert_ids.as<int32_t>(), weights.as<float>(), stream_);
  check_launch("router_hash");
}

}  // namespace moet
