// Microbenchmarks of the CPU kernels (Google Benchmark). Bandwidth-bound kernels report
// bytes_per_second (weights read), so results compare directly with `moet bench`'s copy
// bandwidth; run: build/cpu_kernels_bench --benchmark_counters_tabular=true
#include "core/dtype.h"
#include "core/thread_pool.h"
#include "kernels/cpu/attention.h"
#include "kernels/cpu/logit_confidence.h"
#include "kernels/cpu/matmul.h"
#include "kernels/cpu/router.h"
#include "kv/kv_cache.h"

#include <benchmark/benchmark.h>

#include <random>
#include <string>
#include <vector>

namespace moet {
namespace {

std::vector<float> random_floats(size_t n) {
  std::mt19937 rng(42);
  std::normal_distribution<float> normal;
  std::vector<float> out(n);
  for (auto& v : out) v = normal(rng);
  return out;
}

// GEMV / small-batch GEMM with BF16 weights: args = rows (tokens), n, k.
void BM_MatmulBf16(benchmark::State& state) {
  const int64_t rows = state.range(0), n = state.range(1), k = state.range(2);
  const auto x = random_floats(size_t(rows * k));
  std::vector<uint16_t> w(size_t(n * k));
  for (size_t i = 0; i < w.size(); ++i) w[i] = float_to_bf16(float(i % 97) * 0.01f);
  std::vector<float> y(size_t(rows * n));
  ThreadPool pool(0);
  for (auto _ : state) {
    matmul_bf16(x.data(), rows, k, w.data(), n, nullptr, y.data(), pool, cpu_isa_best());
    benchmark::DoNotOptimize(y.data());
  }
  state.SetBytesProcessed(int64_t(state.iterations()) * n * k * 2);
  state.counters["flops"] = benchmark::Counter(double(2 * rows * n * k) * double(state.iterations()),
                                               benchmark::Counter::kIsRate);
}
// Qwen3-30B-A3B expert (768 x 2048) and attention q_proj (4096 x 2048); 64 MB weights so the
// cache does not hold them.
BENCHMARK(BM_MatmulBf16)->Args({1, 16384, 2048})->Args({4, 16384, 2048})->Args({1, 768, 2048})
    ->UseRealTime()->Unit(benchmark::kMicrosecond);

// Decode attention of one token over `keys` cached positions, 32 q heads / 4 kv heads, dim 128,
// with the cache in each KvDtype but nvfp4 (GQA has none); bytes = the K and V slots read.
void BM_AttentionDecode(benchmark::State& state) {
  const int64_t keys = state.range(0), block = 16, kv_heads = 4, q_heads = 32, dim = 128;
  const KvLayout layout{KvDtype(state.range(1)), kv_heads, dim, dim, false};
  const int64_t blocks = (keys + block - 1) / block, slots = blocks * block, slot_bytes = kv_slot_layout(layout).bytes;
  std::vector<uint8_t> k_cache(size_t(slots * slot_bytes)), v_cache(k_cache.size());
  const PagedKv cache = paged_kv_view(layout, k_cache.data(), v_cache.data(), block);
  std::vector<int64_t> slot_ids(static_cast<size_t>(slots));
  for (int64_t i = 0; i < slots; ++i) slot_ids[size_t(i)] = i;
  const auto values = random_floats(size_t(slots * kv_heads * dim));
  kv_cache_write(cache, values.data(), values.data(), slots, slot_ids.data());
  std::vector<int32_t> table(static_cast<size_t>(blocks));
  for (int64_t i = 0; i < blocks; ++i) table[size_t(i)] = int32_t(i);
  const auto q = random_floats(size_t(q_heads * dim));
  std::vector<float> out(size_t(q_heads * dim));
  const int32_t position = int32_t(keys - 1), seq = 0;
  const int32_t* tables[] = {table.data()};
  ThreadPool pool(0);
  for (auto _ : state) {
    attention_paged(cache, {&position, &seq, tables}, q.data(), 1, q_heads, dim, 0.088f, out.data(), pool,
                    cpu_isa_best());
    benchmark::DoNotOptimize(out.data());
  }
  state.SetLabel(std::string(kv_dtype_name(layout.dtype)));
  state.SetBytesProcessed(int64_t(state.iterations()) * keys * slot_bytes * 2);
}
BENCHMARK(BM_AttentionDecode)
    ->ArgsProduct({{512, 4096}, {int64_t(KvDtype::f32), int64_t(KvDtype::bf16), int64_t(KvDtype::fp8_e4m3),
                                 int64_t(KvDtype::fp8_e5m2)}})
    ->UseRealTime()
    ->Unit(benchmark::kMicrosecond);

// DeepSeek-V3 routing: 256 experts, 8 groups keep 4, top-8, for `rows` tokens.
void BM_RouterSigmoidGrouped(benchmark::State& state) {
  const int64_t rows = state.range(0);
  const auto logits = random_floats(size_t(rows * 256));
  const auto bias = random_floats(256);
  std::vector<int32_t> ids(size_t(rows * 8));
  std::vector<float> weights(size_t(rows * 8));
  for (auto _ : state) {
    router_topk({256, 8, true, true, 2.5f, 8, 4, bias.data()}, logits.data(), rows, ids.data(), weights.data());
    benchmark::DoNotOptimize(ids.data());
  }
  state.SetItemsProcessed(int64_t(state.iterations()) * rows);
}
BENCHMARK(BM_RouterSigmoidGrouped)->Arg(1)->Arg(64);

// The confidence gate's signals of one logit row (Qwen3's vocabulary of 151936): args = rows.
void BM_LogitConfidence(benchmark::State& state) {
  const int64_t rows = state.range(0), vocab = 151936;
  const auto logits = random_floats(size_t(rows * vocab));
  std::vector<float> out(size_t(2 * rows));
  for (auto _ : state) {
    logit_confidence(logits.data(), rows, vocab, out.data());
    benchmark::DoNotOptimize(out.data());
  }
  state.SetBytesProcessed(int64_t(state.iterations()) * rows * vocab * int64_t(sizeof(float)));
}
BENCHMARK(BM_LogitConfidence)->Arg(1)->Arg(8)->Unit(benchmark::kMicrosecond);

}  // namespace
}  // namespace moet

BENCHMARK_MAIN();
