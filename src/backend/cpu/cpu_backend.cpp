// CPU implementation of the Backend ops (see backend.h and cpu_backend.h).
#include "backend/cpu/cpu_backend.h"

#include "backend/bench_ops.h"

#include "core/error.h"
#include "core/thread_pool.h"
#include "kernels/cpu/attention.h"
#include "kernels/cpu/elementwise.h"
#include "kernels/cpu/fp8_matmul.h"
#include "kernels/cpu/hyper_connection.h"
#include "kernels/cpu/kv_compress.h"
#include "kernels/cpu/logit_confidence.h"
#include "kernels/cpu/matmul.h"
#include "kernels/cpu/rope.h"
#include "kernels/cpu/router.h"
#include "kernels/cpu/sparse_attention.h"
#include "kernels/cpu/top_logits.h"
#include "kernels/cpu/w2_matmul.h"

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>

namespace moet {
namespace {

// dst[d] += w * src[d]: the MoE combine of one item.
void add_weighted(float* dst, const float* src, float w, int64_t n) {
  for (int64_t d = 0; d < n; ++d) dst[d] += w * src[d];
}

Tensor host_tensor(DType dtype, std::vector<int64_t> shape) {
  Tensor t;
  t.dtype = dtype;
  t.shape = std::move(shape);
  const size_t bytes = std::max<size_t>(64, (t.bytes() + 63) / 64 * 64);
  void* memory = std::aligned_alloc(64, bytes);
  MOET_CHECK(memory != nullptr, "out of host memory allocating {} bytes", bytes);
  t.storage = std::shared_ptr<void>(memory, std::free);
  t.data = memory;
  return t;
}

class CpuBackend final : public Backend, public BenchOps {
 public:
  explicit CpuBackend(const CpuBackendOptions& options) : pool_(options.threads), isa_(options.isa) {}
  std::string name() const override {
    return fmt::format("cpu ({} threads, {} kernels)", pool_.size(), cpu_isa_name(isa_));
  }

  Tensor upload(const HostTensor& info) override {
    if (info.dtype == DType::bf16 || info.dtype == DType::f32 || info.dtype == DType::u8 || info.dtype == DType::i32) {
      Tensor t = host_tensor(info.dtype, info.shape);
      std::memcpy(t.data, info.data, info.bytes);
      return t;
    }
    return upload_f32(info);
  }

  Tensor upload_stacked(const HostTensor& a, const HostTensor& b) override {
    MOET_CHECK(a.dtype == b.dtype && a.shape.size() == 2 && b.shape.size() == 2 &&
                   a.shape[1] == b.shape[1],
               "cannot stack '{}' {} and '{}' {}", a.name, a.shape_text(), b.name, b.shape_text());
    if (a.dtype != DType::bf16 && a.dtype != DType::f32 && a.dtype != DType::u8) {
      Tensor fa = upload_f32(a), fb = upload_f32(b);
      Tensor t = host_tensor(DType::f32, {a.shape[0] + b.shape[0], a.shape[1]});
      std::memcpy(t.data, fa.data, fa.bytes());
      std::memcpy(static_cast<uint8_t*>(t.data) + fa.bytes(), fb.data, fb.bytes());
      return t;
    }
    Tensor t = host_tensor(a.dtype, {a.shape[0] + b.shape[0], a.shape[1]});
    std::memcpy(t.data, a.data, a.bytes);
    std::memcpy(static_cast<uint8_t*>(t.data) + a.bytes, b.data, b.bytes);
    return t;
  }

  Tensor upload_f32(const HostTensor& info) override {
    Tensor t = host_tensor(DType::f32, info.shape);
    float* out = t.as<float>();
    const int64_t n = info.numel();
    switch (info.dtype) {
      case DType::f32: std::memcpy(out, info.data, info.bytes); break;
      case DType::bf16:
        for (int64_t i = 0; i < n; ++i) out[i] = bf16_to_float(reinterpret_cast<const uint16_t*>(info.data)[i]);
        break;
      case DType::f16:
        for (int64_t i = 0; i < n; ++i) out[i] = f16_to_float(reinterpret_cast<const uint16_t*>(info.data)[i]);
        break;
      default:
        fail("tensor '{}' ({}): dtype {} is not supported by the CPU backend yet", info.name,
             info.file, dtype_name(info.dtype));
    }
    return t;
  }

