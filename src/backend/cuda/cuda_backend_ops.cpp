// The CUDA backend's ops (class in cuda_backend_impl.h): each checks what its kernels take, launches
// them through their kernels/cuda launchers on the backend's one stream and ends with
// check_launch() (which, with MOET_CUDA_SYNC=1, synchronises and checks after the op, locating a
// faulting kernel). Per-row inputs (tokens, positions, row -> sequence, KV slots, block tables) come
// from the device buffer begin_step() filled, never from host vectors, so nothing here
// synchronises with the host and a forward of these ops can be captured in a CUDA graph.
#include "backend/cuda/cuda_backend_impl.h"

#include "backend/cuda/cuda_check.h"
#include "core/error.h"
#include "core/log.h"
#include "kernels/cuda/attention.h"
#include "kernels/cuda/elementwise.h"
#include "kernels/cuda/gemv.h"
#include "kernels/cuda/head_norm_rope.h"
#include "kernels/cuda/host_mailbox.h"
#include "kernels/cuda/logit_confidence.h"
#include "kernels/cuda/moe.h"
#include "kernels/cuda/moe_w2.h"
#include "kernels/cuda/w2_tiles.h"
#include "kernels/cuda/prefill_attention.h"
#include "kernels/cuda/rmsnorm.h"
#include "kernels/cuda/splitk_attention.h"
#include "kernels/cuda/router.h"
#include "kernels/cuda/top_logits.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <utility>

