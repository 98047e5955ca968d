// The CUDA backend: every Backend op on one stream of one GPU, through kernels/cuda. Weights and
// activations live in a caching allocator under the memory budget (device_memory.h); host
// copies go through pinned staging buffers (two for uploads, so the memcpy into one overlaps the
// DMA out of the other); the per-step inputs are packed into one pinned buffer and uploaded in
// one copy by begin_step(). Nothing synchronises with the host except to_host(), the copy
// bandwidth measurement and memory-budget releases. Set MOET_CUDA_SYNC=1 to synchronise and check
// after every op (locates a faulting kernel).
// run_graph() captures a forward in a CUDA graph per key + step layout (its memory in a private
// pool of the allocator that the graph keeps) and replays it; MOET_CUDA_GRAPHS_MAX caps how many
// graphs are kept (least recently used dropped first). MOET_CUDA_PROFILE=1 (or set_profiling)
// times every op of eager steps with CUDA events, each op held behind a gate kernel until it is
// fully enqueued so the events measure GPU time, not launch latency (kernels/cuda/profile_gate.h).
#include "backend/cuda/cuda_backend.h"

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/device_memory.h"
#include "core/error.h"
#include "core/log.h"
#include "kernels/cuda/attention.h"
#include "kernels/cuda/elementwise.h"
#include "kernels/cuda/gemv.h"
#include "kernels/cuda/head_norm_rope.h"
#include "kernels/cuda/moe.h"
#include "kernels/cuda/moe_w2.h"
#include "kernels/cuda/profile_gate.h"
#include "kernels/cuda/read_regions.h"
#include "kernels/cuda/rmsnorm.h"
#include "kernels/cuda/router.h"
#include "kernels/cuda/w2_tiles.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <map>
#include <type_traits>
#include <utility>

namespace moet {
namespace {

using namespace moet::cuda;

// A page-locked host buffer and the event of the last copy that used it.
struct PinnedBuffer {
  void* data = nullptr;
  size_t bytes = 0;
  cudaEvent_t done = nullptr;

  void reserve(size_t want) {
    if (want <= bytes) return;
    wait();
    if (data) cudaFreeHost(data);
    bytes = std::max(want, bytes * 2);
    cuda_check(cudaMallocHost(&data, bytes), "cudaMallocHost");
  }
  void wait() const {
    if (done) cuda_check(cudaEventSynchronize(done), "waiting for a staging copy");
  }
  ~PinnedBuffer() {
    if (data) cudaFreeHost(data);
    if (done) cudaEventDestroy(done);
  }
};

constexpr size_t kStagingBytes = size_t(32) << 20;
constexpr uint64_t kGateTimeoutNs = 20'000'000;  // a profile gate gives up after 20 ms

struct GraphExecDeleter {
  void operator()(cudaGraphExec_t exec) const { cudaGraphExecDestroy(exec); }
};

// A captured forward: the executable graph, the private memory it reads and writes at replay
// time, and its output tensor (in that memory).
struct GraphEntry {
  std::shared_ptr<void> pool;
  Tensor output;
  std::unique_ptr<std::remove_pointer_t<cudaGraphExec_t>, GraphExecDeleter> exec;  // null: capture failed
  uint64_t last_use = 0;
};

class CudaBackend final : public Backend {
 public:
  explicit CudaBackend(const CudaBackendOptions& options) : memory_(budget_for(options)) {
    cuda_check(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "cudaStreamCreate");
    for (PinnedBuffer* buffer : {&staging_[0], &staging_[1], &step_staging_}) {
      cuda_check(cudaEventCreateWithFlags(&buffer->done, cudaEventDisableTiming), "cudaEventCreate");
    }
    staging_[0].reserve(kStagingBytes);
    staging_[1].reserve(kStagingBytes);
    attention_counters_ = device_tensor(DType::i32, {kAttentionMaxSplitUnits});
    cuda_check(cudaMemsetAsync(attention_counters_.data, 0, attention_counters_.bytes(), stream_), "cudaMemset");
    const char* sync = std::getenv("MOET_CUDA_SYNC");
    debug_sync_ = sync != nullptr && std::strcmp(sync, "0") != 0;
    graphs_enabled_ = options.graphs;
    if (const char* max = std::getenv("MOET_CUDA_GRAPHS_MAX")) max_graphs_ = std::max(1, std::atoi(max));
    memory_.set_pressure_handler([this] { clear_graphs(); });
    const char* profile = std::getenv("MOET_CUDA_PROFILE");
    set_profiling(profile != nullptr && std::strcmp(profile, "0") != 0);
    cudaDeviceProp prop{};
    cuda_check(cudaGetDeviceProperties(&prop, options.device), "cudaGetDeviceProperties");
    name_ = fmt::format("cuda ({}, sm_{}{}, budget {:.1f} GiB)", prop.name, prop.major, prop.minor,
                        double(memory_.budget()) / double(size_t(1) << 30));
  }
  ~CudaBackend() override {
    gate_release();
    cudaStreamSynchronize(stream_);
    graphs_.clear();
    memory_.set_pressure_handler({});
    for (cudaEvent_t event : events_) cudaEventDestroy(event);
    if (gate_host_) cudaFreeHost(gate_host_);
    cudaStreamDestroy(stream_);
  }

  std::string name() const override { return name_; }

  Tensor upload(const TensorInfo& info) override {
    if (info.dtype != DType::bf16 && info.dtype != DType::f32 && info.dtype != DType::u8) return upload_f32(info);
    Tensor t = device_tensor(info.dtype, info.shape);
    copy_to_device(t.data, info.data, info.bytes);
    return t;
  }

