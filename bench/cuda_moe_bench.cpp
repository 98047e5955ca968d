// GPU microbenchmark of the BF16 weight-streaming kernels through the CUDA backend's ops, next to
// the device-to-device copy bandwidth measured in the same run: the grouped-expert MoE op
// (routing groups + gate_up with fused SiLU-mul + down + fixed-order combine) at batch 1, 4, 8
// with top-8 routing on DeepSeek-V3 (hidden 7168, inner 2048) and Qwen3-235B (4096 x 1536)
// expert shapes, and a dense GEMV (an LM head, 151936 x 4096). Bytes counted are the weights
// actually read: each distinct routed expert once. Times are means over 20 calls after 3 warm-ups,
// with one synchronisation at the end. Prints a table and writes JSON (argument 1, optional).
#ifdef MOET_HAVE_CUDA
#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/device_info.h"
#include "core/dtype.h"

#include <nlohmann/json.hpp>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <random>
#include <set>

namespace moet {
namespace {

constexpr int kWarmup = 3, kTimed = 20;

std::vector<uint16_t> random_bf16(size_t n) {
  std::mt19937 rng(7);
  std::normal_distribution<float> normal(0.0f, 0.02f);
  std::vector<uint16_t> out(n);
  for (auto& v : out) v = float_to_bf16(normal(rng));
  return out;
}

template <typename F>
double seconds_per_call(Backend& backend, const Tensor& sync_on, F&& call) {
  std::vector<float> sink(size_t(sync_on.numel()));
  for (int i = 0; i < kWarmup; ++i) call();
  backend.to_host(sync_on, sink.data());
  const auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < kTimed; ++i) call();
  backend.to_host(sync_on, sink.data());
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() / kTimed;
}

nlohmann::json bench_moe(Backend& backend, const char* name, int64_t hidden, int64_t inner, double copy_gbs) {
  const int64_t experts = 64, top_k = 8;
  const auto gate_up = random_bf16(size_t(2 * inner * hidden)), down = random_bf16(size_t(hidden * inner));
  std::vector<ExpertWeights> weights;
  for (int64_t e = 0; e < experts; ++e) {
    weights.push_back({backend.upload({"gate_up", DType::bf16, {2 * inner, hidden},
                                       reinterpret_cast<const uint8_t*>(gate_up.data()), gate_up.size() * 2, "bench"}),
                       backend.upload({"down", DType::bf16, {hidden, inner},
                                       reinterpret_cast<const uint8_t*>(down.data()), down.size() * 2, "bench"})});
  }
  const ExpertSet set = backend.expert_set(std::move(weights));
  const double expert_bytes = double(3 * hidden * inner * 2);
  nlohmann::json rows_out = nlohmann::json::array();
  std::mt19937 rng(11);
  for (int64_t rows : {1, 4, 8}) {
    std::vector<int32_t> ids;
    for (int64_t t = 0; t < rows; ++t) {
      std::vector<int32_t> all(experts);
      for (int32_t e = 0; e < int32_t(experts); ++e) all[size_t(e)] = e;
      std::shuffle(all.begin(), all.end(), rng);
      ids.insert(ids.end(), all.begin(), all.begin() + top_k);
    }
    const size_t distinct = std::set<int32_t>(ids.begin(), ids.end()).size();
    Tensor id_t = backend.alloc({rows, top_k}, DType::i32), w = backend.alloc({rows, top_k});
    Tensor x = backend.alloc({rows, hidden}), out = backend.alloc({rows, hidden});
    backend.from_host(ids.data(), id_t);
    const std::vector<float> ones(size_t(rows * std::max(top_k, hidden)), 0.5f);
    backend.from_host(ones.data(), w);
    backend.from_host(ones.data(), x);
    const double s = seconds_per_call(backend, out, [&] { backend.moe_experts(x, set, id_t, w, out); });
    const double gbs = double(distinct) * expert_bytes / s / 1e9;
    std::printf("%-22s batch %ld  experts read %3zu  %8.1f us  %7.1f GB/s  %5.1f%% of copy\n", name, long(rows),
                distinct, s * 1e6, gbs, 100.0 * gbs / copy_gbs);
    rows_out.push_back({{"batch", rows}, {"distinct_experts", distinct}, {"us", s * 1e6}, {"gb_per_s", gbs},
                        {"fraction_of_copy", gbs / copy_gbs}});
  }
  return {{"op", "moe_experts_bf16"}, {"shape", name}, {"hidden", hidden}, {"inner", inner}, {"top_k", top_k}, {"results", rows_out}};
}

nlohmann::json bench_dense(Backend& backend, int64_t n, int64_t k, double copy_gbs) {
  const auto host = random_bf16(size_t(n * k));
  const Tensor w = backend.upload({"w", DType::bf16, {n, k}, reinterpret_cast<const uint8_t*>(host.data()), host.size() * 2, "bench"});
  nlohmann::json rows_out = nlohmann::json::array();
  for (int64_t rows : {1, 4, 8}) {
    Tensor x = backend.alloc({rows, k}), y = backend.alloc({rows, n});
    const std::vector<float> ones(size_t(rows * k), 0.5f);
    backend.from_host(ones.data(), x);
    const double s = seconds_per_call(backend, y, [&] { backend.matmul(x, w, nullptr, y); });
    const double gbs = double(n * k * 2) / s / 1e9;
    std::printf("dense %ldx%ld       batch %ld  %8.1f us  %7.1f GB/s  %5.1f%% of copy\n", long(n), long(k), long(rows),
                s * 1e6, gbs, 100.0 * gbs / copy_gbs);
    rows_out.push_back({{"batch", rows}, {"us", s * 1e6}, {"gb_per_s", gbs}, {"fraction_of_copy", gbs / copy_gbs}});
  }
  return {{"op", "matmul_bf16"}, {"n", n}, {"k", k}, {"results", rows_out}};
}

}  // namespace
}  // namespace moet

int main(int argc, char** argv) {
  if (moet::cuda_devices().empty()) {
    std::printf("cuda_moe_bench: no CUDA GPU visible; nothing to measure\n");
    return 0;
  }
  auto backend = moet::cuda_backend_create({});
  const double copy_gbs = backend->copy_bandwidth(size_t(2) << 30);
  std::printf("%s\ndevice-to-device copy: %.1f GB/s (read + write)\n", backend->name().c_str(), copy_gbs);
  nlohmann::json report = {{"backend", backend->name()}, {"copy_gb_per_s", copy_gbs}};
  report["benchmarks"].push_back(moet::bench_moe(*backend, "DeepSeek-V3 7168x2048", 7168, 2048, copy_gbs));
  report["benchmarks"].push_back(moet::bench_moe(*backend, "Qwen3-235B 4096x1536", 4096, 1536, copy_gbs));
  report["benchmarks"].push_back(moet::bench_dense(*backend, 151936, 4096, copy_gbs));
  if (argc > 1) std::ofstream(argv[1]) << report.dump(2) << "\n";
  return 0;
}
#else
#include <cstdio>
int main() {
  std::printf("cuda_moe_bench: built without CUDA; nothing to measure\n");
  return 0;
}
#endif