  Tensor alloc(std::vector<int64_t> shape, DType dtype = DType::f32) override { return host_tensor(dtype, std::move(shape)); }

  KvLayerCache alloc_kv(int64_t blocks, int64_t block_size, const KvLayout& layout) override {
    // F32 caches as F32 rows (so tests and tools read them as floats), the others as bytes.
    const DType dtype = layout.dtype == KvDtype::f32 ? DType::f32 : DType::u8;
    const std::vector<int64_t> shape = {blocks * block_size, kv_slot_layout(layout).bytes / int64_t(dtype_size(dtype))};
    const auto zeroed = [&] {
      Tensor t = host_tensor(dtype, shape);
      std::memset(t.data, 0, t.bytes());
      return t;
    };
    KvLayerCache cache;
    cache.k = zeroed();
    if (layout.v_aliases_k) {
      cache.v = cache.k;
    } else {
      MOET_CHECK(layout.k_dim == layout.v_dim, "separate K/V caches need k_dim == v_dim ({} vs {})", layout.k_dim,
                 layout.v_dim);
      cache.v = zeroed();
    }
    cache.view = paged_kv_view(layout, cache.k.as<uint8_t>(), cache.v.as<uint8_t>(), block_size);
    return cache;
  }

  // Empty copies may come with null pointers, which memcpy must not see (UBSan: nonnull-attribute).
  void to_host(const Tensor& src, void* dst) override {
    if (src.bytes() > 0) std::memcpy(dst, src.data, src.bytes());
  }
  void from_host(const void* src, Tensor& dst) override {
    if (dst.bytes() > 0) std::memcpy(dst.data, src, dst.bytes());
  }
  ExpertSet expert_set(const ExpertLayout& layout, std::vector<ExpertWeights> experts) override;
  double copy_bandwidth(size_t bytes) override;

  void begin_step(const StepInputs& step) override { step_ = step; }

  void embedding(const Tensor& table, int64_t first_row, Tensor& out) override {
    const OpScope scope(*this, [] { return std::string("embedding"); });
    const int64_t vocab = step_.vocab > 0 ? step_.vocab : first_row + table.dim(0), rows = step_.rows;
    const int32_t* ids = step_.tokens;
    for (int64_t t = 0; t < rows; ++t)
      MOET_CHECK(ids[t] >= 0 && ids[t] < vocab, "token id {} outside the vocabulary [0, {})", ids[t], vocab);
    moet::embedding(ids, rows, table.data, table.dtype == DType::bf16, first_row, table.dim(0), table.dim(1),
                    out.as<float>());
  }

  void rmsnorm(const Tensor& x, const Tensor& weight, float eps, Tensor& out) override {
    const int64_t dim = weight.numel();
    const OpScope scope(*this, [&] { return fmt::format("rmsnorm[dim={}]", dim); });
    const int64_t groups = x.numel() / dim;
    moet::rmsnorm(x.as<float>(), groups, dim, dim, weight.as<float>(), eps, out.as<float>(), dim, pool_);
  }

  void add_rmsnorm(Tensor& residual, const Tensor& delta, const Tensor& weight, float eps, Tensor& out) override {
    const int64_t dim = weight.numel();
    const OpScope scope(*this, [&] { return fmt::format("add_rmsnorm[dim={}]", dim); });
    add_inplace(residual.as<float>(), delta.as<float>(), residual.numel());
    moet::rmsnorm(residual.as<float>(), residual.numel() / dim, dim, dim, weight.as<float>(), eps, out.as<float>(), dim,
                  pool_);
  }

  void matmul(const Tensor& x, const Tensor& w, const Tensor* bias, Tensor& y) override {
    const int64_t k = x.cols(), n = w.dim(0), rows = x.rows();
    MOET_CHECK(w.dim(1) == k && y.cols() == n && y.rows() == rows, "matmul shape mismatch: x [{}, {}] w [{}, {}]", rows, k, n, w.dim(1));
    const OpScope scope(*this, [&] { return fmt::format("matmul[n={},k={}]", n, k); });
    const float* b = bias && !bias->empty() ? bias->as<float>() : nullptr;
    if (w.dtype == DType::bf16) {
      matmul_bf16(x.as<float>(), rows, k, w.as<uint16_t>(), n, b, y.as<float>(), pool_, isa_);
    } else if (w.dtype == DType::f8_e4m3) {
      MOET_CHECK(w.block_scales && w.block_scales->shape == fp8_block_scale_shape(n, k),
                 "matmul: FP8 weight [{}, {}] without its block scales", n, k);
      matmul_fp8_block(x.as<float>(), rows, k, w.as<uint8_t>(), w.block_scales->as<float>(), n, b, y.as<float>(),
                       pool_, isa_);
    } else {
      matmul_f32(x.as<float>(), rows, k, w.as<float>(), n, b, y.as<float>(), pool_, isa_);
    }
  }

