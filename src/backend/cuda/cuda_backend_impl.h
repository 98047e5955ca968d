// The CUDA backend's class, shared by its source files; private to backend/cuda (it includes CUDA
// headers, so nothing outside backend/cuda includes it: the rest of moet creates the backend
// through the plain factory in cuda_backend.h). CudaBackend runs every Backend op on one stream of
// one GPU, through kernels/cuda. Weights and activations live in a caching allocator under the
// memory budget (device_memory.h); host copies go through pinned staging buffers (two for uploads,
// so the memcpy into one overlaps the DMA out of the other); the per-step inputs are packed into
// one pinned buffer and uploaded in one copy by begin_step(). Nothing synchronises with the host
// except to_host(), the copy bandwidth measurement and memory-budget releases. With
// CudaBackendOptions::sync_every_op it synchronises and checks after every op (locates a faulting
// kernel). run_graph() captures a forward in a CUDA graph per key + step layout (its memory in a
// private pool of the allocator that the graph keeps) and replays it; options.max_graphs caps how
// many graphs are kept (least recently used dropped first). options.profile (or set_profiling)
// times every op of eager steps with CUDA events, each op held behind a gate kernel until it is
// fully enqueued so the events measure GPU time, not launch latency (kernels/cuda/profile_gate.h).
// The methods live in cuda_backend.cpp (construction, memory, uploads and transfers, expert sets,
// the memory benchmarks), cuda_backend_steps.cpp (step inputs, CUDA graphs, the per-op profile)
// and cuda_backend_ops.cpp (the ops; cuda_backend_sparse.cpp those of GLM-5 / DeepSeek-V4).
#pragma once

#include "backend/bench_ops.h"
#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_check.h"
#include "backend/cuda/dense_gemm.h"
#include "backend/cuda/device_memory.h"
#include "kernels/cuda/attention.h"
#include "kernels/cuda/gemv.h"
#include "kernels/cuda/head_norm_rope.h"
#include "kernels/cuda/moe.h"
#include "kernels/cuda/prefill_attention.h"
#include "kernels/cuda/sparse_ops.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

namespace moet {

class CudaBackend final : public Backend, public BenchOps {
 public:
  // cuda_backend.cpp
  explicit CudaBackend(const CudaBackendOptions& options);
  ~CudaBackend() override;

  std::string name() const override { return name_; }
  // The stream every op is enqueued on (NCCL's collectives join it: nccl_communicator.cpp).
  cudaStream_t stream() const { return stream_; }
  // After a collective enqueued on stream(): checked, and timed as op `name` in the per-op profile
  // like the backend's own ops (the collectives' share of a step).
  void collective_done(const std::string& name) {
    check_launch("collective", [&] { return name; });
  }

  Tensor upload(const HostTensor& info) override;
  Tensor upload_stacked(const HostTensor& a, const HostTensor& b) override;
  Tensor upload_f32(const HostTensor& info) override;
  Tensor alloc(std::vector<int64_t> shape, DType dtype = DType::f32) override;
  KvLayerCache alloc_kv(int64_t blocks, int64_t block_size, const KvLayout& layout) override;
  void to_host(const Tensor& src, void* dst) override;
  void from_host(const void* src, Tensor& dst) override { copy_to_device(dst.data, src, dst.bytes()); }
  ExpertSet expert_set(const ExpertLayout& layout, std::vector<ExpertWeights> experts) override;
  void expert_set_update(ExpertSet& set, std::span<const int64_t> experts,
                         std::span<const ExpertWeights> weights) override;
  ExpertSlots alloc_expert_slots(const ExpertLayout& layout, const ExpertRowLayout& row, int64_t count) override;
  void expert_slots_load(ExpertSlots& slots, std::span<const int64_t> ids, std::span<const uint8_t* const> rows) override;
  void expert_slots_exchange(ExpertSlots& slots, std::span<const int64_t> ids, std::span<const uint8_t* const> in_rows,
                             std::span<uint8_t* const> out_rows) override;
  bool host_experts_by_mailbox() const override { return true; }
  ExpertLoadFence expert_slots_load_async(ExpertSlots& slots, std::span<const int64_t> ids,
                                          std::span<const uint8_t* const> rows) override;
  bool expert_slots_ready(const ExpertLoadFence& fence) override;
  void expert_slots_wait(const ExpertLoadFence& fence) override;
  void expert_set_add_tier(ExpertSet& set, ExpertFormat tier) override;
  std::shared_ptr<uint8_t> alloc_pinned(size_t bytes) override;
  void fill_zero(Tensor& t) override;
  uint64_t memory_available() const override {
    return memory_.budget() > memory_.reserved() ? memory_.budget() - memory_.reserved() : 0;
  }
  double copy_bandwidth(size_t bytes) override;
  double upload_bandwidth(size_t bytes) override;
  void read_regions(const std::vector<ByteRegion>& regions, Tensor& sink) override;

