// GPU microbenchmark of the dense decode ops through the CUDA backend, next to the device copy
// bandwidth measured in the same run: the BF16 GEMV at Qwen3-235B's decode shapes (q / o
// projections 8192 x 4096 and 4096 x 8192, K / V 512 x 4096, router gate 128 x 4096; K+V and
// q+K+V as one matmul_group launch) and an LM head (151936 x 4096) at batch 1, 4, 8; paged decode attention (64 query / 4 KV heads of 128,
// KV blocks of 16) at contexts 48, 128 and 4096, batch 1 and 8; the router (Qwen3: softmax top-8 of
// 128; DeepSeek-V3: sigmoid, grouped top-8 of 256) at batch 1 and 8; top_logits (the best 1, 50
// and 256 logits per row, device sampling) over vocabularies of 151936 (Qwen3) and 129280
// (DeepSeek-V3) at batch 1, 8 and 64. Each op is captured kCalls
// times into one CUDA graph (run_graph) and the graph replayed kReplays times, so the time per call
// is what a decode step with graphs pays: kernel plus launch gap. Weights and KV caches rotate
// over copies of at least 256 MB in all (at most 64), so calls do not hit the 50 MB L2. Bytes
// counted: the weights (GEMV); the K/V rows, once per KV head (attention); the logits, once
// (top_logits). Prints a table and
// writes JSON (argument 1, optional). MOET_OPS_BENCH_ONLY=TEXT runs only the benchmarks whose
// label ("q_proj", "attention 4096", "router softmax", ...) contains TEXT, so a profiler such as
// Nsight Compute can be pointed at the first launches of one op.
#ifdef MOET_HAVE_CUDA
#include "gpu_bench_start.h"
#include "core/dtype.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <random>
#include <string>
#include <vector>

namespace moet {
namespace {

constexpr int kCalls = 64, kReplays = 10;
constexpr double kRotateBytes = 256.0 * (1 << 20);

struct Bench {
  Backend& backend;
  double copy_gbs;
  int64_t next_key = 0;

  template <typename Op>
  double seconds_per_call(const Tensor& out, Op&& op) {
    return graph_seconds_per_call(backend, next_key++, out, kCalls, kReplays, op);
  }

  nlohmann::json report(const std::string& what, int64_t batch, double seconds, double bytes) {
    const double gbs = bytes / seconds / 1e9;
    if (bytes > 0) {
      std::printf("%-34s batch %ld  %8.2f us  %7.1f GB/s  %5.1f%% of copy\n", what.c_str(), long(batch), seconds * 1e6,
                  gbs, 100.0 * gbs / copy_gbs);
    } else {
      std::printf("%-34s batch %ld  %8.2f us\n", what.c_str(), long(batch), seconds * 1e6);
    }
    nlohmann::json row = {{"batch", batch}, {"us", seconds * 1e6}};
    if (bytes > 0) row.update({{"bytes", bytes}, {"gb_per_s", gbs}, {"fraction_of_copy", gbs / copy_gbs}});
    return row;
  }

  // A step of `rows` rows (sequence t at position positions[t], blocks of 16), for run_graph.
  void begin_step(const std::vector<int32_t>& positions, const std::vector<std::vector<int32_t>>& tables) {
    const int64_t rows = int64_t(positions.size());
    std::vector<int32_t> tokens(static_cast<size_t>(rows), 0), row_seq(static_cast<size_t>(rows), 0);
    std::vector<int64_t> slots(size_t(rows), 0);
    std::vector<const int32_t*> table_ptrs;
    for (int64_t t = 0; t < rows; ++t) row_seq[size_t(t)] = int32_t(t);
    for (const auto& table : tables) table_ptrs.push_back(table.data());
    backend.begin_step({rows, tokens.data(), positions.data(), row_seq.data(), slots.data(), int64_t(tables.size()),
                        table_ptrs.data(), 16});
  }

