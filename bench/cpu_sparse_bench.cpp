// Microbenchmarks of the CPU kernels of GLM-5 and DeepSeek-V4 (Google Benchmark) at their real
// head shapes, one decode row: the lightning indexer's top-k over `keys` cached index keys, attention
// over the chosen keys (MLA latent rows of 576), DeepSeek-V4's compressor closing one window and its
// hyper-connection mixing. bytes_per_second counts the cache bytes (or weights) read; run:
// build/cpu_sparse_bench --benchmark_counters_tabular=true
#include "core/thread_pool.h"
#include "kernels/cpu/attention.h"
#include "kernels/cpu/hyper_connection.h"
#include "kernels/cpu/kv_compress.h"
#include "kernels/cpu/sparse_attention.h"

#include <benchmark/benchmark.h>

#include <random>
#include <vector>

namespace moet {
namespace {

std::vector<float> random_floats(size_t n) {
  std::mt19937 rng(7);
  std::normal_distribution<float> normal;
  std::vector<float> out(n);
  for (auto& v : out) v = normal(rng);
  return out;
}

// A latent cache (one row of `dim` per slot) of `keys` positions of one sequence, blocks of 16.
struct Cache {
  static constexpr int64_t kBlock = 16;
  KvLayout layout;
  std::vector<uint8_t> memory;
  std::vector<int32_t> table;
  PagedKv view;
  Cache(int64_t keys, int64_t dim, int64_t value_dim)
      : layout{KvDtype::bf16, 1, dim, value_dim, true},
        memory(size_t((keys + kBlock) * kv_slot_layout(layout).bytes)),
        table(size_t(keys / kBlock + 1)),
        view(paged_kv_view(layout, memory.data(), memory.data(), kBlock)) {
    for (size_t i = 0; i < table.size(); ++i) table[i] = int32_t(i);
    std::vector<int64_t> slots(static_cast<size_t>(keys));
    for (int64_t i = 0; i < keys; ++i) slots[size_t(i)] = i;
    const auto values = random_floats(size_t(keys * dim));
    kv_cache_write(view, values.data(), nullptr, keys, slots.data());
  }
};

// GLM-5's indexer: 32 heads x 128 over `keys` index keys (bf16), top 2048.
void BM_IndexerTopk(benchmark::State& state) {
  const int64_t keys = state.range(0), heads = 32, dim = 128, k = 2048;
  const Cache cache(keys, dim, dim);
  const auto q = random_floats(size_t(heads * dim)), w = random_floats(size_t(heads));
  std::vector<int32_t> out(static_cast<size_t>(k));
  const int32_t position = int32_t(keys - 1), seq = 0;
  const int32_t* tables[] = {cache.table.data()};
  ThreadPool pool(0);
  for (auto _ : state) {
    indexer_topk(cache.view, {&position, &seq, tables}, q.data(), 1, heads, w.data(), 0.088f, 1, k, out.data(), pool,
                 cpu_isa_best());
    benchmark::DoNotOptimize(out.data());
  }
  state.SetBytesProcessed(int64_t(state.iterations()) * keys * cache.view.slot_bytes);
}
BENCHMARK(BM_IndexerTopk)->Arg(4096)->Arg(16384)->UseRealTime()->Unit(benchmark::kMicrosecond);

// GLM-5's sparse MLA decode: 64 heads over the 2048 chosen latent rows (512 + 64, bf16) of `keys`.
void BM_AttentionGather(benchmark::State& state) {
  const int64_t keys = state.range(0), heads = 64, chosen = 2048;
  const Cache cache(keys, 576, 512);
  std::vector<int32_t> positions(static_cast<size_t>(chosen));
  for (int64_t i = 0; i < chosen; ++i) positions[size_t(i)] = int32_t(i * keys / chosen);
  const KeySource source{cache.view, positions.data(), chosen};
  const auto q = random_floats(size_t(heads * 576));
  std::vector<float> out(size_t(heads * 512));
  const int32_t position = int32_t(keys - 1), seq = 0;
  const int32_t* tables[] = {cache.table.data()};
  ThreadPool pool(0);
  for (auto _ : state) {
    attention_gather({&source, 1}, {&position, &seq, tables}, q.data(), 1, heads, 576, 0.0625f, nullptr, out.data(),
                     pool, cpu_isa_best());
    benchmark::DoNotOptimize(out.data());
  }
  state.SetBytesProcessed(int64_t(state.iterations()) * chosen * cache.view.slot_bytes);
}
BENCHMARK(BM_AttentionGather)->Arg(4096)->Arg(16384)->UseRealTime()->Unit(benchmark::kMicrosecond);

// DeepSeek-V4-Flash's compressed sparse layer: one row closing a window of 4 (overlap, head 512).
void BM_KvCompress(benchmark::State& state) {
  const int64_t ratio = 4, dim = 512, state_width = 2 * 2 * dim;
  const Cache states(2 * ratio, state_width, state_width);
  const KvLayout out_layout{KvDtype::bf16, 1, dim, dim, true};
  std::vector<uint8_t> out_memory(size_t(Cache::kBlock * kv_slot_layout(out_layout).bytes));
  const PagedKv out = paged_kv_view(out_layout, out_memory.data(), out_memory.data(), Cache::kBlock);
  const auto bias = random_floats(size_t(ratio * 2 * dim)), norm = random_floats(size_t(dim));
  RopeTable rope;
  for (int i = 0; i < 32; ++i) rope.inv_freq.push_back(1.0f / float(1 << (i % 16)));
  rope.interleaved = rope.pairs_in_place = true;
  const int32_t position = int32_t(2 * ratio - 1), seq = 0;
  const int32_t* tables[] = {states.table.data()};
  ThreadPool pool(0);
  for (auto _ : state) {
    kv_compress({ratio, true, dim, 1e-6f}, states.view, {&position, &seq, tables}, 1, bias.data(), norm.data(), rope,
                out, pool);
    benchmark::DoNotOptimize(out_memory.data());
  }
  state.SetBytesProcessed(int64_t(state.iterations()) * 2 * ratio * states.view.slot_bytes);
}
BENCHMARK(BM_KvCompress)->UseRealTime()->Unit(benchmark::kMicrosecond);

// DeepSeek-V4-Flash's hyper-connections (4 streams of 4096): hc_pre + hc_post for `rows` rows.
void BM_HyperConnection(benchmark::State& state) {
  const int64_t rows = state.range(0);
  const HyperParams p{4, 4096, 20, 1e-6f, 1e-6f};
  const int64_t n = p.hc * p.dim, mixes = (2 + p.hc) * p.hc;
  auto streams = random_floats(size_t(rows * n));
  const auto fn = random_floats(size_t(mixes * n)), base = random_floats(size_t(mixes)), out = random_floats(
      size_t(rows * p.dim));
  const std::vector<float> scale = {1.0f, 1.0f, 1.0f};
  std::vector<float> post(size_t(rows * p.hc)), comb(size_t(rows * p.hc * p.hc)), collapsed(size_t(rows * p.dim));
  ThreadPool pool(0);
  for (auto _ : state) {
    hc_pre(p, streams.data(), rows, fn.data(), base.data(), scale.data(), post.data(), comb.data(), collapsed.data(),
           pool, cpu_isa_best());
    hc_post(p, streams.data(), rows, out.data(), post.data(), comb.data(), pool);
    benchmark::DoNotOptimize(streams.data());
  }
  state.SetBytesProcessed(int64_t(state.iterations()) * int64_t(fn.size() * sizeof(float)));
}
BENCHMARK(BM_HyperConnection)->Arg(1)->Arg(8)->UseRealTime()->Unit(benchmark::kMicrosecond);

}  // namespace
}  // namespace moet

BENCHMARK_MAIN();