  Tensor upload_stacked(const TensorInfo& a, const TensorInfo& b) override {
    MOET_CHECK(a.dtype == b.dtype && a.shape.size() == 2 && b.shape.size() == 2 && a.shape[1] == b.shape[1],
               "cannot stack '{}' {} and '{}' {}", a.name, a.shape_text(), b.name, b.shape_text());
    if (a.dtype != DType::bf16 && a.dtype != DType::f32) {
      const std::vector<float> fa = widen(a), fb = widen(b);
      Tensor t = device_tensor(DType::f32, {a.shape[0] + b.shape[0], a.shape[1]});
      copy_to_device(t.data, fa.data(), fa.size() * sizeof(float));
      copy_to_device(static_cast<uint8_t*>(t.data) + fa.size() * sizeof(float), fb.data(), fb.size() * sizeof(float));
      return t;
    }
    Tensor t = device_tensor(a.dtype, {a.shape[0] + b.shape[0], a.shape[1]});
    copy_to_device(t.data, a.data, a.bytes);
    copy_to_device(static_cast<uint8_t*>(t.data) + a.bytes, b.data, b.bytes);
    return t;
  }

  Tensor upload_f32(const TensorInfo& info) override {
    const std::vector<float> values = widen(info);
    Tensor t = device_tensor(DType::f32, info.shape);
    copy_to_device(t.data, values.data(), values.size() * sizeof(float));
    return t;
  }

  Tensor alloc(std::vector<int64_t> shape, DType dtype = DType::f32) override {
    return device_tensor(dtype, std::move(shape));
  }

  KvLayerCache alloc_kv(int64_t blocks, int64_t block_size, int64_t kv_heads, int64_t k_dim, int64_t v_dim,
                        bool v_aliases_k) override {
    KvLayerCache cache;
    const int64_t slots = blocks * block_size, stride = kv_heads * k_dim;
    cache.k = device_tensor(DType::f32, {slots, stride});
    cuda_check(cudaMemsetAsync(cache.k.data, 0, cache.k.bytes(), stream_), "clearing the KV cache");
    if (v_aliases_k) {
      cache.v = cache.k;
    } else {
      MOET_CHECK(k_dim == v_dim, "separate K/V caches need k_dim == v_dim ({} vs {})", k_dim, v_dim);
      cache.v = device_tensor(DType::f32, {slots, stride});
      cuda_check(cudaMemsetAsync(cache.v.data, 0, cache.v.bytes(), stream_), "clearing the KV cache");
    }
    cache.view = {cache.k.as<float>(), cache.v.as<float>(), block_size, kv_heads, k_dim, v_dim, stride};
    return cache;
  }

  void to_host(const Tensor& src, void* dst) override {
    if (chain_) chain_end();
    const size_t bytes = src.bytes();
    for (size_t done = 0; done < bytes; done += kStagingBytes) {
      const size_t chunk = std::min(kStagingBytes, bytes - done);
      cuda_check(cudaMemcpyAsync(staging_[0].data, static_cast<const uint8_t*>(src.data) + done, chunk,
                                 cudaMemcpyDeviceToHost, stream_), "device-to-host copy");
      cuda_check(cudaStreamSynchronize(stream_), "device-to-host copy");
      std::memcpy(static_cast<uint8_t*>(dst) + done, staging_[0].data, chunk);
    }
  }

  void from_host(const void* src, Tensor& dst) override { copy_to_device(dst.data, src, dst.bytes()); }

  ExpertSet expert_set(std::vector<ExpertWeights> experts) override {
    MOET_CHECK(!experts.empty(), "an MoE layer needs experts");
    // W2 planes are replaced by their tiles below, so compare against the first expert's originals.
    const ExpertFormat format = experts.front().format;
    const DType dtype = experts.front().gate_up.dtype;
    const std::vector<int64_t> gate_up_shape = experts.front().gate_up.shape, down_shape = experts.front().down.shape;
    std::vector<ExpertPointers> pointers;
    Tensor bad_scale;
    for (ExpertWeights& e : experts) {
      MOET_CHECK(e.format == format && e.gate_up.dtype == dtype && e.down.dtype == dtype &&
                     e.gate_up.shape == gate_up_shape && e.down.shape == down_shape,
                 "the experts of one layer must share format, dtype and shapes");
      if (e.format == ExpertFormat::dense) {
        pointers.push_back({e.gate_up.data, e.down.data, nullptr, nullptr});
        continue;
      }
      // Block formats: U8 codes [rows, cols * bits / 8] and UE8M0 scales [rows, cols / 32].
      const int64_t bits = e.format == ExpertFormat::w2 ? 2 : 4;
      const int64_t hidden = e.gate_up.dim(1) * 8 / bits, inner = e.down.dim(1) * 8 / bits;
      MOET_CHECK(e.gate_up.dtype == DType::u8 && e.gate_up_scales.dtype == DType::u8 &&
                     e.down_scales.dtype == DType::u8 && e.gate_up.dim(0) == 2 * inner &&
                     e.down.dim(0) == hidden && hidden % 32 == 0 && inner % 32 == 0 &&
                     e.gate_up_scales.numel() == 2 * inner * (hidden / 32) &&
                     e.down_scales.numel() == hidden * (inner / 32),
                 "malformed {} expert planes: gate_up [{}, {}] down [{}, {}]", bits == 2 ? "W2" : "FP4",
                 e.gate_up.dim(0), e.gate_up.dim(1), e.down.dim(0), e.down.dim(1));
      MOET_CHECK(aligned(e.gate_up.data, 16) && aligned(e.down.data, 16),
                 "expert code planes must be 16-byte aligned");
      if (e.format == ExpertFormat::w2) {
        if (bad_scale.empty()) {
          bad_scale = device_tensor(DType::i32, {1});
          cuda_check(cudaMemsetAsync(bad_scale.data, 0, sizeof(int32_t), stream_), "cudaMemset");
        }
        tile_w2(e.gate_up, e.gate_up_scales, true, bad_scale);
        tile_w2(e.down, e.down_scales, false, bad_scale);
      }
      pointers.push_back({e.gate_up.data, e.down.data, static_cast<const uint8_t*>(e.gate_up_scales.data),
                          static_cast<const uint8_t*>(e.down_scales.data)});
    }
    if (!bad_scale.empty()) {
      int32_t bad = 0;
      to_host(bad_scale, &bad);
      MOET_CHECK(bad == 0, "a W2 expert has a block scale >= 2^126, beyond what the CUDA kernels take");
    }
    ExpertSet set{std::move(experts), device_tensor(DType::u8, {int64_t(pointers.size() * sizeof(ExpertPointers))})};
    copy_to_device(set.table.data, pointers.data(), pointers.size() * sizeof(ExpertPointers));
    return set;
  }

