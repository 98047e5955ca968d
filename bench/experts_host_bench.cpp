// The host experts of --cpu-experts (experts/host_experts.h): one routed expert's SwiGLU FFN
// computed from its W2 host row for 1 or 4 rows, in GB/s of the row's bytes (codes + scales),
// against a host memcpy of the same bytes per iteration measured in the same run (the ceiling a
// kernel streaming its weights once could reach). Shapes: DeepSeek-V3 (hidden 7168, inner 2048:
// 11.6 MB a W2 expert) and Qwen3-30B-A3B (2048, 768: 1.1 MB). Experts rotate over 256 MB so that
// rows come from memory, not from the caches. Also the W2 product alone with and without the rows
// sharing each block's decoding (kernels/cpu/w2_rows.h). Each on the avx2 and avx512 levels (the
// last argument; skipped where the CPU lacks it), with "of_memcpy" the ratio to a memcpy of the
// same bytes measured in the same process (cpu_isa_bench.h).
#include "cpu_isa_bench.h"
#include "backend/cpu/cpu_backend.h"
#include "experts/host_experts.h"
#include "kernels/cpu/w2_matmul.h"
#include "kernels/cpu/w2_rows.h"

#include <benchmark/benchmark.h>

#include <cstring>
#include <random>

namespace moet {
namespace {

constexpr uint64_t kRotationBytes = uint64_t(256) << 20;

struct Shape {
  int64_t hidden, inner;
  ExpertRowLayout row() const {
    ExpertRowLayout r;
    r.scales13 = uint64_t(2 * inner * hidden / 4);
    r.codes2 = r.scales13 + uint64_t(2 * inner * hidden / 32);
    r.scales2 = r.codes2 + uint64_t(hidden * inner / 4);
    r.bytes = r.scales2 + uint64_t(hidden * inner / 32);
    return r;
  }
};
constexpr Shape kShapes[] = {{7168, 2048}, {2048, 768}};

// Rows of random codes with scale bytes around 2^-4.
std::vector<uint8_t> random_rows(const ExpertRowLayout& r, size_t count) {
  std::vector<uint8_t> bytes(r.bytes * count);
  std::mt19937_64 rng(9);
  for (auto& b : bytes) b = uint8_t(rng());
  for (size_t e = 0; e < count; ++e)
    for (uint64_t i = 0; i < r.bytes; ++i)
      if ((i >= r.scales13 && i < r.codes2) || i >= r.scales2) bytes[e * r.bytes + i] = uint8_t(119 + i % 4);
  return bytes;
}

// state.range(0): shape, (1): rows, (2): threads, (3): CpuIsa.
void BM_HostExpertW2(benchmark::State& state) {
  const std::optional<CpuIsa> isa = bench_cpu_isa(state, state.range(3));
  if (!isa) return;
  const Shape s = kShapes[state.range(0)];
  const int64_t rows = state.range(1);
  const ExpertRowLayout r = s.row();
  const size_t count = std::max<size_t>(2, kRotationBytes / r.bytes);
  const std::vector<uint8_t> experts = random_rows(r, count);
  auto backend = cpu_backend_create({1, *isa});
  HostExperts host(*backend, {ExpertFormat::w2, s.hidden, s.inner}, r, int(state.range(2)), *isa);
  std::vector<float> x(size_t(rows * s.hidden), 0.01f), results(size_t(rows * s.hidden));
  std::vector<int64_t> items(static_cast<size_t>(rows));
  for (int64_t i = 0; i < rows; ++i) items[size_t(i)] = i;
  size_t e = 0;
  const BenchClock::time_point start = BenchClock::now();
  for (auto _ : state) {
    host.compute(experts.data() + e * r.bytes, x.data(), 1, items, results.data());
    benchmark::DoNotOptimize(results.data());
    e = (e + 1) % count;
  }
  state.SetBytesProcessed(int64_t(state.iterations()) * int64_t(r.bytes));
  report_of_memcpy(state, start, r.bytes, kRotationBytes);
}

// One W2 product of DeepSeek-V3's gate_up shape (4096 x 7168, 8.26 MB) for state.range(1) rows, one
// thread: matmul_w2 (state.range(0) = 0: each row decodes the codes) against matmul_w2_rows (1: the
// rows share each block's decoding; the same bits), in GB/s of weight bytes; state.range(2): CpuIsa
// (on avx512 both variants are the column-pair kernel).
void BM_W2Product(benchmark::State& state) {
  const std::optional<CpuIsa> isa = bench_cpu_isa(state, state.range(2));
  if (!isa) return;
  constexpr int64_t kN = 4096, kK = 7168;
  const int64_t rows = state.range(1);
  const uint64_t bytes = uint64_t(kN * kK / 4 + kN * kK / 32);
  const size_t count = std::max<size_t>(2, kRotationBytes / bytes);
  std::vector<uint8_t> weights(bytes * count);
  std::mt19937_64 rng(4);
  for (auto& b : weights) b = uint8_t(119 + rng() % 4);  // valid codes and scale bytes alike
  std::vector<float> x(size_t(rows * kK), 0.01f), y(size_t(rows * kN));
  ThreadPool pool(1);
  const auto product = state.range(0) == 0 ? matmul_w2 : matmul_w2_rows;
  size_t e = 0;
  const BenchClock::time_point start = BenchClock::now();
  for (auto _ : state) {
    const uint8_t* w = weights.data() + e * bytes;
    product(x.data(), rows, kK, w, w + kN * kK / 4, kN, y.data(), pool, *isa);
    benchmark::DoNotOptimize(y.data());
    e = (e + 1) % count;
  }
  state.SetBytesProcessed(int64_t(state.iterations()) * int64_t(bytes));
  report_of_memcpy(state, start, bytes, kRotationBytes);
}

// The same bytes per iteration copied (state.range(0): shape).
void BM_HostMemcpy(benchmark::State& state) {
  const ExpertRowLayout r = kShapes[state.range(0)].row();
  const size_t count = std::max<size_t>(2, kRotationBytes / r.bytes);
  std::vector<uint8_t> src(r.bytes * count, 1), dst(r.bytes);
  size_t e = 0;
  for (auto _ : state) {
    std::memcpy(dst.data(), src.data() + e * r.bytes, r.bytes);
    benchmark::DoNotOptimize(dst.data());
    e = (e + 1) % count;
  }
  state.SetBytesProcessed(int64_t(state.iterations()) * int64_t(r.bytes));
}

BENCHMARK(BM_HostExpertW2)->ArgsProduct({{0, 1}, {1, 4}, {1, 2}, kBenchIsas})->UseRealTime();
BENCHMARK(BM_W2Product)->ArgsProduct({{0, 1}, {1, 4, 8}, kBenchIsas})->UseRealTime();
BENCHMARK(BM_HostMemcpy)->Arg(0)->Arg(1)->UseRealTime();

}  // namespace
}  // namespace moet

BENCHMARK_MAIN();
