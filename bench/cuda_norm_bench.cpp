// GPU microbenchmark of the small per-token ops of a decode step through the CUDA backend, next
// to the device-to-device copy bandwidth measured in the same run: rmsnorm of hidden rows, the
// fused residual add + rmsnorm next to the two launches it replaces (add, rmsnorm), the GQA
// attention prologue qk_norm_rope next to the four it replaces (per-head rmsnorm of q and k, rope
// of q and k), the prologue with the KV write (qk_norm_rope_kv_write) next to qk_norm_rope +
// kv_write, and rope at an offset (MLA's q), at rows 1 and 8 on Qwen3-235B (hidden 4096, 64 q /
// 4 kv heads of 128), Mixtral (32 / 8 heads, no q/k norm) and DeepSeek-V3 (hidden 7168; 128 heads
// rotating 64 of 192) shapes. Two times per call: "gated" is the GPU time of the call's ops alone
// as `moet bench --profile` measures them (each op held behind a gate until enqueued, CUDA events
// around it; mean of 20 calls after 5 warm-ups); "graph" is the time per call of 50 calls captured
// in one CUDA graph and replayed 20 times (what a decode step pays, launch gaps included). GB/s
// counts every float the op must read or write once (activations and weights) over the gated time.
#ifdef MOET_HAVE_CUDA
#include "gpu_bench_start.h"

#include <chrono>
#include <cmath>
#include <cstdio>
#include <functional>
#include <random>
#include <string>
#include <vector>

namespace moet {
namespace {

constexpr int kWarmup = 5, kGatedCalls = 20, kGraphCalls = 50, kReplays = 20;

// The per-row inputs of a one-sequence decode step of `rows` rows at positions 1000 + t.
class DecodeStep {
 public:
  explicit DecodeStep(int64_t rows)
      : rows_(rows), tokens_(size_t(rows), 0), positions_(size_t(rows)), row_seq_(size_t(rows), 0), table_(128, 0),
        slots_(size_t(rows)), tables_{table_.data()} {
    for (int64_t t = 0; t < rows; ++t) positions_[size_t(t)] = int32_t(1000 + t), slots_[size_t(t)] = t;
  }
  StepInputs inputs() const {
    return {rows_, tokens_.data(), positions_.data(), row_seq_.data(), slots_.data(), 1, tables_, 16};
  }

 private:
  int64_t rows_;
  std::vector<int32_t> tokens_, positions_, row_seq_, table_;
  std::vector<int64_t> slots_;
  const int32_t* tables_[1];
};

class NormBench {
 public:
  NormBench(Backend& backend, double copy_gbs) : backend_(backend), copy_gbs_(copy_gbs) {}

  Backend& backend() { return backend_; }

  Tensor random(std::vector<int64_t> shape, float scale = 1.0f) {
    Tensor t = backend_.alloc(std::move(shape));
    std::normal_distribution<float> normal(0.0f, scale);
    std::vector<float> values(size_t(t.numel()));
    for (float& v : values) v = normal(rng_);
    backend_.from_host(values.data(), t);
    return t;
  }

  // Times `call` (one or more ops, `sync` among their outputs) at `step` and prints one line.
  void run(const std::string& name, const DecodeStep& step, double floats, const Tensor& sync,
           const std::function<void()>& call) {
    const double gated = gated_seconds(step, sync, call), graph = graph_seconds(step, sync, call);
    const double gbs = floats * sizeof(float) / gated / 1e9;
    std::printf("%-52s rows %ld  gated %7.2f us  graph %7.2f us  %7.1f GB/s  %5.1f%% of copy\n", name.c_str(),
                long(step.inputs().rows), gated * 1e6, graph * 1e6, gbs, 100.0 * gbs / copy_gbs_);
  }

 private:
  void sync_on(const Tensor& t) {
    std::vector<float> sink(size_t(t.numel()));
    backend_.to_host(t, sink.data());
  }

  double gated_seconds(const DecodeStep& step, const Tensor& sync, const std::function<void()>& call) {
    backend_.begin_step(step.inputs());
    for (int i = 0; i < kWarmup; ++i) call();
    sync_on(sync);
    bench_ops(backend_).set_profiling(true);
    backend_.begin_step(step.inputs());
    for (int i = 0; i < kGatedCalls; ++i) call();
    sync_on(sync);
    double seconds = 0.0;
    for (const OpProfile& op : bench_ops(backend_).take_profile())
      if (op.op != "step_upload") seconds += op.seconds;
    bench_ops(backend_).set_profiling(false);
    return seconds / kGatedCalls;
  }

  double graph_seconds(const DecodeStep& step, const Tensor& sync, const std::function<void()>& call) {
    backend_.begin_step(step.inputs());
    const GraphKey key{{++graph_id_}};
    const auto body = [&] {
      for (int i = 0; i < kGraphCalls; ++i) call();
      return sync;
    };
    backend_.run_graph(key, body);  // captures, then launches once
    sync_on(sync);
    const auto start = std::chrono::steady_clock::now();
    for (int i = 0; i < kReplays; ++i) backend_.run_graph(key, body);
    sync_on(sync);
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    return seconds / (kReplays * kGraphCalls);
  }