  double copy_bandwidth(size_t bytes) override;
  void begin_step(const StepInputs& step) override;

  void embedding(const Tensor& table, Tensor& out) override {
    const int64_t vocab = table.dim(0);
    if (step_.vocab != vocab)  // begin_step() checked the ids against step.vocab
      for (int64_t t = 0; t < step_.rows; ++t)
        MOET_CHECK(step_.tokens[t] >= 0 && step_.tokens[t] < vocab, "token id {} outside the vocabulary [0, {})",
                   step_.tokens[t], vocab);
    embedding_launch(step_ints(kTokens), step_.rows, table.data, is_bf16(table), table.dim(1), out.as<float>(), stream_);
    check_launch("embedding");
  }

  void rmsnorm(const Tensor& x, const Tensor& weight, float eps, Tensor& out) override {
    const int64_t dim = weight.numel();
    check_norm_dim(dim);
    rmsnorm_launch(x.as<float>(), x.numel() / dim, dim, weight.as<float>(), eps, out.as<float>(), stream_);
    check_launch("rmsnorm", [&] { return fmt::format("rmsnorm[dim={}]", dim); });
  }

  void add_rmsnorm(Tensor& residual, const Tensor& delta, const Tensor& weight, float eps, Tensor& out) override {
    const int64_t dim = weight.numel();
    check_norm_dim(dim);
    add_rmsnorm_launch(residual.as<float>(), delta.as<float>(), residual.numel() / dim, dim, weight.as<float>(), eps,
                       out.as<float>(), stream_);
    check_launch("add_rmsnorm", [&] { return fmt::format("add_rmsnorm[dim={}]", dim); });
  }

  void matmul(const Tensor& x, const Tensor& w, const Tensor* bias, Tensor& y) override {
    const int64_t k = x.cols(), n = w.dim(0), rows = x.rows();
    MOET_CHECK(w.dim(1) == k && y.cols() == n && y.rows() == rows, "matmul shape mismatch: x [{}, {}] w [{}, {}]",
               rows, k, n, w.dim(1));
    const float* b = bias && !bias->empty() ? bias->as<float>() : nullptr;
    gemv_launch({x.as<float>(), k, 0, w.data, is_bf16(w), 0, b, y.as<float>(), n, 0, rows, n, k, 1}, stream_);
    check_launch("matmul", [&] { return fmt::format("matmul[n={},k={}]", n, k); });
  }

  void read_regions(const std::vector<ByteRegion>& regions, Tensor& sink) override {
    check_read_regions(regions, sink);
    ReadRegions r;
    for (const ByteRegion& region : regions) {
      r.data[r.count] = region.data;
      r.bytes[r.count++] = region.bytes;
    }
    read_regions_index(r);
    cuda_check(cudaMemsetAsync(sink.data, 0, sizeof(uint32_t), stream_), "cudaMemset");
    read_regions_launch(r, sink.as<uint32_t>(), stream_);
    check_launch("read_regions");
  }

  void add(Tensor& y, const Tensor& x) override {
    add_launch(y.as<float>(), x.as<float>(), y.numel(), stream_);
    check_launch("add");
  }

  void silu_mul(const Tensor& gate_up, Tensor& out) override {
    silu_mul_launch(gate_up.as<float>(), gate_up.rows(), gate_up.cols() / 2, out.as<float>(), stream_);
    check_launch("silu_mul");
  }

  void rope(const RopeTable& table, Tensor& x, int64_t heads, int64_t head_stride, int64_t offset) override {
    const HeadSet set{x.as<float>(), heads, x.numel() / step_.rows, head_stride, nullptr, 0, offset};
    head_norm_rope_launch(rope_args(table), set, {}, step_.rows, 0.0f, step_ints(kPositions), stream_);
    check_launch("rope");
  }

  void qk_norm_rope(const RopeTable& table, Tensor& q, int64_t q_heads, Tensor& k, int64_t k_heads, int64_t head_dim,
                    const Tensor& q_norm, const Tensor& k_norm, float eps) override {
    const auto [q_set, k_set] = prologue_sets(table, q, q_heads, k, k_heads, head_dim, q_norm, k_norm);
    head_norm_rope_launch(rope_args(table), q_set, k_set, step_.rows, eps, step_ints(kPositions), stream_);
    check_launch("qk_norm_rope", [&] { return fmt::format("qk_norm_rope[dim={}]", head_dim); });
  }