  Tensor filled(std::vector<int64_t> shape, float value) {
    Tensor t = backend.alloc(std::move(shape));
    const std::vector<float> values(size_t(t.numel()), value);
    backend.from_host(values.data(), t);
    return t;
  }
};

int64_t copies_for(double bytes) { return std::clamp<int64_t>(int64_t(std::ceil(kRotateBytes / bytes)), 1, 64); }

// y = x @ w^T with BF16 weights [n, k] per call, or with `group` more products of other heights
// of the same x (Backend::matmul_group, GQA's q, k and v in one launch), counting every matrix's
// bytes.
nlohmann::json bench_gemv(Bench& b, int64_t n, int64_t k, const char* name, const std::vector<int64_t>& group = {}) {
  std::mt19937 rng(7);
  std::normal_distribution<float> normal(0.0f, 0.02f);
  std::vector<uint16_t> pattern(size_t(1) << 20);
  for (auto& v : pattern) v = float_to_bf16(normal(rng));
  std::vector<int64_t> heights = {n};
  heights.insert(heights.end(), group.begin(), group.end());
  double bytes = 0.0;
  for (int64_t h : heights) bytes += double(h * k * 2);
  std::vector<std::vector<Tensor>> weights(heights.size());  // per part, rotating copies
  for (size_t part = 0; part < heights.size(); ++part) {
    std::vector<uint16_t> host(size_t(heights[part] * k));
    for (size_t i = 0; i < host.size(); ++i) host[i] = pattern[i % pattern.size()];
    for (int64_t c = 0; c < copies_for(bytes); ++c)
      weights[part].push_back(b.backend.upload({"w", DType::bf16, {heights[part], k},
                                                reinterpret_cast<const uint8_t*>(host.data()), host.size() * 2, "bench"}));
  }
  b.begin_step({0}, {{0}});
  nlohmann::json rows_out = nlohmann::json::array();
  for (int64_t rows : {1, 4, 8}) {
    const Tensor x = b.filled({rows, k}, 0.5f);
    std::vector<Tensor> y;
    for (int64_t h : heights) y.push_back(b.backend.alloc({rows, h}));
    const double s = b.seconds_per_call(y.front(), [&](int i) {
      std::vector<MatmulPart> parts;
      for (size_t part = 0; part < heights.size(); ++part)
        parts.push_back({&weights[part][size_t(i) % weights[part].size()], nullptr, &y[part]});
      if (group.empty()) {
        b.backend.matmul(x, *parts.front().w, nullptr, y.front());
      } else {
        b.backend.matmul_group(x, parts);
      }
    });
    std::string what = std::string(group.empty() ? "matmul " : "matmul_group ") + name + " " + std::to_string(n);
    for (int64_t h : group) what += "+" + std::to_string(h);
    rows_out.push_back(b.report(what + "x" + std::to_string(k), rows, s, bytes));
  }
  return {{"op", group.empty() ? "matmul_bf16" : "matmul_group_bf16"}, {"name", name}, {"n", heights}, {"k", k},
          {"results", rows_out}};
}

nlohmann::json bench_attention(Bench& b, int64_t context) {
  const int64_t q_heads = 64, kv_heads = 4, dim = 128, block_size = 16;
  const int64_t blocks_per_row = (context + block_size - 1) / block_size;
  nlohmann::json rows_out = nlohmann::json::array();
  for (int64_t rows : {1, 8}) {
    const double bytes = double(rows * context * kv_heads * 2 * dim * 4);
    std::vector<KvLayerCache> caches;
    for (int64_t c = 0; c < copies_for(bytes); ++c)
      caches.push_back(b.backend.alloc_kv(rows * blocks_per_row, block_size, kv_heads, dim, dim, false));
    std::vector<std::vector<int32_t>> tables(static_cast<size_t>(rows));
    for (int64_t t = 0; t < rows; ++t)
      for (int64_t blk = 0; blk < blocks_per_row; ++blk) tables[size_t(t)].push_back(int32_t(t * blocks_per_row + blk));
    b.begin_step(std::vector<int32_t>(size_t(rows), int32_t(context - 1)), tables);
    const Tensor q = b.filled({rows, q_heads, dim}, 0.01f);
    Tensor out = b.backend.alloc({rows, q_heads, dim});
    const float scale = 1.0f / std::sqrt(float(dim));
    const double s = b.seconds_per_call(out, [&](int i) {
      b.backend.attention(caches[size_t(i) % caches.size()], q, q_heads, dim, scale, out);
    });
    rows_out.push_back(b.report("attention 64/4 x 128, context " + std::to_string(context), rows, s, bytes));
  }
  return {{"op", "attention"}, {"q_heads", q_heads}, {"kv_heads", kv_heads}, {"head_dim", dim}, {"context", context},
          {"results", rows_out}};
}

nlohmann::json bench_router(Bench& b, const char* name, RouterParams params) {
  std::mt19937 rng(9);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  Tensor bias;
  if (params.sigmoid) {
    bias = b.filled({params.experts}, 0.01f);
    params.correction_bias = bias.as<float>();
  }
  b.begin_step({0}, {{0}});
  nlohmann::json rows_out = nlohmann::json::array();
  for (int64_t rows : {1, 8}) {
    std::vector<float> host(size_t(rows * params.experts));
    for (auto& v : host) v = normal(rng);
    Tensor logits = b.backend.alloc({rows, params.experts});
    b.backend.from_host(host.data(), logits);
    Tensor ids = b.backend.alloc({rows, params.top_k}, DType::i32), weights = b.backend.alloc({rows, params.top_k});
    const double s = b.seconds_per_call(weights, [&](int) { b.backend.router(params, logits, ids, weights); });
    rows_out.push_back(b.report(std::string("router ") + name, rows, s, 0.0));
  }
  return {{"op", "router"}, {"name", name}, {"experts", params.experts}, {"top_k", params.top_k},
          {"results", rows_out}};
}

// The best k logits of each of `rows` rows (normal values, as an LM head's), k = 1, 50, 256.
nlohmann::json bench_top_logits(Bench& b, int64_t vocab) {
  std::mt19937 rng(11);
  std::normal_distribution<float> normal(0.0f, 2.0f);
  b.begin_step({0}, {{0}});
  nlohmann::json rows_out = nlohmann::json::array();
  for (int64_t rows : {1, 8, 64}) {
    const double bytes = double(rows * vocab * 4);
    std::vector<float> host(size_t(rows * vocab));
    for (auto& v : host) v = normal(rng);
    std::vector<Tensor> logits;  // rotating copies
    for (int64_t c = 0; c < copies_for(bytes); ++c) {
      logits.push_back(b.backend.alloc({rows, vocab}));
      b.backend.from_host(host.data(), logits.back());
    }
    for (int64_t k : {1, 50, 256}) {
      Tensor values = b.backend.alloc({rows, k}), ids = b.backend.alloc({rows, k}, DType::i32);
      const double s = b.seconds_per_call(values, [&](int i) {
        b.backend.top_logits(logits[size_t(i) % logits.size()], k, values, ids);
      });
      nlohmann::json row = b.report("top_logits " + std::to_string(vocab) + " k=" + std::to_string(k), rows, s, bytes);
      row["k"] = k;
      rows_out.push_back(row);
    }
  }
  return {{"op", "top_logits"}, {"vocab", vocab}, {"results", rows_out}};
}

}  // namespace
}  // namespace moet