  // cuda_backend_ops.cpp
  void embedding(const Tensor& table, int64_t first_row, Tensor& out) override;
  void rmsnorm(const Tensor& x, const Tensor& weight, float eps, Tensor& out) override;
  void add_rmsnorm(Tensor& residual, const Tensor& delta, const Tensor& weight, float eps, Tensor& out) override;
  void matmul(const Tensor& x, const Tensor& w, const Tensor* bias, Tensor& y) override;
  void matmul_group(const Tensor& x, std::span<const MatmulPart> parts) override;
  void add(Tensor& y, const Tensor& x) override;
  void silu_mul(const Tensor& gate_up, Tensor& out) override;
  void rope(const RopeTable& table, Tensor& x, int64_t heads, int64_t head_stride, int64_t offset) override;
  void qk_norm_rope(const RopeTable& table, Tensor& q, int64_t q_heads, Tensor& k, int64_t k_heads, int64_t head_dim,
                    const Tensor& q_norm, const Tensor& k_norm, float eps) override;
  void qk_norm_rope_kv_write(const RopeTable& table, Tensor& q, int64_t q_heads, Tensor& k, int64_t k_heads,
                             int64_t head_dim, const Tensor& q_norm, const Tensor& k_norm, float eps, const Tensor& v,
                             KvLayerCache& cache) override;
  void kv_write(KvLayerCache& cache, const Tensor& k, const Tensor* v) override;
  void attention(KvLayerCache& cache, const Tensor& q, int64_t q_heads, int64_t q_stride, float scale,
                 Tensor& out) override;
  void router(const RouterParams& p, const Tensor& logits, Tensor& expert_ids, Tensor& weights) override;
  void moe_experts(const Tensor& x, const ExpertSet& set, const Tensor& expert_ids, const Tensor& weights,
                   Tensor& out, bool accumulate) override;
  void copy_columns(const Tensor& src, int64_t src_stride, int64_t src_offset, Tensor& dst, int64_t dst_stride,
                    int64_t dst_offset, int64_t rows, int64_t width) override;
  void head_matmul(const Tensor& x, int64_t heads, int64_t x_stride, const Tensor& w, Tensor& y,
                   int64_t y_stride) override;
  void top_logits(const Tensor& logits, int64_t k, Tensor& values, Tensor& ids) override;
  void logit_confidence(const Tensor& logits, Tensor& out) override;

  // cuda_backend_sparse.cpp (GLM-5 / DeepSeek-V4)
  void rope_inverse(const RopeTable& table, Tensor& x, int64_t heads, int64_t head_stride, int64_t offset) override;
  void layernorm(const Tensor& x, const Tensor& weight, const Tensor& bias, float eps, Tensor& out) override;
  void silu_mul_clamped(const Tensor& gate_up, float limit, Tensor& out) override;
  void attention_gather(std::span<const AttentionKeys> sources, const Tensor& q, int64_t q_heads, int64_t q_stride,
                        float scale, const Tensor* sinks, Tensor& out) override;
  void indexer_topk(KvLayerCache& keys, const Tensor& q, int64_t heads, const Tensor& weights, float scale,
                    int64_t stride, Tensor& positions) override;
  void kv_compress(const KvCompressOp& op, KvLayerCache& state, KvLayerCache& out) override;
  void hc_pre(const HyperConnectionWeights& w, const Tensor& streams, Tensor& post, Tensor& comb,
              Tensor& collapsed) override;
  void hc_post(const HyperConnectionWeights& w, Tensor& streams, const Tensor& block_out, const Tensor& post,
               const Tensor& comb) override;
  void hc_head(const HyperConnectionWeights& w, const Tensor& streams, Tensor& out) override;
  void router_hash(const RouterParams& params, const Tensor& logits, const Tensor& table, Tensor& expert_ids,
                   Tensor& weights) override;