  Backend& backend_;
  double copy_gbs_;
  std::mt19937 rng_{7};
  int64_t graph_id_ = 0;
};

RopeTable rope_table(int64_t rot_dim, bool interleaved) {
  RopeTable table;
  for (int64_t i = 0; i < rot_dim / 2; ++i)
    table.inv_freq.push_back(float(std::pow(1e6, -2.0 * double(i) / double(rot_dim))));
  table.interleaved = interleaved;
  return table;
}

constexpr float kEps = 1e-6f;

void bench_hidden(NormBench& bench, const std::string& model, int64_t hidden, int64_t rows) {
  Backend& b = bench.backend();
  const DecodeStep step(rows);
  const double row_floats = double(rows * hidden);
  Tensor residual = bench.random({rows, hidden}, 4.0f), branch = bench.random({rows, hidden});
  Tensor weight = bench.random({hidden}), out = bench.random({rows, hidden});
  const std::string shape = model + " hidden " + std::to_string(hidden);
  bench.run("rmsnorm " + shape, step, 2 * row_floats + double(hidden), out,
            [&] { b.rmsnorm(residual, weight, kEps, out); });
  bench.run("add_rmsnorm " + shape, step, 4 * row_floats + double(hidden), out,
            [&] { b.add_rmsnorm(residual, branch, weight, kEps, out); });
  bench.run("  unfused: add, rmsnorm", step, 4 * row_floats + double(hidden), out, [&] {
    b.add(residual, branch);
    b.rmsnorm(residual, weight, kEps, out);
  });
}

void bench_prologue(NormBench& bench, const std::string& model, int64_t q_heads, int64_t k_heads, int64_t head_dim,
                    bool norm, int64_t rows) {
  Backend& b = bench.backend();
  const DecodeStep step(rows);
  const RopeTable table = rope_table(head_dim, false);
  Tensor q = bench.random({rows, q_heads * head_dim}), k = bench.random({rows, k_heads * head_dim});
  const Tensor q_norm = norm ? bench.random({head_dim}) : Tensor{}, k_norm = norm ? bench.random({head_dim}) : Tensor{};
  const double floats = double(2 * rows * (q_heads + k_heads) * head_dim + (norm ? 2 * head_dim : 0));
  bench.run("qk_norm_rope " + model, step, floats, k,
            [&] { b.qk_norm_rope(table, q, q_heads, k, k_heads, head_dim, q_norm, k_norm, kEps); });
  bench.run(norm ? "  unfused: q/k rmsnorm, rope q, rope k" : "  unfused: rope q, rope k", step, floats, k, [&] {
    if (norm) {
      b.rmsnorm(q, q_norm, kEps, q);
      b.rmsnorm(k, k_norm, kEps, k);
    }
    b.rope(table, q, q_heads, head_dim, 0);
    b.rope(table, k, k_heads, head_dim, 0);
  });
  // the step's slots 0..rows-1
  KvLayerCache cache = b.alloc_kv(1, 16, KvLayout{KvDtype::f32, k_heads, head_dim, head_dim, false});
  const Tensor v = bench.random({rows, k_heads * head_dim});
  const double kv_floats = floats + double(3 * rows * k_heads * head_dim);  // v read, k and v written
  bench.run("qk_norm_rope_kv_write " + model, step, kv_floats, k,
            [&] { b.qk_norm_rope_kv_write(table, q, q_heads, k, k_heads, head_dim, q_norm, k_norm, kEps, v, cache); });
  bench.run("  unfused: qk_norm_rope, kv_write", step, kv_floats, k, [&] {
    b.qk_norm_rope(table, q, q_heads, k, k_heads, head_dim, q_norm, k_norm, kEps);
    b.kv_write(cache, k, &v);
  });
}

void bench_mla_rope(NormBench& bench, int64_t rows) {
  Backend& b = bench.backend();
  const DecodeStep step(rows);
  const RopeTable table = rope_table(64, true);
  Tensor q = bench.random({rows, 128 * 192});
  bench.run("rope DeepSeek-V3 q: 128 heads, [128, 192) of 192", step, double(2 * rows * 128 * 64), q,
            [&] { b.rope(table, q, 128, 192, 128); });
}

}  // namespace
}  // namespace moet

int main() {
  const moet::CudaBenchStart start = moet::start_cuda_bench("cuda_norm_bench", size_t(1) << 30);
  if (!start.backend) return 0;
  moet::Backend* backend = start.backend.get();
  const double copy_gbs = start.copy_gbs;
  moet::NormBench bench(*backend, copy_gbs);
  for (int64_t rows : {1, 8}) {
    moet::bench_hidden(bench, "Qwen3-235B", 4096, rows);
    moet::bench_prologue(bench, "Qwen3-235B: 64 q / 4 kv heads of 128, q/k norm", 64, 4, 128, true, rows);
    moet::bench_prologue(bench, "Mixtral: 32 q / 8 kv heads of 128, no norm", 32, 8, 128, false, rows);
    moet::bench_hidden(bench, "DeepSeek-V3", 7168, rows);
    moet::bench_mla_rope(bench, rows);
  }
  if (const int64_t failed = backend->graph_stats().failures; failed > 0)
    std::printf("note: %ld graph captures failed; their \"graph\" times are eager\n", long(failed));
  return 0;
}
#else
#include <cstdio>
int main() {
  std::printf("cuda_norm_bench: built without CUDA; nothing to measure\n");
  return 0;
}
#endif