namespace moet {

using namespace moet::cuda;

void CudaBackend::embedding(const Tensor& table, int64_t first_row, Tensor& out) {
  const int64_t vocab = first_row + table.dim(0);
  if (step_.vocab <= 0)  // else begin_step() checked the ids against step.vocab
    for (int64_t t = 0; t < step_.rows; ++t)
      MOET_CHECK(step_.tokens[t] >= 0 && step_.tokens[t] < vocab, "token id {} outside the vocabulary [0, {})",
                 step_.tokens[t], vocab);
  embedding_launch(step_ints(kTokens), step_.rows, table.data, is_bf16(table), first_row, table.dim(0), table.dim(1),
                   out.as<float>(), stream_);
  check_launch("embedding");
}

void CudaBackend::rmsnorm(const Tensor& x, const Tensor& weight, float eps, Tensor& out) {
  const int64_t dim = weight.numel();
  check_norm_dim(dim);
  rmsnorm_launch(x.as<float>(), x.numel() / dim, dim, weight.as<float>(), eps, out.as<float>(), stream_);
  check_launch("rmsnorm", [&] { return fmt::format("rmsnorm[dim={}]", dim); });
}

void CudaBackend::add_rmsnorm(Tensor& residual, const Tensor& delta, const Tensor& weight, float eps, Tensor& out) {
  const int64_t dim = weight.numel();
  check_norm_dim(dim);
  add_rmsnorm_launch(residual.as<float>(), delta.as<float>(), residual.numel() / dim, dim, weight.as<float>(), eps,
                     out.as<float>(), stream_);
  check_launch("add_rmsnorm", [&] { return fmt::format("add_rmsnorm[dim={}]", dim); });
}

// The launch arguments of y = x @ w^T (+ bias), after checking the shapes.
cuda::GemvArgs CudaBackend::matmul_args(const Tensor& x, const Tensor& w, const Tensor* bias, Tensor& y) const {
  const int64_t k = x.cols(), n = w.dim(0), rows = x.rows();
  MOET_CHECK(w.dim(1) == k && y.cols() == n && y.rows() == rows, "matmul shape mismatch: x [{}, {}] w [{}, {}]",
             rows, k, n, w.dim(1));
  const float* b = bias && !bias->empty() ? bias->as<float>() : nullptr;
  GemvArgs a{x.as<float>(), k, 0, gemv_weights(w), rows, k, {}, 1, step_.row_invariant};
  a.parts[0] = {w.data, 0, b, y.as<float>(), n, 0, n, 1, w.block_scales ? w.block_scales->as<float>() : nullptr};
  return a;
}

// Whether a product runs on the tensor cores (dense_gemm.h): at least gemm_min_rows_ rows of BF16
// or FP8-block weights that cuBLASLt takes, outside decode-like steps (StepInputs::row_invariant:
// cuBLASLt's bits for a row may depend on the row count). Fewer rows, F32 weights, decode-like
// steps and the rest run on the GEMV (gemv.h).
bool CudaBackend::takes_gemm(const GemvArgs& a, int part) {
  const GemvPart& p = a.parts[part];
  const bool fp8 = a.weights == GemvWeights::fp8_block;
  return gemm_min_rows_ > 0 && a.rows >= gemm_min_rows_ && !a.row_invariant &&
         (a.weights == GemvWeights::bf16 || fp8) &&
         a.x_row_stride == a.k && DenseGemm::supports(p.w, p.bias, p.y, a.k) && gemm_ready() &&
         (!fp8 || gemm_->fp8_tile_rows(a.k) > 0);
}

// The DenseGemm, made on first use (its workspace and weight scratch under the memory budget;
// never inside a graph capture: begin_step() makes it before a step of that many rows is
// captured). When the budget has no room for them, products stay on the GEMV.
bool CudaBackend::gemm_ready() {
  if (gemm_ || gemm_min_rows_ <= 0) return bool(gemm_);
  MOET_CHECK(!capturing_, "the tensor-core GEMM was not prepared before this graph capture");
  try {
    gemm_workspace_ = device_tensor(DType::u8, {int64_t(kGemmWorkspaceBytes)});
    gemm_weight_scratch_ = device_tensor(DType::u8, {int64_t(kGemmWeightScratchBytes)});
  } catch (const Error& e) {
    MOET_LOG_WARN("no memory for the tensor-core GEMM's workspace and weight scratch ({}); products run on the GEMV",
                  e.what());
    gemm_workspace_ = Tensor{};
    gemm_min_rows_ = 0;
    return false;
  }
  gemm_ = std::make_unique<DenseGemm>(gemm_workspace_.data, kGemmWorkspaceBytes, gemm_weight_scratch_.data,
                                      kGemmWeightScratchBytes);
  return true;
}

// The activations as the GEMM takes them: [2, rows, k] BF16, the hi pieces then the lo pieces.
Tensor CudaBackend::split_activations(const Tensor& x) {
  Tensor pieces = alloc({2, x.rows(), x.cols()}, DType::bf16);
  split_bf16_launch(x.as<float>(), x.numel(), pieces.as<uint16_t>(), pieces.as<uint16_t>() + x.numel(), stream_);
  return pieces;
}

void CudaBackend::gemm_part(const Tensor& pieces, const GemvArgs& a, int part) {
  const GemvPart& p = a.parts[part];
  if (a.weights == GemvWeights::fp8_block) {
    gemm_->run_fp8_block(static_cast<const uint8_t*>(p.w), p.w_scales, pieces.as<uint16_t>(), p.bias, p.y, a.rows,
                         p.n, a.k, stream_);
  } else {
    gemm_->run(static_cast<const uint16_t*>(p.w), pieces.as<uint16_t>(), p.bias, p.y, a.rows, p.n, a.k, stream_);
  }
}

// The per-op profile name of a product: "matmul" / "matmul_group" on the GEMV; on the tensor
// cores "gemm" / "gemm_group", "gemm_fp8" / "gemm_fp8_group" for FP8-block weights.
std::string CudaBackend::product_name(const GemvArgs& a, bool gemm, bool group) {
  if (!gemm) return group ? "matmul_group" : "matmul";
  return std::string(a.weights == GemvWeights::fp8_block ? "gemm_fp8" : "gemm") + (group ? "_group" : "");
}

void CudaBackend::matmul(const Tensor& x, const Tensor& w, const Tensor* bias, Tensor& y) {
  const GemvArgs a = matmul_args(x, w, bias, y);
  const bool gemm = takes_gemm(a, 0);
  if (gemm) {
    gemm_part(split_activations(x), a, 0);
  } else {
    gemv_launch(a, stream_);
  }
  check_launch("matmul",
               [&] { return fmt::format("{}[n={},k={}]", product_name(a, gemm, false), a.parts[0].n, a.k); });
}

void CudaBackend::matmul_group(const Tensor& x, std::span<const MatmulPart> parts) {
  MOET_CHECK(!parts.empty(), "matmul_group: no parts");
  const bool one_type = std::all_of(parts.begin(), parts.end(), [&](const MatmulPart& p) {
    return p.w->dtype == parts.front().w->dtype;
  });
  if (parts.size() > size_t(kGemvMaxParts) || !one_type) {  // as separate launches
    Backend::matmul_group(x, parts);
    return;
  }
  GemvArgs a = matmul_args(x, *parts.front().w, parts.front().bias, *parts.front().y);
  for (size_t i = 1; i < parts.size(); ++i) a.parts[i] = matmul_args(x, *parts[i].w, parts[i].bias, *parts[i].y).parts[0];
  a.part_count = int(parts.size());
  bool gemm = true;
  for (int i = 0; i < a.part_count; ++i) gemm = gemm && takes_gemm(a, i);
  if (gemm) {  // the activations split once for every part (FP8-block parts: each its own tiles)
    const Tensor pieces = split_activations(x);
    for (int i = 0; i < a.part_count; ++i) gemm_part(pieces, a, i);
  } else {
    gemv_launch(a, stream_);
  }
  check_launch("matmul_group", [&] {  // the label is built only when profiling asks for it
    std::string ns = std::to_string(a.parts[0].n);
    for (int i = 1; i < a.part_count; ++i) ns += "+" + std::to_string(a.parts[i].n);
    return fmt::format("{}[n={},k={}]", product_name(a, gemm, true), ns, a.k);
  });
}

void CudaBackend::add(Tensor& y, const Tensor& x) {
  add_launch(y.as<float>(), x.as<float>(), y.numel(), stream_);
  check_launch("add");
}

void CudaBackend::silu_mul(const Tensor& gate_up, Tensor& out) {
  silu_mul_launch(gate_up.as<float>(), gate_up.rows(), gate_up.cols() / 2, out.as<float>(), stream_);
  check_launch("silu_mul");
}

void CudaBackend::rope(const RopeTable& table, Tensor& x, int64_t heads, int64_t head_stride, int64_t offset) {
  if (table.pairs_in_place) {  // DeepSeek-V4's layout: sparse_ops.h
    rope_rotate_launch(rope_args(table), true, false, x.as<float>(), step_.rows, heads, x.numel() / step_.rows,
                       head_stride, offset, step_ints(kPositions), stream_);
    check_launch("rope");
    return;
  }
  const HeadSet set{x.as<float>(), heads, x.numel() / step_.rows, head_stride, nullptr, 0, offset};
  head_norm_rope_launch(rope_args(table), set, {}, step_.rows, 0.0f, step_ints(kPositions), stream_);
  check_launch("rope");
}

void CudaBackend::qk_norm_rope(const RopeTable& table, Tensor& q, int64_t q_heads, Tensor& k, int64_t k_heads,
                               int64_t head_dim, const Tensor& q_norm, const Tensor& k_norm, float eps) {
  const auto [q_set, k_set] = prologue_sets(table, q, q_heads, k, k_heads, head_dim, q_norm, k_norm);
  head_norm_rope_launch(rope_args(table), q_set, k_set, step_.rows, eps, step_ints(kPositions), stream_);
  check_launch("qk_norm_rope", [&] { return fmt::format("qk_norm_rope[dim={}]", head_dim); });
}

// One launch: the prologue's k warps also store their heads into the step's slots, and v gets
// warps of its own that copy it there (F32 caches; the others run the prologue, then kv_write).
void CudaBackend::qk_norm_rope_kv_write(const RopeTable& table, Tensor& q, int64_t q_heads, Tensor& k, int64_t k_heads,
                                        int64_t head_dim, const Tensor& q_norm, const Tensor& k_norm, float eps,
                                        const Tensor& v, KvLayerCache& cache) {
  const PagedKv& view = cache.view;
  if (view.dtype != KvDtype::f32) {  // the fused store writes F32 rows; the others encode in kv_write
    Backend::qk_norm_rope_kv_write(table, q, q_heads, k, k_heads, head_dim, q_norm, k_norm, eps, v, cache);
    return;
  }
  MOET_CHECK(view.kv_heads == k_heads && view.k_dim == head_dim && view.v_dim == head_dim && view.v != view.k,
             "qk_norm_rope_kv_write: a cache of {} heads of {} / {} floats{} for {} k heads of {}", view.kv_heads,
             view.k_dim, view.v_dim, view.v == view.k ? " (V aliasing K)" : "", k_heads, head_dim);
  const auto [q_set, k_set] = prologue_sets(table, q, q_heads, k, k_heads, head_dim, q_norm, k_norm);
  const KvStore store{cache.view, v.as<float>(), step_slots()};
  head_norm_rope_kv_launch(rope_args(table), q_set, k_set, store, step_.rows, eps, step_ints(kPositions), stream_);
  check_launch("qk_norm_rope_kv_write", [&] { return fmt::format("qk_norm_rope_kv_write[dim={}]", head_dim); });
}

void CudaBackend::kv_write(KvLayerCache& cache, const Tensor& k, const Tensor* v) {
  kv_write_launch(cache.view, k.as<float>(), v ? v->as<float>() : nullptr, step_slots(), step_.rows, stream_);
  check_launch("kv_write");
}

// Key counts come from the device (positions), so nothing here depends on the context length
// beyond the table stride bucket (part of every graph key); split steps (decode-sized, same
// bits either way: attention.h) get partials scratch and the persistent zeroed counters.
// Eager steps with runs of consecutive positions (prefill, chunked prefill, the prefill part of
// mixed steps) attend those rows on the tensor cores (prefill_attention.h) when it serves the
// cache, and the step's other rows with the decode kernel; captured steps (decode) and decode-like
// ones (StepInputs::row_invariant: verify and draft steps) never do, so a decode row's bits do not
// depend on whether its step is captured, nor a verify row's on the run it belongs to. The decode
// kernel is a split-K one where it serves the cache (splitk_attention.h: BF16 / FP8 GQA caches of
// head dim 128; splitk_mla_attention.cu: BF16 / FP8 / NVFP4 MLA latents of 576 / 512 under a
// multiple of 16 query heads), else attention_launch.
void CudaBackend::attention(KvLayerCache& cache, const Tensor& q, int64_t q_heads, int64_t q_stride, float scale,
                            Tensor& out) {
  const PagedKv& view = cache.view;
  MOET_CHECK(view.k_dim <= kAttentionMaxKDim && view.v_dim <= kAttentionMaxVDim && q_heads % view.kv_heads == 0,
             "attention with {} query heads over {} KV heads of {} / {} floats is not supported on CUDA (at most "
             "{} / {})", q_heads, view.kv_heads, view.k_dim, view.v_dim, kAttentionMaxKDim, kAttentionMaxVDim);
  const int64_t rows = q.numel() / (q_heads * q_stride);
  AttentionArgs args{cache.view, step_ints(kPositions), step_ints(kRowSeq), step_tables(), table_stride_,
                     q.as<float>(), rows, q_heads, q_stride, scale, out.as<float>(),
                     table_stride_ * step_.block_size, nullptr, attention_counters_.as<int32_t>()};
  const bool prefill = !capturing_ && !prefill_runs_.empty() && rows == step_.rows &&
                       prefill_attention_supports(args.cache, q_heads);
  if (prefill) {
    upload_prefill_tiles(prefill_attention_tile_rows(args.cache, q_heads));
    const auto* tiles = static_cast<const PrefillTile*>(prefill_device_.get());
    prefill_attention_launch(args, tiles, prefill_tiles_, stream_);
    args.rows = int64_t(prefill_other_rows_.size());
    args.row_ids = reinterpret_cast<const int32_t*>(tiles + prefill_tiles_);
  }
  enum class Decode { attention, splitk, splitk_mla };
  const Decode decode = splitk_attention_supports(args.cache, q_heads)       ? Decode::splitk
                        : splitk_mla_attention_supports(args.cache, q_heads) ? Decode::splitk_mla
                                                                             : Decode::attention;
  Tensor partials;
  if (args.rows > 0) {
    const int64_t floats = decode == Decode::splitk       ? splitk_attention_partial_floats(args)
                           : decode == Decode::splitk_mla ? splitk_mla_attention_partial_floats(args)
                                                          : attention_partial_floats(args);
    if (floats > 0) {
      partials = alloc({floats});
      args.partials = partials.as<float>();
    }
    switch (decode) {
      case Decode::splitk: splitk_attention_launch(args, stream_); break;
      case Decode::splitk_mla: splitk_mla_attention_launch(args, stream_); break;
      case Decode::attention: attention_launch(args, stream_); break;
    }
  }
  check_launch("attention", [&] {
    const std::string name = decode == Decode::splitk       ? "splitk_attention"
                              : decode == Decode::splitk_mla ? "splitk_mla_attention"
                                                             : "attention";
    return !prefill ? name : args.rows > 0 ? "prefill_attention+" + name : std::string("prefill_attention");
  });
}

void CudaBackend::router(const RouterParams& p, const Tensor& logits, Tensor& expert_ids, Tensor& weights) {
  MOET_CHECK(p.experts <= 1024 && p.top_k <= 64 && p.groups <= 1024, "router shape not supported on CUDA");
  router_launch({p.experts, p.top_k, p.sigmoid, p.normalize, p.scaling, p.groups, p.top_groups, p.correction_bias,
                 p.sqrtsoftplus},
                logits.as<float>(), logits.rows(), expert_ids.as<int32_t>(), weights.as<float>(), stream_);
  check_launch("router");
}

// A layer with an FP4 tier runs twice: the layer's table (the tier's experts served elsewhere,
// so they cost nothing there), then the tier's table (FP4 kernels) continuing the sums of the
// first pass (accumulate), recording nothing more.
void CudaBackend::moe_experts(const Tensor& x, const ExpertSet& set, const Tensor& expert_ids, const Tensor& weights,
                              Tensor& out, bool accumulate) {
  // Host entries are of the layer's own format's pass (the tier's table marks them served elsewhere).
  const HostMailbox* host = set.host.server ? &set.host.mailbox : nullptr;
  MOET_CHECK(!host || host->x, "moe_experts: a layer with host experts has no mailbox");
  moe_pass(x, set, set.layout.format, set.table, expert_ids, weights, out, accumulate, set.tracking, host);
  if (set.has_tier()) moe_pass(x, set, set.tier_format, set.tier_table, expert_ids, weights, out, true, {}, nullptr);
}

void CudaBackend::moe_with_host(const MoeArgs& args, const HostMailbox& mailbox) {
  // How long the device waits for the host before giving up (the host then reports the error).
  constexpr uint64_t kHostTimeoutNs = uint64_t(10) * 1000 * 1000 * 1000;
  const auto mapped = [&](auto* host) { return static_cast<decltype(host)>(mapped_pointer(host)); };
  const MailboxDevice device{mapped(mailbox.x), mapped(mailbox.ids), mapped(mailbox.weights), mapped(mailbox.rows),
                             mapped(mailbox.ready)};
  uint32_t* done = mapped(mailbox.done);
  const int64_t rows = args.rows, top_k = args.top_k, hidden = args.hidden, step = mailbox.max_rows;
  // The host computes the first range while the device runs the present experts.
  mailbox_publish_launch(device, args.x, args.expert_ids, args.weights, std::min(rows, step), top_k, hidden, stream_);
  moe_launch_products(args, stream_);
  for (int64_t first = 0; first < rows; first += step) {
    const int64_t n = std::min(step, rows - first);
    if (first > 0)
      mailbox_publish_launch(device, args.x + first * hidden, args.expert_ids + first * top_k,
                             args.weights + first * top_k, n, top_k, hidden, stream_);
    mailbox_wait_launch(done, kHostTimeoutNs, stream_);
    MoeArgs part = args;  // the range's rows: the combine indexes rows and items from its pointers
    part.rows = n;
    part.expert_ids += first * top_k;
    part.weights += first * top_k;
    part.item_out += first * top_k * hidden;
    part.out += first * hidden;
    part.host_results = mapped(mailbox.results);
    part.host_valid = mapped(mailbox.valid);
    moe_launch_combine(part, stream_);
  }
}

void CudaBackend::moe_pass(const Tensor& x, const ExpertSet& set, ExpertFormat format, const Tensor& table,
                           const Tensor& expert_ids, const Tensor& weights, Tensor& out, bool accumulate,
                           const ExpertTracking& tracking, const HostMailbox* host) {
  const int64_t rows = x.rows(), hidden = x.cols(), top_k = expert_ids.cols();
  const ExpertLayout& layout = set.layout;
  const int64_t experts = int64_t(set.experts.size()), inner = layout.inner;
  const bool w2 = format == ExpertFormat::w2;
  MOET_CHECK(hidden == layout.hidden, "moe_experts: x has {} columns, the experts {}", hidden, layout.hidden);
  const int64_t items = rows * top_k;
  Tensor order = alloc({items}, DType::i32), active = alloc({experts}, DType::i32);
  Tensor ranges = alloc({experts + 1}, DType::i32), count = alloc({2}, DType::i32);
  Tensor item_out = alloc({items, hidden});
  // W2 keeps act in its split form (moe_w2.h); the other formats use FP32 act.
  const int64_t hidden_padded = w2 ? w2_tile_shape(2 * inner, hidden).chunks * kW2ChunkCols : 0;
  const int64_t inner_padded = w2 ? w2_tile_shape(hidden, inner).chunks * kW2ChunkCols : 0;
  Tensor act = w2 ? Tensor{} : alloc({items, inner});
  Tensor x_split = w2 ? alloc({rows, 3 * hidden_padded / 2}) : Tensor{};      // BF16 pairs in F32 slots
  Tensor act_split = w2 ? alloc({items, 3 * inner_padded / 2}) : Tensor{};
  const W2Scratch w2_scratch =
      w2 ? moe_w2_scratch(rows, top_k, experts, hidden, inner, step_.row_invariant) : W2Scratch{};
  Tensor passes = w2 ? alloc({w2_scratch.passes * int64_t(sizeof(W2Pass) / sizeof(int32_t))}, DType::i32) : Tensor{};
  Tensor tile_done = w2 ? alloc({w2_scratch.tile_counters}, DType::i32) : Tensor{};
  Tensor partial = w2 ? alloc({w2_scratch.partial_floats}) : Tensor{};
  MoeArgs args{x.as<float>(), expert_ids.as<int32_t>(), weights.as<float>(),
                     static_cast<const ExpertPointers*>(table.data),
                     format == ExpertFormat::dense && set.dense_dtype == DType::bf16,
                     w2 ? kMoeW2 : format == ExpertFormat::fp4 ? kMoeFp4
                                 : format == ExpertFormat::w2k ? kMoeW2k : kMoeDense,
                     rows, top_k, experts, hidden, inner, order.as<int32_t>(), active.as<int32_t>(),
                     ranges.as<int32_t>(), count.as<int32_t>(), w2 ? nullptr : act.as<float>(), item_out.as<float>(),
                     out.as<float>(), accumulate, tracking.absent_bits, tracking.used_bits,
                     tracking.miss_count, tracking.routed_items, static_cast<uint16_t*>(x_split.data),
                     static_cast<uint16_t*>(act_split.data),
                     hidden_padded, inner_padded, static_cast<W2Pass*>(passes.data),
                     static_cast<uint32_t*>(tile_done.data), static_cast<float*>(partial.data),
                     w2_scratch.tile_counters, w2_scratch.pass_items, nullptr, nullptr};
  args.swiglu_limit = set.layout.swiglu_limit;
  args.whole_tile_blocks = step_.row_invariant;
  if (host) {
    moe_with_host(args, *host);
  } else {
    moe_launch(args, stream_);
  }
  check_launch("moe_experts");
}

void CudaBackend::copy_columns(const Tensor& src, int64_t src_stride, int64_t src_offset, Tensor& dst,
                               int64_t dst_stride, int64_t dst_offset, int64_t rows, int64_t width) {
  cuda_check(cudaMemcpy2DAsync(dst.as<float>() + dst_offset, size_t(dst_stride) * sizeof(float),
                               src.as<float>() + src_offset, size_t(src_stride) * sizeof(float),
                               size_t(width) * sizeof(float), size_t(rows), cudaMemcpyDeviceToDevice, stream_),
             "copy_columns");
  check_launch("copy_columns");
}

void CudaBackend::head_matmul(const Tensor& x, int64_t heads, int64_t x_stride, const Tensor& w, Tensor& y,
                              int64_t y_stride) {
  const int64_t n = w.dim(1), k = w.dim(2), rows = x.numel() / (heads * x_stride);
  GemvArgs a{x.as<float>(), heads * x_stride, x_stride, is_bf16(w) ? GemvWeights::bf16 : GemvWeights::f32, rows, k,
             {}, 1, step_.row_invariant};
  a.parts[0] = {w.data, n * k, nullptr, y.as<float>(), heads * y_stride, y_stride, n, heads};
  gemv_launch(a, stream_);
  check_launch("head_matmul", [&] { return fmt::format("head_matmul[heads={},n={},k={}]", heads, n, k); });
}

void CudaBackend::check_norm_dim(int64_t dim) {
  MOET_CHECK(dim <= kRmsNormMaxDim, "rmsnorm over {} floats is not supported on CUDA (at most {})", dim,
             kRmsNormMaxDim);
}

RopeArgs CudaBackend::rope_args(const RopeTable& table) {
  RopeArgs args{};
  args.pairs = int(table.inv_freq.size());
  MOET_CHECK(args.pairs > 0 && args.pairs <= kMaxRopePairs, "rope with {} pairs is not supported on CUDA", args.pairs);
  std::copy(table.inv_freq.begin(), table.inv_freq.end(), args.inv_freq);
  args.scale = table.scale;
  args.interleaved = table.interleaved;
  return args;
}

// The q and k head sets of the GQA prologue: heads of head_dim floats side by side, normalised
// whole when a norm is given, rotated from their first float.
std::pair<HeadSet, HeadSet> CudaBackend::prologue_sets(const RopeTable& table, Tensor& q, int64_t q_heads, Tensor& k,
                                                       int64_t k_heads, int64_t head_dim, const Tensor& q_norm,
                                                       const Tensor& k_norm) {
  MOET_CHECK(!table.pairs_in_place, "qk_norm_rope: pairs rotated in place are not fused on CUDA");
  MOET_CHECK(2 * int64_t(table.inv_freq.size()) <= head_dim, "rope of {} values on heads of {}",
             2 * table.inv_freq.size(), head_dim);
  MOET_CHECK((q_norm.empty() && k_norm.empty()) || head_dim <= kHeadNormRopeMaxSpan,
             "per-head RMSNorm over {} floats is not supported on CUDA (at most {})", head_dim, kHeadNormRopeMaxSpan);
  const auto set = [&](Tensor& x, int64_t heads, const Tensor& norm) {
    return HeadSet{x.as<float>(), heads, heads * head_dim, head_dim, norm.empty() ? nullptr : norm.as<float>(),
                   head_dim, 0};
  };
  return {set(q, q_heads, q_norm), set(k, k_heads, k_norm)};
}

GemvWeights CudaBackend::gemv_weights(const Tensor& w) {
  if (w.dtype != DType::f8_e4m3) return is_bf16(w) ? GemvWeights::bf16 : GemvWeights::f32;
  MOET_CHECK(w.block_scales && w.shape.size() == 2 && w.block_scales->shape == fp8_block_scale_shape(w.dim(0), w.dim(1)),
             "matmul: FP8 weight [{}] without its block scales", w.dim(0));
  return GemvWeights::fp8_block;
}

bool CudaBackend::is_bf16(const Tensor& t) {
  MOET_CHECK(t.dtype == DType::bf16 || t.dtype == DType::f32, "CUDA ops take BF16 or F32 weights, not {}",
             dtype_name(t.dtype));
  return t.dtype == DType::bf16;
}

void CudaBackend::logit_confidence(const Tensor& logits, Tensor& out) {
  check_logit_confidence(logits, out);
  const int64_t rows = logits.dim(0), vocab = logits.dim(1);
  MOET_CHECK(rows <= kLogitConfidenceMaxRows, "logit_confidence: at most {} rows (got {})", kLogitConfidenceMaxRows,
             rows);
  logit_confidence_launch(logits.as<float>(), rows, vocab, out.as<float>(), stream_);
  check_launch("logit_confidence");
}

static_assert(kMaxTopLogits <= kTopLogitsMaxK, "the CUDA top_logits covers every k the backend accepts");

void CudaBackend::top_logits(const Tensor& logits, int64_t k, Tensor& values, Tensor& ids) {
  check_top_logits(logits, k, values, ids);
  const int64_t rows = logits.dim(0), vocab = logits.dim(1);
  MOET_CHECK(rows <= kTopLogitsMaxRows, "top_logits: at most {} rows (got {})", kTopLogitsMaxRows, rows);
  Tensor workspace = alloc({int64_t(top_logits_workspace_bytes(rows, vocab, k))}, DType::u8);
  top_logits_launch(logits.as<float>(), rows, vocab, k, workspace.data, values.as<float>(), ids.as<int32_t>(),
                    stream_);
  check_launch("top_logits", [&] { return fmt::format("top_logits[vocab={},k={}]", vocab, k); });
}

}  // namespace moet