  // cuda_backend_steps.cpp
  void begin_step(const StepInputs& step) override;
  Tensor run_graph(const GraphKey& key, const std::function<Tensor()>& body) override;
  bool set_graphs(bool enabled) override { return graphs_enabled_ = enabled; }
  bool graphs() const override { return graphs_enabled_; }
  GraphStats graph_stats() const override;
  void clear_graphs() override;

  void set_profiling(bool on) override;
  std::vector<OpProfile> take_profile() override;

 private:
  enum StepField { kTokens, kPositions, kRowSeq };

  // cuda_backend.cpp
  static size_t budget_for(const CudaBackendOptions& options);
  void tile_w2(Tensor& codes, Tensor& scales, bool gate_up, Tensor& bad_scale);
  // The device layout of a W2 matrix [rows, cols] tiled at `tiled` (w2_tiles.h): codes and
  // scales views over its records.
  static std::pair<Tensor, Tensor> w2_tiled_views(std::shared_ptr<void> storage, uint8_t* tiled, int64_t rows,
                                                  int64_t cols);
  // Bytes of one expert of `layout` in the device layout (W2 tiled; FP4 as the row's planes).
  static size_t device_expert_bytes(const ExpertLayout& layout);
  // The entry of `e` in the set's table of experts of `format`: its pointers when present in
  // that format, else a stand-in of that format (a zeroed expert, made on first use), marked absent
  // or (present in the other format) served elsewhere.
  cuda::ExpertPointers table_entry(const ExpertSet& set, const ExpertWeights& e, ExpertFormat format);
  void write_tables(const ExpertSet& set);
  // One batched host-to-device copy of `rows` (each `bytes`) to dsts on the copy stream.
  void copy_rows(std::span<void* const> dsts, std::span<const uint8_t* const> rows, uint64_t bytes);
  // Fails when a W2 conversion since the last check met a scale byte >= 253.
  void check_bad_scales();
  static std::vector<float> widen(const HostTensor& info);
  Tensor device_tensor(DType dtype, std::vector<int64_t> shape);
  void copy_to_device(void* dst, const void* src, size_t bytes);
  static bool aligned(const void* p, size_t bytes) { return reinterpret_cast<uintptr_t>(p) % bytes == 0; }

  // cuda_backend_ops.cpp
  static void check_norm_dim(int64_t dim);
  static cuda::RopeArgs rope_args(const RopeTable& table);
  static std::pair<cuda::HeadSet, cuda::HeadSet> prologue_sets(const RopeTable& table, Tensor& q, int64_t q_heads,
                                                               Tensor& k, int64_t k_heads, int64_t head_dim,
                                                               const Tensor& q_norm, const Tensor& k_norm);
  // One run of the MoE op over `table`, whose present entries are of `format`; `host`: the
  // layer's host entries, served through their mailbox (null: none in this pass).
  void moe_pass(const Tensor& x, const ExpertSet& set, ExpertFormat format, const Tensor& table,
                const Tensor& expert_ids, const Tensor& weights, Tensor& out, bool accumulate,
                const ExpertTracking& tracking, const HostMailbox* host);
  // The products, then per mailbox-sized range of rows: publish, wait for the host, combine.
  void moe_with_host(const cuda::MoeArgs& args, const HostMailbox& mailbox);
  // The device address of mapped page-locked memory (alloc_pinned()), looked up once per pointer.
  void* mapped_pointer(const void* host);
  static bool is_bf16(const Tensor& t);
  // The GEMV weight type of a matmul weight (BF16, F32 or FP8-block with its scales).
  static cuda::GemvWeights gemv_weights(const Tensor& w);
  cuda::GemvArgs matmul_args(const Tensor& x, const Tensor& w, const Tensor* bias, Tensor& y) const;
  bool takes_gemm(const cuda::GemvArgs& a, int part);
  bool gemm_ready();
  Tensor split_activations(const Tensor& x);
  void gemm_part(const Tensor& pieces, const cuda::GemvArgs& a, int part);
  static std::string product_name(const cuda::GemvArgs& a, bool gemm, bool group);

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