  // One launch: the prologue's k warps also store their heads into the step's slots, and v gets
  // warps of its own that copy it there.
  void qk_norm_rope_kv_write(const RopeTable& table, Tensor& q, int64_t q_heads, Tensor& k, int64_t k_heads,
                             int64_t head_dim, const Tensor& q_norm, const Tensor& k_norm, float eps, const Tensor& v,
                             KvLayerCache& cache) override {
    const PagedKv& view = cache.view;
    MOET_CHECK(view.kv_heads == k_heads && view.k_dim == head_dim && view.v_dim == head_dim && view.v != view.k,
               "qk_norm_rope_kv_write: a cache of {} heads of {} / {} floats{} for {} k heads of {}", view.kv_heads,
               view.k_dim, view.v_dim, view.v == view.k ? " (V aliasing K)" : "", k_heads, head_dim);
    const auto [q_set, k_set] = prologue_sets(table, q, q_heads, k, k_heads, head_dim, q_norm, k_norm);
    const KvStore store{kv_args(cache), v.as<float>(), step_slots()};
    head_norm_rope_kv_launch(rope_args(table), q_set, k_set, store, step_.rows, eps, step_ints(kPositions), stream_);
    check_launch("qk_norm_rope_kv_write", [&] { return fmt::format("qk_norm_rope_kv_write[dim={}]", head_dim); });
  }

  void kv_write(KvLayerCache& cache, const Tensor& k, const Tensor* v) override {
    kv_write_launch(kv_args(cache), k.as<float>(), v ? v->as<float>() : nullptr, step_slots(), step_.rows, stream_);
    check_launch("kv_write");
  }

  // Key counts come from the device (positions), so nothing here depends on the context length
  // beyond the table stride bucket (part of every graph key); split steps (decode-sized, same
  // bits either way: attention.h) get partials scratch and the persistent zeroed counters.
  void attention(KvLayerCache& cache, const Tensor& q, int64_t q_heads, int64_t q_stride, float scale,
                 Tensor& out) override {
    const PagedKv& view = cache.view;
    MOET_CHECK(view.k_dim <= kAttentionMaxKDim && view.v_dim <= kAttentionMaxVDim && q_heads % view.kv_heads == 0,
               "attention with {} query heads over {} KV heads of {} / {} floats is not supported on CUDA (at most "
               "{} / {})", q_heads, view.kv_heads, view.k_dim, view.v_dim, kAttentionMaxKDim, kAttentionMaxVDim);
    const int64_t rows = q.numel() / (q_heads * q_stride);
    AttentionArgs args{kv_args(cache), step_ints(kPositions), step_ints(kRowSeq), step_tables(), table_stride_,
                       q.as<float>(), rows, q_heads, q_stride, scale, out.as<float>(),
                       table_stride_ * step_.block_size, nullptr, attention_counters_.as<int32_t>()};
    Tensor partials;
    if (const int64_t floats = attention_partial_floats(args); floats > 0) {
      partials = alloc({floats});
      args.partials = partials.as<float>();
    }
    attention_launch(args, stream_);
    check_launch("attention");
  }

  void router(const RouterParams& p, const Tensor& logits, Tensor& expert_ids, Tensor& weights) override {
    MOET_CHECK(p.experts <= 1024 && p.top_k <= 64 && p.groups <= 1024, "router shape not supported on CUDA");
    router_launch({p.experts, p.top_k, p.sigmoid, p.normalize, p.scaling, p.groups, p.top_groups, p.correction_bias},
                  logits.as<float>(), logits.rows(), expert_ids.as<int32_t>(), weights.as<float>(), stream_);
    check_launch("router");
  }

  void moe_experts(const Tensor& x, const ExpertSet& set, const Tensor& expert_ids, const Tensor& weights,
                   Tensor& out) override;

  void copy_columns(const Tensor& src, int64_t src_stride, int64_t src_offset, Tensor& dst, int64_t dst_stride,
                    int64_t dst_offset, int64_t rows, int64_t width) override {
    cuda_check(cudaMemcpy2DAsync(dst.as<float>() + dst_offset, size_t(dst_stride) * sizeof(float),
                                 src.as<float>() + src_offset, size_t(src_stride) * sizeof(float),
                                 size_t(width) * sizeof(float), size_t(rows), cudaMemcpyDeviceToDevice, stream_),
               "copy_columns");
    check_launch("copy_columns");
  }

  void head_matmul(const Tensor& x, int64_t heads, int64_t x_stride, const Tensor& w, Tensor& y,
                   int64_t y_stride) override {
    const int64_t n = w.dim(1), k = w.dim(2), rows = x.numel() / (heads * x_stride);
    gemv_launch({x.as<float>(), heads * x_stride, x_stride, w.data, is_bf16(w), n * k, nullptr, y.as<float>(),
                 heads * y_stride, y_stride, rows, n, k, heads}, stream_);
    check_launch("head_matmul", [&] { return fmt::format("head_matmul[heads={},n={},k={}]", heads, n, k); });
  }

  Tensor run_graph(const GraphKey& key, const std::function<Tensor()>& body) override;
  bool set_graphs(bool enabled) override { return graphs_enabled_ = enabled; }
  bool graphs() const override { return graphs_enabled_; }
  GraphStats graph_stats() const override {
    GraphStats stats = graph_stats_;
    stats.cached = int64_t(std::count_if(graphs_.begin(), graphs_.end(), [](const auto& g) { return bool(g.second.exec); }));
    return stats;
  }
  void clear_graphs() override {
    if (graphs_.empty()) return;
    gate_release();  // a profiled op in flight must not hold the synchronisation up
    cuda_check(cudaStreamSynchronize(stream_), "synchronising before dropping CUDA graphs");
    graphs_.clear();
  }