  void read_regions(const std::vector<ByteRegion>& regions, Tensor& sink) override {
    check_read_regions(regions, sink);
    uint32_t acc = 0;
    for (const ByteRegion& r : regions) {
      const auto* words = static_cast<const uint32_t*>(r.data);
      for (int64_t i = 0; i < r.bytes / 4; ++i) acc ^= words[i];
    }
    *sink.as<uint32_t>() = acc;
  }

  void add(Tensor& y, const Tensor& x) override {
    const OpScope scope(*this, [] { return std::string("add"); });
    add_inplace(y.as<float>(), x.as<float>(), y.numel());
  }

  void silu_mul(const Tensor& gate_up, Tensor& out) override {
    const OpScope scope(*this, [] { return std::string("silu_mul"); });
    moet::silu_mul(gate_up.as<float>(), gate_up.rows(), gate_up.cols() / 2, out.as<float>());
  }

  void rope(const RopeTable& table, Tensor& x, int64_t heads, int64_t head_stride, int64_t offset) override {
    const OpScope scope(*this, [] { return std::string("rope"); });
    rope_apply(table, x.as<float>(), step_.rows, heads, x.numel() / step_.rows, head_stride, offset, step_.positions);
  }

  void rope_inverse(const RopeTable& table, Tensor& x, int64_t heads, int64_t head_stride, int64_t offset) override {
    const OpScope scope(*this, [] { return std::string("rope_inverse"); });
    rope_apply(table, x.as<float>(), step_.rows, heads, x.numel() / step_.rows, head_stride, offset, step_.positions,
               true);
  }

  void layernorm(const Tensor& x, const Tensor& weight, const Tensor& bias, float eps, Tensor& out) override {
    const int64_t dim = weight.numel();
    const OpScope scope(*this, [&] { return fmt::format("layernorm[dim={}]", dim); });
    moet::layernorm(x.as<float>(), x.numel() / dim, dim, weight.as<float>(), bias.as<float>(), eps, out.as<float>());
  }

  void silu_mul_clamped(const Tensor& gate_up, float limit, Tensor& out) override {
    const OpScope scope(*this, [] { return std::string("silu_mul"); });
    moet::silu_mul(gate_up.as<float>(), gate_up.rows(), gate_up.cols() / 2, out.as<float>(), limit);
  }

  void attention_gather(std::span<const AttentionKeys> sources, const Tensor& q, int64_t q_heads, int64_t q_stride,
                        float scale, const Tensor* sinks, Tensor& out) override;
  void indexer_topk(KvLayerCache& keys, const Tensor& q, int64_t heads, const Tensor& weights, float scale,
                    int64_t stride, Tensor& positions) override {
    const OpScope scope(*this, [] { return std::string("indexer_topk"); });
    const AttentionRows rows{step_.positions, step_.row_seq, step_.block_tables};
    moet::indexer_topk(keys.view, rows, q.as<float>(), step_.rows, heads, weights.as<float>(), scale, stride,
                       positions.cols(), positions.as<int32_t>(), pool_, isa_);
  }

  void kv_compress(const KvCompressOp& op, KvLayerCache& state, KvLayerCache& out) override {
    const OpScope scope(*this, [] { return std::string("kv_compress"); });
    const AttentionRows rows{step_.positions, step_.row_seq, step_.block_tables};
    moet::kv_compress({op.ratio, op.overlap, out.view.k_dim, op.eps}, state.view, rows, step_.rows,
                      op.position_bias->as<float>(), op.norm->as<float>(), *op.rope, out.view, pool_);
  }

