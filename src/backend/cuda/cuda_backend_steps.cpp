// The CUDA backend's per-step state (class in cuda_backend_impl.h). begin_step() packs the step's
// inputs into one pinned buffer and uploads them in one copy; the ops read them from that device
// buffer, which only grows, and moving it drops the graphs (they read it in place). run_graph()
// captures a forward in a CUDA graph per key + step layout (its memory in a private pool of the
// allocator that the graph keeps) and replays it; MOET_CUDA_GRAPHS_MAX caps how many graphs are
// kept (least recently used dropped first). MOET_CUDA_PROFILE=1 (or set_profiling) times every op
// of eager steps with CUDA events, each op held behind a gate kernel until it is fully enqueued so
// the events measure GPU time, not launch latency (kernels/cuda/profile_gate.h); a gate is always
// released before the stream is synchronised, and nothing is timed while a graph is captured.
#include "backend/cuda/cuda_backend_impl.h"

#include "backend/cuda/cuda_check.h"
#include "core/error.h"
#include "core/log.h"
#include "kernels/cuda/profile_gate.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstring>
#include <utility>

namespace moet {

using namespace moet::cuda;

namespace {

constexpr uint64_t kGateTimeoutNs = 20'000'000;  // a profile gate gives up after 20 ms

}  // namespace

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
  prefill_runs_.clear();
  prefill_other_rows_.clear();
  prefill_tile_rows_ = prefill_tiles_ = 0;
  // Runs (one sequence, consecutive positions) for the prefill attention kernel; a decode-like
  // step (StepInputs::row_invariant) has none: its rows all take the decode kernel.
  for (int64_t t = 0, end; t < step.rows && !step.row_invariant; t = end) {
    for (end = t + 1; end < step.rows && step.row_seq[end] == step.row_seq[t] &&
                      step.positions[end] == step.positions[end - 1] + 1;)
      ++end;
    if (end - t >= 2) {
      prefill_runs_.push_back({step.row_seq[t], int32_t(t), int32_t(end - t), step.positions[t]});
    } else {
      prefill_other_rows_.push_back(int32_t(t));
    }
  }
  const int64_t max_blocks = *std::max_element(seq_blocks_.begin(), seq_blocks_.end());
  int64_t stride = 1;
  while (stride < max_blocks) stride *= 2;
  step_ = step;
  // Before any capture of the step (decode-like steps never take the GEMM).
  if (gemm_min_rows_ > 0 && step.rows >= gemm_min_rows_ && !step.row_invariant) gemm_ready();
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

// The step's runs cut into query tiles of tile_rows rows, longest key range first (so the longest
// tiles start first; each tile's result does not depend on the order), then the step's other
// rows, uploaded through pinned staging into prefill_device_ (which only grows). Once per step
// and tile height.
void CudaBackend::upload_prefill_tiles(int64_t tile_rows) {
  if (prefill_tile_rows_ == tile_rows) return;
  std::vector<PrefillTile> tiles;
  for (const PrefillTile& run : prefill_runs_)
    for (int32_t first = 0; first < run.rows; first += int32_t(tile_rows))
      tiles.push_back({run.seq, run.first_row + first, std::min(int32_t(tile_rows), run.rows - first),
                       run.first_position + first});
  std::stable_sort(tiles.begin(), tiles.end(), [](const PrefillTile& a, const PrefillTile& b) {
    return a.first_position + a.rows > b.first_position + b.rows;
  });
  const size_t tile_bytes = tiles.size() * sizeof(PrefillTile);
  const size_t bytes = tile_bytes + prefill_other_rows_.size() * sizeof(int32_t);
  if (bytes > prefill_device_bytes_) {
    prefill_device_bytes_ = std::max(bytes, 2 * prefill_device_bytes_);
    prefill_device_.reset();
    prefill_device_ = memory_.allocate(prefill_device_bytes_);
  }
  prefill_staging_.reserve(bytes);
  prefill_staging_.wait();
  auto* base = static_cast<uint8_t*>(prefill_staging_.data);
  std::memcpy(base, tiles.data(), tile_bytes);
  std::memcpy(base + tile_bytes, prefill_other_rows_.data(), prefill_other_rows_.size() * sizeof(int32_t));
  cuda_check(cudaMemcpyAsync(prefill_device_.get(), base, bytes, cudaMemcpyHostToDevice, stream_),
             "uploading the prefill tiles");
  cuda_check(cudaEventRecord(prefill_staging_.done, stream_), "cudaEventRecord");
  prefill_tile_rows_ = tile_rows;
  prefill_tiles_ = int64_t(tiles.size());
}

// Replays the graph of (key, step layout), or captures body() into a new one (relaxed capture
// mode: the allocator may cudaMalloc; every allocation goes to a private pool the graph keeps)
// and launches it. A capture that fails (an op that cannot be captured, the budget) is logged,
// remembered, and that key runs eagerly from then on.
Tensor CudaBackend::run_graph(const GraphKey& key, const std::function<Tensor()>& body) {
  if (!graphs_enabled_ || capturing_ || !step_device_) return body();
  GraphKey full = key;
  full.values.insert(full.values.end(),
                     {step_.rows, step_.sequences, table_stride_, step_.block_size, int64_t(step_.row_invariant)});
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

GraphStats CudaBackend::graph_stats() const {
  GraphStats stats = graph_stats_;
  stats.cached =
      int64_t(std::count_if(graphs_.begin(), graphs_.end(), [](const auto& g) { return bool(g.second.exec); }));
  return stats;
}

void CudaBackend::clear_graphs() {
  if (graphs_.empty()) return;
  gate_release();  // a profiled op in flight must not hold the synchronisation up
  cuda_check(cudaStreamSynchronize(stream_), "synchronising before dropping CUDA graphs");
  graphs_.clear();
}

void CudaBackend::evict_oldest_graph() {
  auto oldest = std::min_element(graphs_.begin(), graphs_.end(),
                                 [](const auto& a, const auto& b) { return a.second.last_use < b.second.last_use; });
  if (oldest->second.exec) {
    gate_release();
    cuda_check(cudaStreamSynchronize(stream_), "synchronising before dropping a CUDA graph");
  }
  graphs_.erase(oldest);
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

// The per-op profile chain of an eager step (begin_step() to the next to_host()).
cudaEvent_t CudaBackend::chain_event() {
  if (events_used_ == events_.size()) {
    cudaEvent_t event = nullptr;
    cuda_check(cudaEventCreate(&event), "cudaEventCreate");
    events_.push_back(event);
  }
  return events_[events_used_++];
}

// Holds the stream behind a gate until the next op is enqueued, then marks the op's start.
void CudaBackend::chain_open() {
  ++gate_value_;
  profile_gate_launch(gate_device_, gate_value_, kGateTimeoutNs, stream_);
  cuda_check(cudaGetLastError(), "profile gate");
  chain_start_ = chain_event();
  cuda_check(cudaEventRecord(chain_start_, stream_), "cudaEventRecord");
}

void CudaBackend::chain_op(std::string name) {
  cudaEvent_t stop = chain_event();
  cuda_check(cudaEventRecord(stop, stream_), "cudaEventRecord");
  chain_ops_.push_back({std::move(name), chain_start_, stop});
  gate_release();
}

// Waits for the chain's ops and adds their times to the profile.
void CudaBackend::chain_end() {
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

}  // namespace moet