  void set_profiling(bool on) override;
  std::vector<OpProfile> take_profile() override;

 private:
  enum StepField { kTokens, kPositions, kRowSeq };

  static size_t budget_for(const CudaBackendOptions& options) {
    cuda_check(cudaSetDevice(options.device), "cudaSetDevice");
    size_t free_bytes = 0, total = 0;
    cuda_check(cudaMemGetInfo(&free_bytes, &total), "cudaMemGetInfo");
    if (options.memory_limit_gib > 0) return size_t(options.memory_limit_gib * double(size_t(1) << 30));
    return size_t(options.memory_utilization * double(total));
  }

  // Replaces a W2 plane pair [rows, cols / 4] + [rows, cols / 32] by its tensor-core tiles
  // (kernels/cuda/w2_tiles.h), shaped as the planes of cols rounded up to 128.
  void tile_w2(Tensor& codes, Tensor& scales, bool gate_up, Tensor& bad_scale) {
    const int64_t rows = codes.dim(0), cols = codes.dim(1) * 4;
    const W2TileShape shape = w2_tile_shape(rows, cols);
    const int64_t padded = shape.chunks * kW2ChunkCols;
    // One plane of records (codes and scales together, w2_tiles.h); the two tensors keep their
    // shapes over it, the scales one pointing at the first record's scale bytes.
    Tensor tiled = device_tensor(DType::u8, {int64_t(shape.bytes())});
    w2_tile_launch(static_cast<const uint8_t*>(codes.data), static_cast<const uint8_t*>(scales.data), rows, cols,
                   gate_up, tiled.as<uint8_t>(), bad_scale.as<int32_t>(), stream_);
    check_launch("w2_tile");
    codes = Tensor{DType::u8, {rows, padded / 4}, tiled.storage, tiled.data};
    scales = Tensor{DType::u8, {rows, padded / 32}, tiled.storage, tiled.as<uint8_t>() + kW2ChunkCodeBytes};
  }

  static void check_norm_dim(int64_t dim) {
    MOET_CHECK(dim <= kRmsNormMaxDim, "rmsnorm over {} floats is not supported on CUDA (at most {})", dim,
               kRmsNormMaxDim);
  }