  void hc_pre(const HyperConnectionWeights& w, const Tensor& streams, Tensor& post, Tensor& comb,
              Tensor& collapsed) override {
    const OpScope scope(*this, [] { return std::string("hc_pre"); });
    moet::hc_pre(hyper_params(w, collapsed.cols()), streams.as<float>(), collapsed.rows(), w.fn->as<float>(),
                 w.base->as<float>(), w.scale->as<float>(), post.as<float>(), comb.as<float>(), collapsed.as<float>(),
                 pool_, isa_);
  }
  void hc_post(const HyperConnectionWeights& w, Tensor& streams, const Tensor& block_out, const Tensor& post,
               const Tensor& comb) override {
    const OpScope scope(*this, [] { return std::string("hc_post"); });
    moet::hc_post(hyper_params(w, block_out.cols()), streams.as<float>(), block_out.rows(), block_out.as<float>(),
                  post.as<float>(), comb.as<float>(), pool_);
  }
  void hc_head(const HyperConnectionWeights& w, const Tensor& streams, Tensor& out) override {
    const OpScope scope(*this, [] { return std::string("hc_head"); });
    moet::hc_head(hyper_params(w, out.cols()), streams.as<float>(), out.rows(), w.fn->as<float>(), w.base->as<float>(),
                  w.scale->as<float>(), out.as<float>(), pool_, isa_);
  }

  void router_hash(const RouterParams& params, const Tensor& logits, const Tensor& table, Tensor& expert_ids,
                   Tensor& weights) override {
    const OpScope scope(*this, [] { return std::string("router_hash"); });
    moet::router_hash(params, logits.as<float>(), logits.rows(), step_.tokens, table.as<int32_t>(), table.dim(0),
                      expert_ids.as<int32_t>(), weights.as<float>());
  }

  void qk_norm_rope(const RopeTable& table, Tensor& q, int64_t q_heads, Tensor& k, int64_t k_heads, int64_t head_dim,
                    const Tensor& q_norm, const Tensor& k_norm, float eps) override {
    const OpScope scope(*this, [&] { return fmt::format("qk_norm_rope[dim={}]", head_dim); });
    const auto prologue = [&](Tensor& x, int64_t heads, const Tensor& norm) {
      float* values = x.as<float>();
      if (!norm.empty())
        moet::rmsnorm(values, x.numel() / head_dim, head_dim, head_dim, norm.as<float>(), eps, values, head_dim, pool_);
      rope_apply(table, values, step_.rows, heads, x.numel() / step_.rows, head_dim, 0, step_.positions);
    };
    prologue(q, q_heads, q_norm);
    prologue(k, k_heads, k_norm);
  }

  void kv_write(KvLayerCache& cache, const Tensor& k, const Tensor* v) override {
    const OpScope scope(*this, [] { return std::string("kv_write"); });
    kv_cache_write(cache.view, k.as<float>(), v ? v->as<float>() : nullptr, step_.rows, step_.slots);
  }

  void attention(KvLayerCache& cache, const Tensor& q, int64_t q_heads, int64_t q_stride, float scale,
                 Tensor& out) override {
    const OpScope scope(*this, [] { return std::string("attention"); });
    const AttentionRows rows{step_.positions, step_.row_seq, step_.block_tables};
    attention_paged(cache.view, rows, q.as<float>(), q.numel() / (q_heads * q_stride), q_heads,
                    q_stride, scale, out.as<float>(), pool_, isa_);
  }

  void router(const RouterParams& params, const Tensor& logits, Tensor& expert_ids, Tensor& weights) override {
    const OpScope scope(*this, [] { return std::string("router"); });
    router_topk(params, logits.as<float>(), logits.rows(), expert_ids.as<int32_t>(), weights.as<float>());
  }