  // cuda_backend_steps.cpp
  cudaEvent_t chain_event();
  void gate_release() {
    if (gate_host_) __atomic_store_n(gate_host_, gate_value_, __ATOMIC_SEQ_CST);
  }
  void chain_open();
  void chain_op(std::string name);
  void chain_end();
  void evict_oldest_graph();
  void upload_prefill_tiles(int64_t tile_rows);

  // For the ops: the step inputs in the device buffer (begin_step()).
  const int32_t* step_ints(StepField field) const {
    return reinterpret_cast<const int32_t*>(step_device_.get()) + int64_t(field) * step_.rows;
  }
  const int64_t* step_slots() const {
    return reinterpret_cast<const int64_t*>(static_cast<const uint8_t*>(step_device_.get()) + slots_offset_);
  }
  const int32_t* step_tables() const {
    return reinterpret_cast<const int32_t*>(static_cast<const uint8_t*>(step_device_.get()) + tables_offset_);
  }
  // All of them as the sparse kernels take them (cuda_backend_sparse.cpp).
  cuda::StepRowsArgs step_rows() const;

  // Helpers of the members below, nested so that their names stay the backend's own.

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

  DeviceMemory memory_;
  cudaStream_t stream_ = nullptr;
  cudaStream_t copy_stream_ = nullptr;  // expert fetches (expert_slots_load)
  cudaEvent_t copy_done_ = nullptr;
  cudaEvent_t scratch_free_[2] = {};  // W2 fetches: each half of the slot scratch converted
  // Exclusive tiering (expert_slots_exchange): evicted rows go to the host on their own stream,
  // beside the fetches' copies, from a device scratch of kSlotLoadBatch rows (made on first use).
  cudaStream_t writeback_stream_ = nullptr;
  cudaEvent_t writeback_ready_ = nullptr;
  Tensor writeback_scratch_;
  std::map<const void*, void*> mapped_;  // mapped_pointer()'s answers
  Tensor bad_scale_;                    // W2 conversions: 1 when a scale byte was >= 253
  // Stand-in experts for absent table entries, per (format, dtype, hidden, inner).
  std::map<std::tuple<int, int, int64_t, int64_t>, ExpertWeights> stand_ins_;
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
  // Prefill attention (cuda_backend_ops.cpp attention()): begin_step() lists the step's runs of
  // two or more rows of one sequence at consecutive positions, and the other rows; the first eager
  // attention() of the step that takes the prefill kernel cuts the runs into query tiles and
  // uploads tiles and other rows: [tiles][other rows] in prefill_device_.
  std::vector<cuda::PrefillTile> prefill_runs_;
  std::vector<int32_t> prefill_other_rows_;
  int64_t prefill_tile_rows_ = 0, prefill_tiles_ = 0;  // of the uploaded list; 0 rows: none this step
  PinnedBuffer prefill_staging_;
  std::shared_ptr<void> prefill_device_;
  size_t prefill_device_bytes_ = 0;
  bool debug_sync_ = false;
  std::string name_;

  // Many-row BF16 and FP8-block products on the tensor cores (gemm_ready()); 0 rows: never. The
  // weight scratch holds one tile of FP8-block weights as BF16 pieces (4 bytes a weight: 1024
  // rows of o_proj's k = 16384); allocated with the workspace, whatever the model's weights.
  static constexpr size_t kGemmWorkspaceBytes = size_t(32) << 20;
  static constexpr size_t kGemmWeightScratchBytes = size_t(64) << 20;
  int64_t gemm_min_rows_ = 0;
  Tensor gemm_workspace_, gemm_weight_scratch_;
  std::unique_ptr<DenseGemm> gemm_;

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

}  // namespace moet