  static RopeArgs rope_args(const RopeTable& table) {
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
  static std::pair<HeadSet, HeadSet> prologue_sets(const RopeTable& table, Tensor& q, int64_t q_heads, Tensor& k,
                                                   int64_t k_heads, int64_t head_dim, const Tensor& q_norm,
                                                   const Tensor& k_norm) {
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

  static bool aligned(const void* p, size_t bytes) { return reinterpret_cast<uintptr_t>(p) % bytes == 0; }

  static bool is_bf16(const Tensor& t) {
    MOET_CHECK(t.dtype == DType::bf16 || t.dtype == DType::f32, "CUDA ops take BF16 or F32 weights, not {}",
               dtype_name(t.dtype));
    return t.dtype == DType::bf16;
  }

  static std::vector<float> widen(const TensorInfo& info) {
    std::vector<float> out(size_t(info.numel()));
    const auto* half = reinterpret_cast<const uint16_t*>(info.data);
    switch (info.dtype) {
      case DType::f32: std::memcpy(out.data(), info.data, info.bytes); break;
      case DType::bf16: for (size_t i = 0; i < out.size(); ++i) out[i] = bf16_to_float(half[i]); break;
      case DType::f16: for (size_t i = 0; i < out.size(); ++i) out[i] = f16_to_float(half[i]); break;
      default:
        fail("tensor '{}' ({}): dtype {} is not supported by the CUDA backend yet", info.name, info.file,
             dtype_name(info.dtype));
    }
    return out;
  }

  Tensor device_tensor(DType dtype, std::vector<int64_t> shape) {
    Tensor t;
    t.dtype = dtype;
    t.shape = std::move(shape);
    t.storage = memory_.allocate(t.bytes());
    t.data = t.storage.get();
    return t;
  }

  // Host -> device through the two staging buffers, alternating; returns before the DMA ends.
  void copy_to_device(void* dst, const void* src, size_t bytes) {
    for (size_t done = 0; done < bytes; done += kStagingBytes) {
      PinnedBuffer& buffer = staging_[next_staging_];
      next_staging_ ^= 1;
      const size_t chunk = std::min(kStagingBytes, bytes - done);
      buffer.wait();
      std::memcpy(buffer.data, static_cast<const uint8_t*>(src) + done, chunk);
      cuda_check(cudaMemcpyAsync(static_cast<uint8_t*>(dst) + done, buffer.data, chunk, cudaMemcpyHostToDevice,
                                 stream_), "host-to-device copy");
      cuda_check(cudaEventRecord(buffer.done, stream_), "cudaEventRecord");
    }
  }

  void check_launch(const char* op) {
    check_launch(op, [op] { return std::string(op); });
  }
  // After an op's launches: checks them; while profiling an eager step, closes the op's event
  // pair (its profile name from `name()`) and opens the next op's gate. Nothing synchronises
  // while a graph is being captured.
  template <typename Name>
  void check_launch(const char* op, Name&& name) {
    cuda_check(cudaGetLastError(), op);
    const bool chained = chain_ && !capturing_;
    if (chained) chain_op(name());
    if (debug_sync_ && !capturing_) cuda_check(cudaStreamSynchronize(stream_), op);
    if (chained) chain_open();
  }

  // The per-op profile chain of an eager step (begin_step() to the next to_host()).
  cudaEvent_t chain_event() {
    if (events_used_ == events_.size()) {
      cudaEvent_t event = nullptr;
      cuda_check(cudaEventCreate(&event), "cudaEventCreate");
      events_.push_back(event);
    }
    return events_[events_used_++];
  }
  void gate_release() {
    if (gate_host_) __atomic_store_n(gate_host_, gate_value_, __ATOMIC_SEQ_CST);
  }
  // Holds the stream behind a gate until the next op is enqueued, then marks the op's start.
  void chain_open() {
    ++gate_value_;
    profile_gate_launch(gate_device_, gate_value_, kGateTimeoutNs, stream_);
    cuda_check(cudaGetLastError(), "profile gate");
    chain_start_ = chain_event();
    cuda_check(cudaEventRecord(chain_start_, stream_), "cudaEventRecord");
  }
  void chain_op(std::string name) {
    cudaEvent_t stop = chain_event();
    cuda_check(cudaEventRecord(stop, stream_), "cudaEventRecord");
    chain_ops_.push_back({std::move(name), chain_start_, stop});
    gate_release();
  }
  // Waits for the chain's ops and adds their times to the profile.
  void chain_end() {
    gate_release();
    chain_ = false;
    cuda_check(cudaStreamSynchronize(stream_), "per-op profile");
    for (const ChainOp& op : chain_ops_) {
      float ms = 0.0f;
      cuda_check(cudaEventElapsedTime(&ms, op.start, op.stop), "cudaEventElapsedTime");
      OpProfile& entry = profile_[op.name];
      entry.op = op.name;
      ++entry.calls;
      entry.seconds += double(ms) * 1e-3;
    }
    chain_ops_.clear();
    events_used_ = 0;
  }
  void evict_oldest_graph() {
    auto oldest = std::min_element(graphs_.begin(), graphs_.end(),
                                   [](const auto& a, const auto& b) { return a.second.last_use < b.second.last_use; });
    if (oldest->second.exec) {
      gate_release();
      cuda_check(cudaStreamSynchronize(stream_), "synchronising before dropping a CUDA graph");
    }
    graphs_.erase(oldest);
  }

  PagedKvArgs kv_args(KvLayerCache& cache) const {
    const PagedKv& v = cache.view;
    return {v.k, v.v, v.block_size, v.kv_heads, v.k_dim, v.v_dim, v.token_stride};
  }

  const int32_t* step_ints(StepField field) const {
    return reinterpret_cast<const int32_t*>(step_device_.get()) + int64_t(field) * step_.rows;
  }
  const int64_t* step_slots() const {
    return reinterpret_cast<const int64_t*>(static_cast<const uint8_t*>(step_device_.get()) + slots_offset_);
  }
  const int32_t* step_tables() const {
    return reinterpret_cast<const int32_t*>(static_cast<const uint8_t*>(step_device_.get()) + tables_offset_);
  }

  DeviceMemory memory_;
  cudaStream_t stream_ = nullptr;
  PinnedBuffer staging_[2];
  int next_staging_ = 0;
  PinnedBuffer step_staging_;
  std::shared_ptr<void> step_device_;
  size_t step_device_bytes_ = 0;
  StepInputs step_;
  std::vector<int64_t> seq_blocks_;  // begin_step(): blocks each sequence's rows need
  size_t slots_offset_ = 0, tables_offset_ = 0;
  int64_t table_stride_ = 0;
  Tensor attention_counters_;  // zeros between attention launches (attention.h)
  bool debug_sync_ = false;
  std::string name_;

  // CUDA graphs (run_graph), keyed by the caller's key + the step layout.
  bool graphs_enabled_ = true, capturing_ = false;
  int64_t max_graphs_ = 32;
  uint64_t graph_clock_ = 0;
  std::map<GraphKey, GraphEntry> graphs_;
  GraphStats graph_stats_;

  // Per-op profile.
  struct ChainOp {
    std::string name;
    cudaEvent_t start, stop;
  };
  bool profiling_ = false, chain_ = false;
  uint32_t* gate_host_ = nullptr;  // mapped pinned memory the gate kernels poll
  uint32_t* gate_device_ = nullptr;
  uint32_t gate_value_ = 0;
  std::vector<cudaEvent_t> events_;
  size_t events_used_ = 0;
  cudaEvent_t chain_start_ = nullptr;
  std::vector<ChainOp> chain_ops_;
  std::map<std::string, OpProfile> profile_;
};

// Packs tokens, positions, row_seq (int32 [rows] each), slots (int64 [rows]) and the block tables
// (int32 [sequences, table_stride]) into one pinned buffer and uploads it in one copy. The table
// stride is the block count the step's longest sequence needs rounded up to a power of two, so a
// captured graph (whose key includes the stride) stays valid while contexts grow within the
// bucket; each sequence's row holds the blocks its own rows need, zero-padded (never read). The
// device buffer only grows (geometrically); moving it drops the graphs, which read it in place.
void CudaBackend::begin_step(const StepInputs& step) {
  MOET_CHECK(step.rows > 0 && step.block_size > 0 && step.sequences > 0, "malformed step inputs");
  if (chain_) chain_end();  // a profiled step that never reached to_host()
  const int64_t block_size = step.block_size;
  seq_blocks_.assign(size_t(step.sequences), 0);
  for (int64_t t = 0; t < step.rows; ++t) {
    const int32_t seq = step.row_seq[t], pos = step.positions[t];
    MOET_CHECK(seq >= 0 && seq < step.sequences && pos >= 0, "step row {}: sequence {} / position {} out of range",
               t, seq, pos);
    if (step.vocab > 0)
      MOET_CHECK(step.tokens[t] >= 0 && step.tokens[t] < step.vocab, "token id {} outside the vocabulary [0, {})",
                 step.tokens[t], step.vocab);
    seq_blocks_[size_t(seq)] = std::max(seq_blocks_[size_t(seq)], (int64_t(pos) + block_size) / block_size);
  }
  const int64_t max_blocks = *std::max_element(seq_blocks_.begin(), seq_blocks_.end());
  int64_t stride = 1;
  while (stride < max_blocks) stride *= 2;
  step_ = step;
  table_stride_ = stride;
  slots_offset_ = (size_t(3 * step.rows) * sizeof(int32_t) + 7) / 8 * 8;
  tables_offset_ = slots_offset_ + size_t(step.rows) * sizeof(int64_t);
  const size_t bytes = tables_offset_ + size_t(step.sequences * table_stride_) * sizeof(int32_t);
  if (bytes > step_device_bytes_) {
    clear_graphs();
    step_device_bytes_ = std::max({bytes, 2 * step_device_bytes_, size_t(64) << 10});
    step_device_.reset();
    step_device_ = memory_.allocate(step_device_bytes_);
  }
  step_staging_.reserve(bytes);
  step_staging_.wait();
  auto* ints = static_cast<int32_t*>(step_staging_.data);
  std::memcpy(ints, step.tokens, size_t(step.rows) * sizeof(int32_t));
  std::memcpy(ints + step.rows, step.positions, size_t(step.rows) * sizeof(int32_t));
  std::memcpy(ints + 2 * step.rows, step.row_seq, size_t(step.rows) * sizeof(int32_t));
  auto* base = static_cast<uint8_t*>(step_staging_.data);
  std::memcpy(base + slots_offset_, step.slots, size_t(step.rows) * sizeof(int64_t));
  auto* tables = reinterpret_cast<int32_t*>(base + tables_offset_);
  for (int64_t s = 0; s < step.sequences; ++s) {
    const int64_t used = seq_blocks_[size_t(s)];
    if (used > 0) std::memcpy(tables + s * table_stride_, step.block_tables[s], size_t(used) * sizeof(int32_t));
    std::fill(tables + s * table_stride_ + used, tables + (s + 1) * table_stride_, 0);
  }
  if (profiling_) {
    chain_ = true;
    chain_open();
  }
  cuda_check(cudaMemcpyAsync(step_device_.get(), step_staging_.data, bytes, cudaMemcpyHostToDevice, stream_),
             "uploading the step inputs");
  cuda_check(cudaEventRecord(step_staging_.done, stream_), "cudaEventRecord");
  check_launch("step_upload");
}

// Replays the graph of (key, step layout), or captures body() into a new one (relaxed capture
// mode: the allocator may cudaMalloc; every allocation goes to a private pool the graph keeps)
// and launches it. A capture that fails (an op that cannot be captured, the budget) is logged,
// remembered, and that key runs eagerly from then on.
Tensor CudaBackend::run_graph(const GraphKey& key, const std::function<Tensor()>& body) {
  if (!graphs_enabled_ || capturing_ || !step_device_) return body();
  GraphKey full = key;
  full.values.insert(full.values.end(), {step_.rows, step_.sequences, table_stride_, step_.block_size});
  const auto name = [this] { return fmt::format("cuda_graph[rows={}]", step_.rows); };
  if (auto it = graphs_.find(full); it != graphs_.end()) {
    if (!it->second.exec) return body();
    it->second.last_use = ++graph_clock_;
    cuda_check(cudaGraphLaunch(it->second.exec.get(), stream_), "cudaGraphLaunch");
    ++graph_stats_.replays;
    check_launch("cuda_graph", name);
    return it->second.output;
  }
  while (!graphs_.empty() && int64_t(graphs_.size()) >= max_graphs_) evict_oldest_graph();
  GraphEntry entry;
  std::string error;
  entry.pool = memory_.begin_private();
  if (const cudaError_t begin = cudaStreamBeginCapture(stream_, cudaStreamCaptureModeRelaxed); begin != cudaSuccess) {
    error = fmt::format("cudaStreamBeginCapture: {}", cudaGetErrorString(begin));
    memory_.end_private();
  } else {
    capturing_ = true;
    try {
      entry.output = body();
    } catch (const std::exception& e) {
      error = e.what();
    }
    capturing_ = false;
    cudaGraph_t graph = nullptr;
    const cudaError_t end = cudaStreamEndCapture(stream_, &graph);
    memory_.end_private();
    if (error.empty() && end != cudaSuccess) error = fmt::format("cudaStreamEndCapture: {}", cudaGetErrorString(end));
    if (error.empty()) {
      cudaGraphExec_t exec = nullptr;
      if (const cudaError_t made = cudaGraphInstantiate(&exec, graph, 0); made != cudaSuccess) {
        error = fmt::format("cudaGraphInstantiate: {}", cudaGetErrorString(made));
      } else {
        entry.exec.reset(exec);
      }
    }
    if (graph) cudaGraphDestroy(graph);
  }
  if (!error.empty()) {
    cudaGetLastError();  // the failed capture's error is not the next op's
    ++graph_stats_.failures;
    MOET_LOG_WARN("CUDA graph capture failed ({}); steps of this shape ({} rows) run eagerly", error, step_.rows);
    entry = GraphEntry{};
    graphs_.emplace(std::move(full), GraphEntry{});
    return body();
  }
  cuda_check(cudaGraphLaunch(entry.exec.get(), stream_), "cudaGraphLaunch");
  ++graph_stats_.captures;
  entry.last_use = ++graph_clock_;
  Tensor output = entry.output;
  graphs_.emplace(std::move(full), std::move(entry));
  check_launch("cuda_graph", name);
  return output;
}

void CudaBackend::set_profiling(bool on) {
  if (!on && chain_) chain_end();
  if (on && gate_host_ == nullptr) {
    void* host = nullptr;
    cuda_check(cudaHostAlloc(&host, sizeof(uint32_t), cudaHostAllocMapped), "cudaHostAlloc (profile gate)");
    gate_host_ = static_cast<uint32_t*>(host);
    *gate_host_ = gate_value_;
    void* device = nullptr;
    cuda_check(cudaHostGetDevicePointer(&device, host, 0), "cudaHostGetDevicePointer (profile gate)");
    gate_device_ = static_cast<uint32_t*>(device);
  }
  profiling_ = on;
}

std::vector<OpProfile> CudaBackend::take_profile() {
  if (chain_) chain_end();
  return drain_profile(profile_);
}

void CudaBackend::moe_experts(const Tensor& x, const ExpertSet& set, const Tensor& expert_ids, const Tensor& weights,
                              Tensor& out) {
  const int64_t rows = x.rows(), hidden = x.cols(), top_k = expert_ids.cols();
  const ExpertWeights& first = set.experts.front();
  const int64_t experts = int64_t(set.experts.size()), inner = first.inner();
  const bool w2 = first.format == ExpertFormat::w2;
  MOET_CHECK(first.format == ExpertFormat::dense || hidden == first.down.dim(0),
             "moe_experts: x has {} columns, the experts {}", hidden, first.down.dim(0));
  const int64_t items = rows * top_k;
  Tensor order = alloc({items}, DType::i32), active = alloc({experts}, DType::i32);
  Tensor ranges = alloc({experts + 1}, DType::i32), count = alloc({2}, DType::i32);
  Tensor item_out = alloc({items, hidden});
  // W2 keeps act in its split form (moe_w2.h); the other formats use FP32 act.
  const int64_t hidden_padded = w2 ? first.gate_up.dim(1) * 4 : 0, inner_padded = w2 ? first.down.dim(1) * 4 : 0;
  Tensor act = w2 ? Tensor{} : alloc({items, inner});
  Tensor x_split = w2 ? alloc({rows, 3 * hidden_padded / 2}) : Tensor{};      // BF16 pairs in F32 slots
  Tensor act_split = w2 ? alloc({items, 3 * inner_padded / 2}) : Tensor{};
  const W2Scratch w2_scratch = w2 ? moe_w2_scratch(rows, top_k, experts, hidden, inner) : W2Scratch{};
  Tensor passes = w2 ? alloc({w2_scratch.passes * int64_t(sizeof(W2Pass) / sizeof(int32_t))}, DType::i32) : Tensor{};
  Tensor tile_done = w2 ? alloc({w2_scratch.tile_counters}, DType::i32) : Tensor{};
  Tensor partial = w2 ? alloc({w2_scratch.partial_floats}) : Tensor{};
  const MoeArgs args{x.as<float>(), expert_ids.as<int32_t>(), weights.as<float>(),
                     static_cast<const ExpertPointers*>(set.table.data),
                     first.format == ExpertFormat::dense && is_bf16(first.gate_up),
                     w2 ? kMoeW2 : first.format == ExpertFormat::fp4 ? kMoeFp4 : kMoeDense,
                     rows, top_k, experts, hidden, inner, order.as<int32_t>(), active.as<int32_t>(),
                     ranges.as<int32_t>(), count.as<int32_t>(), w2 ? nullptr : act.as<float>(), item_out.as<float>(),
                     out.as<float>(), static_cast<uint16_t*>(x_split.data), static_cast<uint16_t*>(act_split.data),
                     hidden_padded, inner_padded, static_cast<W2Pass*>(passes.data),
                     static_cast<uint32_t*>(tile_done.data), static_cast<float*>(partial.data),
                     w2_scratch.tile_counters, w2_scratch.pass_items};
  moe_launch(args, stream_);
  check_launch("moe_experts");
}

// Best of 5 device-to-device copies of `bytes` bytes, timed with events; read + write counted.
double CudaBackend::copy_bandwidth(size_t bytes) {
  const std::shared_ptr<void> src = memory_.allocate(bytes), dst = memory_.allocate(bytes);
  cuda_check(cudaMemsetAsync(src.get(), 1, bytes, stream_), "cudaMemset");
  cudaEvent_t start, stop;
  cuda_check(cudaEventCreate(&start), "cudaEventCreate");
  cuda_check(cudaEventCreate(&stop), "cudaEventCreate");
  double best = 0.0;
  for (int round = 0; round < 6; ++round) {
    cuda_check(cudaEventRecord(start, stream_), "cudaEventRecord");
    cuda_check(cudaMemcpyAsync(dst.get(), src.get(), bytes, cudaMemcpyDeviceToDevice, stream_), "cudaMemcpy");
    cuda_check(cudaEventRecord(stop, stream_), "cudaEventRecord");
    cuda_check(cudaEventSynchronize(stop), "cudaEventSynchronize");
    float ms = 0.0f;
    cuda_check(cudaEventElapsedTime(&ms, start, stop), "cudaEventElapsedTime");
    if (round > 0) best = std::max(best, 2.0 * double(bytes) / (double(ms) * 1e-3) / 1e9);  // round 0 warms up
  }
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  return best;
}

}  // namespace

std::unique_ptr<Backend> cuda_backend_create(const CudaBackendOptions& options) {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) {
    cudaGetLastError();
    fail("--device cuda: no CUDA GPU is visible (driver missing or no device)");
  }
  MOET_CHECK(options.device >= 0 && options.device < count, "CUDA device {} does not exist ({} visible)",
             options.device, count);
  return std::make_unique<CudaBackend>(options);
}

}  // namespace moet
