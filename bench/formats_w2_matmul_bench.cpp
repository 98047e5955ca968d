// W2 / W2K / FP4 CPU expert matmul (one token, M = 1, the decode case) in GB/s of weight bytes
// (codes + scales), against memcpy bandwidth over a buffer of the same total size. Sixteen
// [2048, 7168] experts rotate so the weights come from memory, not cache. W2 on the avx2 and avx512
// levels (the second argument; skipped where the CPU lacks it), the others on the best level (their
// avx512 level is their AVX2 kernel); "of_memcpy" is the ratio to a memcpy of the same bytes
// measured in the same process (cpu_isa_bench.h).
#include "cpu_isa_bench.h"
#include "formats/requant.h"
#include "kernels/cpu/w2_matmul.h"

#include <benchmark/benchmark.h>

#include <cstring>
#include <random>

namespace moet {
namespace {

constexpr int64_t kN = 2048, kK = 7168, kExperts = 16;

struct Weights {
  std::vector<uint8_t> codes, scales;
  uint64_t code_bytes, scale_bytes;
};

Weights make(StoreFormat format) {
  Weights w;
  w.code_bytes = store_codes_bytes(format, kN, kK);
  w.scale_bytes = store_scales_bytes(kN, kK);
  w.codes.resize(w.code_bytes * kExperts);
  w.scales.resize(w.scale_bytes * kExperts);
  std::mt19937 rng(3);
  for (auto& c : w.codes) c = uint8_t(rng());
  for (auto& s : w.scales) s = uint8_t((format == StoreFormat::w2k ? 140 : 120) + rng() % 8);
  return w;
}

// The matmul of a format.
decltype(&matmul_w2) matmul_of(StoreFormat format) {
  return format == StoreFormat::w2 ? matmul_w2 : format == StoreFormat::w2k ? matmul_w2k : matmul_fp4;
}

void run(benchmark::State& state, StoreFormat format, CpuIsa isa) {
  static const Weights w2 = make(StoreFormat::w2), fp4 = make(StoreFormat::fp4), w2k = make(StoreFormat::w2k);
  const Weights& w = format == StoreFormat::w2 ? w2 : format == StoreFormat::w2k ? w2k : fp4;
  ThreadPool pool(int(state.range(0)));
  std::vector<float> x(static_cast<size_t>(kK), 0.5f), y(static_cast<size_t>(kN));
  int64_t e = 0;
  const BenchClock::time_point start = BenchClock::now();
  for (auto _ : state) {
    const uint8_t* codes = w.codes.data() + e * w.code_bytes;
    const uint8_t* scales = w.scales.data() + e * w.scale_bytes;
    matmul_of(format)(x.data(), 1, kK, codes, scales, kN, y.data(), pool, isa);
    benchmark::DoNotOptimize(y.data());
    e = (e + 1) % kExperts;
  }
  state.SetBytesProcessed(int64_t(state.iterations()) * int64_t(w.code_bytes + w.scale_bytes));
  report_of_memcpy(state, start, w.code_bytes + w.scale_bytes, (w.code_bytes + w.scale_bytes) * kExperts);
}

void BM_MatmulW2(benchmark::State& s) {
  if (const std::optional<CpuIsa> isa = bench_cpu_isa(s, s.range(1))) run(s, StoreFormat::w2, *isa);
}
void BM_MatmulFp4(benchmark::State& s) { run(s, StoreFormat::fp4, cpu_isa_best()); }
void BM_MatmulW2k(benchmark::State& s) { run(s, StoreFormat::w2k, cpu_isa_best()); }

// The ceiling: copy the same number of bytes per iteration, rotating like the matmul.
void BM_Memcpy(benchmark::State& state) {
  const uint64_t bytes = store_codes_bytes(StoreFormat::w2, kN, kK) + store_scales_bytes(kN, kK);
  std::vector<uint8_t> src(bytes * kExperts, 1), dst(bytes);
  int64_t e = 0;
  for (auto _ : state) {
    std::memcpy(dst.data(), src.data() + e * bytes, bytes);
    benchmark::DoNotOptimize(dst.data());
    e = (e + 1) % kExperts;
  }
  state.SetBytesProcessed(int64_t(state.iterations()) * int64_t(bytes));
}

BENCHMARK(BM_MatmulW2)->ArgsProduct({{1, 2}, kBenchIsas})->UseRealTime();
BENCHMARK(BM_MatmulFp4)->Arg(1)->Arg(2)->UseRealTime();
BENCHMARK(BM_MatmulW2k)->Arg(1)->Arg(2)->UseRealTime();
BENCHMARK(BM_Memcpy)->UseRealTime();

}  // namespace
}  // namespace moet

BENCHMARK_MAIN();
