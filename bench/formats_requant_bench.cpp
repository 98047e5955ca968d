// Requantization throughput: GB/s of source weights (BF16 and FP8-block experts of DeepSeek-V3
// size, [2048, 7168]) turned into W2 (reference and opt), W2K or the MXFP4 tier, with 1 and 2
// threads (W2K: one [256, 7168] slice, its quantizer being ~100x slower). W2K's LDLQ quantizer
// and, for comparison, the reference on [256, 2048] (the width of DeepSeek-V3's down input: LDLQ's
// feedback grows with K), and LDLQ's decomposition of a [2048, 2048] second-moment matrix.
// Run: build/bench/formats_requant_bench (numbers go into docs/formats.md).
#include "core/dtype.h"
#include "formats/checkpoint_formats.h"
#include "formats/requant.h"

#include <benchmark/benchmark.h>

#include <cmath>
#include <random>

namespace moet {
namespace {

constexpr int64_t kRows = 2048, kCols = 7168;

const std::vector<double>& values() {
  static const std::vector<double> v = [] {
    std::mt19937 rng(1);
    std::normal_distribution<float> normal(0, 0.02f);
    std::vector<double> out(size_t(kRows * kCols));
    for (auto& x : out) x = bf16_to_float(float_to_bf16(normal(rng)));
    return out;
  }();
  return v;
}

SourceView bf16_source() {
  static const std::vector<uint16_t> data = [] {
    std::vector<uint16_t> out;
    for (double x : values()) out.push_back(float_to_bf16(float(x)));
    return out;
  }();
  SourceView v;
  v.format = SourceFormat::bf16;
  v.rows = kRows;
  v.cols = kCols;
  v.data = reinterpret_cast<const uint8_t*>(data.data());
  return v;
}

SourceView fp8_source() {
  static const Fp8BlockTensor t = fp8_block_quantize(values().data(), kRows, kCols, "bench");
  return t.view("bench");
}

// Column importance as an imatrix gives it (varied, positive).
const std::vector<float>& importance() {
  static const std::vector<float> imp = [] {
    std::mt19937 rng(2);
    std::uniform_real_distribution<float> u(0.1f, 2.0f);
    std::vector<float> out(static_cast<size_t>(kCols));
    for (auto& x : out) x = u(rng);
    return out;
  }();
  return imp;
}

// A second-moment matrix of `k` inputs correlated with their neighbours.
std::vector<float> moments(int64_t k) {
  std::vector<float> h(size_t(k * k));
  for (int64_t i = 0; i < k; ++i)
    for (int64_t j = 0; j < k; ++j) h[size_t(i * k + j)] = float(double(i == j) + 0.5 * std::exp(-std::abs(double(i - j)) / 8));
  return h;
}

constexpr int64_t kLdlqCols = 2048;

const W2kLdlqFactor& ldlq_factor() {
  static const W2kLdlqFactor f = [] {
    ThreadPool pool(0);
    return w2k_ldlq_factor(moments(kLdlqCols).data(), kLdlqCols, pool);
  }();
  return f;
}

// The BF16 source as [256, kLdlqCols].
SourceView ldlq_slice() {
  SourceView slice = bf16_source();
  slice.rows = 256;
  slice.cols = kLdlqCols;
  return slice;
}

void run(benchmark::State& state, const SourceView& src, StoreFormat format,
         W2Quantizer quantizer = W2Quantizer::reference, const W2kLdlqFactor* ldlq = nullptr) {
  ThreadPool pool(int(state.range(0)));
  BlockTensor out;
  out.codes.resize(store_codes_bytes(format, src.rows, src.cols));
  out.scales.resize(store_scales_bytes(src.rows, src.cols));
  const bool weighted = (format == StoreFormat::w2k && ldlq == nullptr) || quantizer == W2Quantizer::opt;
  const QuantizeOptions options{ZeroMode::automatic, quantizer, weighted ? importance().data() : nullptr, ldlq};
  for (auto _ : state) {
    quantize_into(format, src, options, pool, out.codes.data(), out.scales.data());
    benchmark::DoNotOptimize(out.codes.data());
  }
  state.SetBytesProcessed(int64_t(state.iterations()) * int64_t(source_data_bytes(src)));
}

void BM_RequantBf16ToW2(benchmark::State& s) { run(s, bf16_source(), StoreFormat::w2); }
void BM_RequantBf16ToFp4(benchmark::State& s) { run(s, bf16_source(), StoreFormat::fp4); }
void BM_RequantFp8ToW2(benchmark::State& s) { run(s, fp8_source(), StoreFormat::w2); }
void BM_RequantBf16ToW2Opt(benchmark::State& s) { run(s, bf16_source(), StoreFormat::w2, W2Quantizer::opt); }
void BM_RequantBf16ToW2k(benchmark::State& s) {
  SourceView slice = bf16_source();
  slice.rows = 256;
  run(s, slice, StoreFormat::w2k);
}
void BM_RequantBf16ToW2kNarrow(benchmark::State& s) { run(s, ldlq_slice(), StoreFormat::w2k); }
void BM_RequantBf16ToW2kLdlq(benchmark::State& s) {
  run(s, ldlq_slice(), StoreFormat::w2k, W2Quantizer::reference, &ldlq_factor());
}
void BM_W2kLdlqFactor(benchmark::State& state) {
  const std::vector<float> h = moments(kLdlqCols);
  ThreadPool pool(int(state.range(0)));
  for (auto _ : state) benchmark::DoNotOptimize(w2k_ldlq_factor(h.data(), kLdlqCols, pool).U.data());
}

BENCHMARK(BM_RequantBf16ToW2)->Arg(1)->Arg(2)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_RequantBf16ToFp4)->Arg(1)->Arg(2)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_RequantFp8ToW2)->Arg(1)->Arg(2)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_RequantBf16ToW2Opt)->Arg(1)->Arg(2)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_RequantBf16ToW2k)->Arg(1)->Arg(2)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_RequantBf16ToW2kNarrow)->Arg(1)->Arg(2)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_RequantBf16ToW2kLdlq)->Arg(1)->Arg(2)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_W2kLdlqFactor)->Arg(1)->Arg(2)->Unit(benchmark::kMillisecond)->UseRealTime();

}  // namespace
}  // namespace moet

BENCHMARK_MAIN();