int main(int argc, char** argv) {
  const moet::CudaBenchStart start = moet::start_cuda_bench("cuda_ops_bench");
  if (!start.backend) return 0;
  moet::Backend* backend = start.backend.get();
  const double copy_gbs = start.copy_gbs;
  moet::Bench bench{*backend, copy_gbs};
  nlohmann::json report = {{"backend", backend->name()}, {"copy_gb_per_s", copy_gbs}};
  auto& out = report["benchmarks"];
  const char* only = std::getenv("MOET_OPS_BENCH_ONLY");
  const auto run = [&](const std::string& label, auto&& benchmark) {
    if (only == nullptr || label.find(only) != std::string::npos) out.push_back(benchmark());
  };
  const auto gemv = [&](int64_t n, int64_t k, const char* name, const std::vector<int64_t>& group = {}) {
    run(name, [&] { return moet::bench_gemv(bench, n, k, name, group); });
  };
  gemv(8192, 4096, "q_proj");
  gemv(4096, 8192, "o_proj");
  gemv(512, 4096, "k_proj");
  gemv(512, 4096, "k+v_proj", {512});
  gemv(8192, 4096, "q+k+v_proj", {512, 512});
  gemv(128, 4096, "router gate");
  gemv(151936, 4096, "lm_head");
  for (int64_t context : {48, 128, 4096})
    run("attention " + std::to_string(context), [&] { return moet::bench_attention(bench, context); });
  run("router softmax", [&] { return moet::bench_router(bench, "softmax 128 top-8", {128, 8, false, true, 1.0f, 1, 1, nullptr}); });
  run("router sigmoid", [&] {
    return moet::bench_router(bench, "sigmoid 256 grouped top-8", {256, 8, true, true, 2.5f, 8, 4, nullptr});
  });
  for (int64_t vocab : {151936, 129280})
    run("top_logits " + std::to_string(vocab), [&] { return moet::bench_top_logits(bench, vocab); });
  if (out.empty()) {
    std::fprintf(stderr, "cuda_ops_bench: MOET_OPS_BENCH_ONLY=%s matches no benchmark label\n", only);
    return 1;
  }
  if (argc > 1) std::ofstream(argv[1]) << report.dump(2) << "\n";
  return 0;
}
#else
#include <cstdio>
int main() {
  std::printf("cuda_ops_bench: built without CUDA; nothing to measure\n");
  return 0;
}
#endif