  void moe_experts(const Tensor& x, const ExpertSet& experts, const Tensor& expert_ids, const Tensor& weights,
                   Tensor& out, bool accumulate) override;
  ExpertSlots alloc_expert_slots(const ExpertLayout& layout, const ExpertRowLayout& row, int64_t count) override;
  void expert_slots_load(ExpertSlots& slots, std::span<const int64_t> ids, std::span<const uint8_t* const> rows) override;
  void expert_slots_exchange(ExpertSlots& slots, std::span<const int64_t> ids, std::span<const uint8_t* const> in_rows,
                             std::span<uint8_t* const> out_rows) override;
  void expert_set_update(ExpertSet& set, std::span<const int64_t> experts,
                         std::span<const ExpertWeights> weights) override;
  void expert_set_add_tier(ExpertSet& set, ExpertFormat tier) override {
    MOET_CHECK(tier == ExpertFormat::w2 || tier == ExpertFormat::fp4, "an expert tier holds W2 or FP4 experts");
    set.tier_format = tier;
  }
  std::shared_ptr<uint8_t> alloc_pinned(size_t bytes) override {
    const size_t size = std::max<size_t>(4096, (bytes + 4095) / 4096 * 4096);
    auto* memory = static_cast<uint8_t*>(std::aligned_alloc(4096, size));
    MOET_CHECK(memory != nullptr, "out of host memory allocating {} bytes", size);
    return std::shared_ptr<uint8_t>(memory, std::free);
  }
  void fill_zero(Tensor& t) override { std::memset(t.data, 0, t.bytes()); }
  uint64_t memory_available() const override {
    std::ifstream meminfo("/proc/meminfo");
    for (std::string line; std::getline(meminfo, line);)
      if (line.rfind("MemAvailable:", 0) == 0) return std::stoull(line.substr(13)) * 1024;  // "...: N kB"
    return 0;
  }
  double upload_bandwidth(size_t bytes) override { return copy_bandwidth(bytes) / 2.0; }

  void copy_columns(const Tensor& src, int64_t src_stride, int64_t src_offset, Tensor& dst,
                    int64_t dst_stride, int64_t dst_offset, int64_t rows, int64_t width) override {
    const OpScope scope(*this, [] { return std::string("copy_columns"); });
    for (int64_t r = 0; r < rows; ++r)
      std::memcpy(dst.as<float>() + r * dst_stride + dst_offset, src.as<float>() + r * src_stride + src_offset,
                  sizeof(float) * size_t(width));
  }

  void top_logits(const Tensor& logits, int64_t k, Tensor& values, Tensor& ids) override {
    check_top_logits(logits, k, values, ids);
    const OpScope scope(*this, [] { return std::string("top_logits"); });
    const int64_t vocab = logits.dim(1);
    pool_.parallel_for(size_t(logits.dim(0)), [&](size_t begin, size_t end) {
      moet::top_logits(logits.as<float>() + int64_t(begin) * vocab, int64_t(end - begin), vocab, k,
                       values.as<float>() + int64_t(begin) * k, ids.as<int32_t>() + int64_t(begin) * k);
    });
  }

  void logit_confidence(const Tensor& logits, Tensor& out) override {
    check_logit_confidence(logits, out);
    const OpScope scope(*this, [] { return std::string("logit_confidence"); });
    const int64_t vocab = logits.dim(1);
    pool_.parallel_for(size_t(logits.dim(0)), [&](size_t begin, size_t end) {
      moet::logit_confidence(logits.as<float>() + int64_t(begin) * vocab, int64_t(end - begin), vocab,
                             out.as<float>() + int64_t(begin) * 2);
    });
  }

  void head_matmul(const Tensor& x, int64_t heads, int64_t x_stride, const Tensor& w, Tensor& y,
                   int64_t y_stride) override;

  void set_profiling(bool on) override { profiling_ = on; }
  std::vector<OpProfile> take_profile() override { return drain_profile(profile_); }

  void profiled(const std::function<std::string()>& name, const std::function<void()>& body) {
    const OpScope scope(*this, name);
    body();
  }

 private:
  // Wall time of an op while profiling; only the outermost op counts (moe_experts and
  // head_matmul call matmul, silu_mul and copy_columns inside).
  class OpScope {
   public:
    template <typename Name>
    OpScope(CpuBackend& backend, Name&& name) : backend_(backend), timed_(backend.profiling_ && backend.depth_ == 0) {
      ++backend_.depth_;
      if (timed_) {
        name_ = name();
        start_ = std::chrono::steady_clock::now();
      }
    }
    ~OpScope() {
      --backend_.depth_;
      if (!timed_) return;
      OpProfile& entry = backend_.profile_[name_];
      entry.op = name_;
      ++entry.calls;
      entry.seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
    }
    OpScope(const OpScope&) = delete;
    OpScope& operator=(const OpScope&) = delete;

   private:
    CpuBackend& backend_;
    bool timed_;
    std::string name_;
    std::chrono::steady_clock::time_point start_;
  };

  static HyperParams hyper_params(const HyperConnectionWeights& w, int64_t dim) {
    return {w.hc, dim, w.iters, w.eps, w.norm_eps};
  }
  // y = x @ W^T for one expert matrix in any ExpertFormat.
  void expert_matmul(const Tensor& x, ExpertFormat format, const Tensor& w, const Tensor& scales, Tensor& y);

  ThreadPool pool_;
  CpuIsa isa_;
  StepInputs step_;
  bool profiling_ = false;
  int depth_ = 0;
  std::map<std::string, OpProfile> profile_;
};

// Best-of-5 multi-threaded copy; GB/s counting read + write.
double CpuBackend::copy_bandwidth(size_t bytes) {
  std::unique_ptr<uint8_t[]> src(new uint8_t[bytes]), dst(new uint8_t[bytes]);
  pool_.parallel_for(bytes, [&](size_t b, size_t e) { std::memset(src.get() + b, 1, e - b); std::memset(dst.get() + b, 0, e - b); }, 1 << 20);
  double best = 0.0;
  for (int round = 0; round < 5; ++round) {
    const auto start = std::chrono::steady_clock::now();
    pool_.parallel_for(bytes, [&](size_t b, size_t e) { std::memcpy(dst.get() + b, src.get() + b, e - b); }, 1 << 20);
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    best = std::max(best, 2.0 * double(bytes) / seconds / 1e9);
  }
  return best;
}

ExpertSet CpuBackend::expert_set(const ExpertLayout& layout, std::vector<ExpertWeights> experts) {
  const DType dense_dtype = expert_set_check(layout, experts);
  return {layout, dense_dtype, std::move(experts), {}};
}

void CpuBackend::expert_matmul(const Tensor& x, ExpertFormat format, const Tensor& w, const Tensor& scales,
                               Tensor& y) {
  if (format == ExpertFormat::dense) return matmul(x, w, nullptr, y);
  auto run = format == ExpertFormat::w2 ? matmul_w2 : format == ExpertFormat::w2k ? matmul_w2k : matmul_fp4;
  run(x.as<float>(), x.rows(), x.cols(), w.as<uint8_t>(), scales.as<uint8_t>(), w.dim(0), y.as<float>(), pool_, isa_);
}

void CpuBackend::moe_experts(const Tensor& x, const ExpertSet& set, const Tensor& expert_ids,
                             const Tensor& weights, Tensor& out, bool accumulate) {
  const OpScope scope(*this, [] { return std::string("moe_experts"); });
  const std::vector<ExpertWeights>& experts = set.experts;
  const int64_t rows = x.rows(), hidden = x.cols(), top_k = expert_ids.cols();
  // Flat items (row * top_k + slot) per expert; ids outside the layer run nothing, absent experts
  // are recorded (each once) and run nothing, host entries are served by set.host (recorded as
  // used, their routings as not found on the backend).
  std::vector<std::vector<int64_t>> routed(experts.size());
  const ExpertTracking& track = set.tracking;
  bool any_host = false;
  for (int64_t i = 0; i < rows * top_k; ++i) {
    const int32_t e = expert_ids.as<int32_t>()[i];
    if (e < 0 || size_t(e) >= experts.size()) continue;
    const ExpertWeights& expert = experts[size_t(e)];
    const bool present = expert.present(), host = !present && expert.host && set.host.server;
    if (present || host) routed[size_t(e)].push_back(i);
    any_host = any_host || host;
    if (!track.used_bits) continue;
    const uint32_t bit = 1u << (e % 32);
    if (present || host) {
      track.used_bits[e / 32] |= bit;
    } else if (!(track.absent_bits[e / 32] & bit)) {
      track.absent_bits[e / 32] |= bit;
      ++*track.miss_count;
    }
    ++track.routed_items[!present ? 1 : expert.format == set.layout.format ? 0 : 2];
  }
  // The host's results for its items (valid[item] = 1 where it computed them).
  Tensor host_results, host_valid;
  if (any_host) {
    host_results = alloc({rows * top_k, hidden});
    host_valid = alloc({rows * top_k}, DType::i32);
    set.host.server->serve(set.host.layer, x.as<float>(), expert_ids.as<int32_t>(), weights.as<float>(), rows, top_k,
                           host_results.as<float>(), host_valid.as<int32_t>());
  }
  if (!accumulate) std::memset(out.data, 0, out.bytes());
  // The layer's own format's experts (and host entries) in ascending order, then the tier's (the
  // CUDA op's order).
  std::vector<size_t> order;
  for (const bool tier : {false, true})
    for (size_t e = 0; e < experts.size(); ++e)
      if (!routed[e].empty() && (experts[e].present() && experts[e].format != set.layout.format) == tier)
        order.push_back(e);
  for (const size_t e : order) {
    const auto& items = routed[e];
    const int64_t count = int64_t(items.size());
    if (!experts[e].present()) {  // served by the host
      for (const int64_t item : items) {
        if (!host_valid.as<int32_t>()[item]) continue;
        add_weighted(out.as<float>() + (item / top_k) * hidden, host_results.as<float>() + item * hidden,
                     weights.as<float>()[item], hidden);
      }
      continue;
    }
    const int64_t inner = experts[e].inner();
    Tensor gathered = alloc({count, hidden}), gate_up = alloc({count, 2 * inner});
    Tensor act = alloc({count, inner}), result = alloc({count, hidden});
    for (int64_t j = 0; j < count; ++j)
      std::memcpy(gathered.as<float>() + j * hidden, x.as<float>() + (items[size_t(j)] / top_k) * hidden,
                  sizeof(float) * size_t(hidden));
    expert_matmul(gathered, experts[e].format, experts[e].gate_up, experts[e].gate_up_scales, gate_up);
    moet::silu_mul(gate_up.as<float>(), count, inner, act.as<float>(), set.layout.swiglu_limit);
    expert_matmul(act, experts[e].format, experts[e].down, experts[e].down_scales, result);
    for (int64_t j = 0; j < count; ++j)
      add_weighted(out.as<float>() + (items[size_t(j)] / top_k) * hidden, result.as<float>() + j * hidden,
                   weights.as<float>()[items[size_t(j)]], hidden);
  }
}

// A slot is one host row, the four planes views into it (the CPU kernels read the pack layout).
ExpertSlots CpuBackend::alloc_expert_slots(const ExpertLayout& layout, const ExpertRowLayout& row, int64_t count) {
  MOET_CHECK(layout.format != ExpertFormat::dense, "expert slots hold W2, W2K or FP4 experts");
  MOET_CHECK(count > 0, "an expert slot pool needs slots (got {})", count);
  const uint64_t stride = (row.bytes + 63) / 64 * 64;
  std::shared_ptr<uint8_t> memory = alloc_pinned(size_t(stride * uint64_t(count)));
  const int64_t bits = expert_format_bits(layout.format), hidden = layout.hidden, inner = layout.inner;
  ExpertSlots slots{layout, row, {}, memory};
  for (int64_t i = 0; i < count; ++i) {
    uint8_t* base = memory.get() + uint64_t(i) * stride;
    const auto plane = [&](uint64_t offset, std::vector<int64_t> shape) {
      return Tensor{DType::u8, std::move(shape), memory, base + offset};
    };
    slots.weights.push_back({plane(row.codes13, {2 * inner, hidden * bits / 8}), plane(row.codes2, {hidden, inner * bits / 8}),
                             layout.format, plane(row.scales13, {2 * inner, hidden / 32}),
                             plane(row.scales2, {hidden, inner / 32})});
  }
  return slots;
}

void CpuBackend::expert_slots_load(ExpertSlots& slots, std::span<const int64_t> ids,
                                   std::span<const uint8_t* const> rows) {
  MOET_CHECK(ids.size() == rows.size(), "expert_slots_load: {} slots for {} rows", ids.size(), rows.size());
  for (int64_t id : ids) MOET_CHECK(id >= 0 && id < slots.count(), "expert slot {} outside the pool of {}", id, slots.count());
  pool_.parallel_for(ids.size(), [&](size_t begin, size_t end) {
    for (size_t i = begin; i < end; ++i) {
      uint8_t* base = static_cast<uint8_t*>(slots.weights[size_t(ids[i])].gate_up.data) - slots.row.codes13;
      std::memcpy(base, rows[i], slots.row.bytes);
    }
  }, 1);
}

// The slot's row back to the host, then the new row into it (one slot at a time: the rows differ).
void CpuBackend::expert_slots_exchange(ExpertSlots& slots, std::span<const int64_t> ids,
                                       std::span<const uint8_t* const> in_rows, std::span<uint8_t* const> out_rows) {
  MOET_CHECK(ids.size() == in_rows.size() && ids.size() == out_rows.size(),
             "expert_slots_exchange: {} slots for {} rows in and {} out", ids.size(), in_rows.size(), out_rows.size());
  for (int64_t id : ids)
    MOET_CHECK(id >= 0 && id < slots.count(), "expert slot {} outside the pool of {}", id, slots.count());
  pool_.parallel_for(ids.size(), [&](size_t begin, size_t end) {
    for (size_t i = begin; i < end; ++i) {
      uint8_t* base = static_cast<uint8_t*>(slots.weights[size_t(ids[i])].gate_up.data) - slots.row.codes13;
      std::memcpy(out_rows[i], base, slots.row.bytes);
      std::memcpy(base, in_rows[i], slots.row.bytes);
    }
  }, 1);
}

void CpuBackend::expert_set_update(ExpertSet& set, std::span<const int64_t> experts,
                                   std::span<const ExpertWeights> weights) {
  expert_set_assign(set, experts, weights);
  expert_set_check(set.layout, set.experts, set.tier_format);  // the CPU's layout is the pack's
}

void CpuBackend::attention_gather(std::span<const AttentionKeys> sources, const Tensor& q, int64_t q_heads,
                                  int64_t q_stride, float scale, const Tensor* sinks, Tensor& out) {
  const OpScope scope(*this, [] { return std::string("attention_gather"); });
  std::vector<KeySource> keys;
  for (const AttentionKeys& s : sources) {
    MOET_CHECK(s.cache->view.kv_heads == sources.front().cache->view.kv_heads &&
                   s.cache->view.k_dim == sources.front().cache->view.k_dim &&
                   s.cache->view.v_dim == sources.front().cache->view.v_dim,
               "attention_gather: every key source needs the same heads and dims");
    keys.push_back({s.cache->view, s.positions ? s.positions->as<int32_t>() : nullptr,
                    s.positions ? s.positions->cols() : 0, s.window, s.stride});
  }
  const AttentionRows rows{step_.positions, step_.row_seq, step_.block_tables};
  moet::attention_gather(keys, rows, q.as<float>(), step_.rows, q_heads, q_stride, scale,
                         sinks ? sinks->as<float>() : nullptr, out.as<float>(), pool_, isa_);
}

void CpuBackend::head_matmul(const Tensor& x, int64_t heads, int64_t x_stride, const Tensor& w,
                             Tensor& y, int64_t y_stride) {
  const int64_t n = w.dim(1), k = w.dim(2);
  MOET_CHECK(w.dtype == DType::bf16 || w.dtype == DType::f32, "head_matmul takes BF16 or F32 weights, not {}",
             dtype_name(w.dtype));
  const OpScope scope(*this, [&] { return fmt::format("head_matmul[heads={},n={},k={}]", heads, n, k); });
  const int64_t rows = x.numel() / (heads * x_stride);
  Tensor xin = alloc({rows, k}), yout = alloc({rows, n});
  const size_t head_bytes = size_t(n * k) * dtype_size(w.dtype);
  for (int64_t h = 0; h < heads; ++h) {
    copy_columns(x, heads * x_stride, h * x_stride, xin, k, 0, rows, k);
    Tensor wh = w;
    wh.shape = {n, k};
    wh.data = static_cast<uint8_t*>(w.data) + size_t(h) * head_bytes;
    matmul(xin, wh, nullptr, yout);
    copy_columns(yout, n, 0, y, heads * y_stride, h * y_stride, rows, n);
  }
}

}  // namespace

std::unique_ptr<Backend> cpu_backend_create(const CpuBackendOptions& options) {
  return std::make_unique<CpuBackend>(options);
}

void cpu_backend_profiled(Backend& backend, const std::function<std::string()>& name,
                          const std::function<void()>& body) {
  auto* cpu = dynamic_cast<CpuBackend*>(&backend);
  MOET_CHECK(cpu != nullptr, "{} is not the CPU backend", backend.name());
  cpu->profiled(name, body);
}

}  // namespace moet
