// GPU microbenchmark of the weight-streaming kernels through the CUDA backend's ops, next to the
// device-to-device copy bandwidth measured in the same run: the grouped-expert MoE op (routing
// groups + gate_up with fused SiLU-mul + down + fixed-order combine) with experts stored as BF16,
// W2 (2-bit codes + UE8M0 scales), W2K (E8 codewords, 2 bits a weight, + UE5M3 scales: the same
// bytes as W2) and MXFP4 (e2m1 nibbles + UE8M0 scales), at batch 1, 4, 8 with
// top-8 routing over 128 experts on DeepSeek-V3 (hidden 7168, inner 2048) and Qwen3-235B
// (4096 x 1536) expert shapes (W2 and W2K also at batch 2048, a prefill, with its TFLOP/s), and a dense
// GEMV (an LM head, 151936 x 4096). Bytes counted are
// those actually read: each distinct routed expert's codes + scales (or BF16 weights) once, plus
// the FP32 activations (x rows and the act rows). Consecutive calls cycle through 4 random
// routings, so an expert set small enough for the 50 MB L2 is not simply re-read from it. Two
// times per case: eager (means over 20 calls after 3 warm-ups, one synchronisation at the end:
// includes host launch overhead when the GPU work is short) and graph (20 calls captured into one
// CUDA graph, replayed 10 times: what a decode step with graphs pays); GB/s and the fraction of
// copy are the graph time's. Next to each, the read ceiling: the same calls' distinct expert bytes
// read by pure-load launches (Backend::read_regions, one per 256 regions: a prefill's 128 experts of
// four planes take two; graph-timed the same way), the most a kernel could do for those bytes; small reads stay well under copy speed (docs/gpu-history.md, Run 7).
// Prints a table and writes JSON (argument 1, optional; "-" for none); argument 2 (optional)
// names the expert formats to run, comma-separated (default w2,w2k,fp4,bf16).
#ifdef MOET_HAVE_CUDA
#include "gpu_bench_start.h"
#include "core/dtype.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <random>
#include <set>
#include <string>
#include <vector>

namespace moet {
namespace {

constexpr int kWarmup = 3, kTimed = 20, kGraphCalls = 20, kGraphReplays = 10;
int64_t next_graph_key = 0;

std::vector<uint16_t> random_bf16(size_t n) {
  std::mt19937 rng(7);
  std::normal_distribution<float> normal(0.0f, 0.02f);
  std::vector<uint16_t> out(n);
  for (auto& v : out) v = float_to_bf16(normal(rng));
  return out;
}

std::vector<uint8_t> random_u8(size_t n, int lo, int hi, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int> dist(lo, hi);
  std::vector<uint8_t> out(n);
  for (auto& v : out) v = uint8_t(dist(rng));
  return out;
}

// format: "bf16", "w2", "w2k" or "fp4".
nlohmann::json bench_moe(Backend& backend, const char* name, const std::string& format, int64_t hidden, int64_t inner,
                         double copy_gbs) {
  const int64_t experts = 128, top_k = 8, routings = 4;
  std::vector<ExpertWeights> weights;
  double expert_bytes = 0.0;
  if (format == "bf16") {
    const auto gate_up = random_bf16(size_t(2 * inner * hidden)), down = random_bf16(size_t(hidden * inner));
    for (int64_t e = 0; e < experts; ++e) {
      weights.push_back({backend.upload({"gate_up", DType::bf16, {2 * inner, hidden},
                                         reinterpret_cast<const uint8_t*>(gate_up.data()), gate_up.size() * 2, "bench"}),
                         backend.upload({"down", DType::bf16, {hidden, inner},
                                         reinterpret_cast<const uint8_t*>(down.data()), down.size() * 2, "bench"})});
    }
    expert_bytes = double(3 * hidden * inner * 2);
  } else {
    const int64_t bits = format == "fp4" ? 4 : 2;
    const int s = format == "w2k" ? 32 : 0;  // W2K UE5M3 bytes 150..156: scales 2^-6..2^-5 (no effect on speed)
    const auto gu = random_u8(size_t(2 * inner * hidden * bits / 8), 0, 255, 1);
    const auto gus = random_u8(size_t(2 * inner * hidden / 32), 118 + s, 124 + s, 2);
    const auto dn = random_u8(size_t(hidden * inner * bits / 8), 0, 255, 3);
    const auto dns = random_u8(size_t(hidden * inner / 32), 118 + s, 124 + s, 4);
    auto up = [&](const std::vector<uint8_t>& v, std::vector<int64_t> shape) {
      return backend.upload({"plane", DType::u8, std::move(shape), v.data(), v.size(), "bench"});
    };
    for (int64_t e = 0; e < experts; ++e) {
      ExpertWeights w;
      w.format = format == "w2" ? ExpertFormat::w2 : format == "w2k" ? ExpertFormat::w2k : ExpertFormat::fp4;
      w.gate_up = up(gu, {2 * inner, hidden * bits / 8});
      w.gate_up_scales = up(gus, {2 * inner, hidden / 32});
      w.down = up(dn, {hidden, inner * bits / 8});
      w.down_scales = up(dns, {hidden, inner / 32});
      weights.push_back(std::move(w));
    }
    expert_bytes = double(gu.size() + gus.size() + dn.size() + dns.size());
  }
  const ExpertFormat stored = format == "bf16"  ? ExpertFormat::dense
                              : format == "w2"  ? ExpertFormat::w2
                              : format == "w2k" ? ExpertFormat::w2k
                                                : ExpertFormat::fp4;
  const ExpertSet set = backend.expert_set({stored, hidden, inner}, std::move(weights));
  nlohmann::json rows_out = nlohmann::json::array();
  std::mt19937 rng(11);
  // The bytes of expert e a call reads: W2 keeps codes and scales in one tiled plane per matrix.
  auto expert_regions = [&](int32_t e, std::vector<ByteRegion>& out) {
    const ExpertWeights& w = set.experts[size_t(e)];
    if (format == "w2") {
      out.push_back({w.gate_up.data, int64_t(w.gate_up.bytes() + w.gate_up_scales.bytes())});
      out.push_back({w.down.data, int64_t(w.down.bytes() + w.down_scales.bytes())});
      return;
    }
    for (const Tensor* t : {&w.gate_up, &w.gate_up_scales, &w.down, &w.down_scales})
      if (!t->empty()) out.push_back({t->data, int64_t(t->bytes())});
  };
  std::vector<int64_t> batches = {1, 4, 8};
  if (format == "w2" || format == "w2k") batches.push_back(2048);  // a prefill (W2: moe_w2_prefill.h)
  for (int64_t rows : batches) {
    std::vector<Tensor> id_ts;
    std::vector<std::vector<ByteRegion>> read_sets;
    double distinct = 0.0;
    for (int64_t k = 0; k < routings; ++k) {
      std::vector<int32_t> ids;
      for (int64_t t = 0; t < rows; ++t) {
        std::vector<int32_t> all(experts);
        for (int32_t e = 0; e < int32_t(experts); ++e) all[size_t(e)] = e;
        std::shuffle(all.begin(), all.end(), rng);
        ids.insert(ids.end(), all.begin(), all.begin() + top_k);
      }
      const std::set<int32_t> experts_read(ids.begin(), ids.end());
      distinct += double(experts_read.size()) / double(routings);
      read_sets.emplace_back();
      for (int32_t e : experts_read) expert_regions(e, read_sets.back());
      id_ts.push_back(backend.alloc({rows, top_k}, DType::i32));
      backend.from_host(ids.data(), id_ts.back());
    }
    Tensor w = backend.alloc({rows, top_k});
    Tensor x = backend.alloc({rows, hidden}), out = backend.alloc({rows, hidden});
    const std::vector<float> ones(size_t(rows * std::max(top_k, hidden)), 0.5f);
    backend.from_host(ones.data(), w);
    backend.from_host(ones.data(), x);
    int64_t call = 0;
    const double eager = eager_seconds_per_call(backend, out, kWarmup, kTimed, [&] {
      backend.moe_experts(x, set, id_ts[size_t(call++ % routings)], w, out);
    });
    const double graph = graph_seconds_per_call(backend, next_graph_key++, out, kGraphCalls, kGraphReplays, [&](int i) {
      backend.moe_experts(x, set, id_ts[size_t(i % routings)], w, out);
    });
    Tensor sink = backend.alloc({1}, DType::i32);
    const double ceiling = graph_seconds_per_call(backend, next_graph_key++, sink, kGraphCalls, kGraphReplays, [&](int i) {
      const std::vector<ByteRegion>& regions = read_sets[size_t(i % routings)];
      for (size_t first = 0; first < regions.size(); first += kReadRegionsMax)
        bench_ops(backend).read_regions(
            {regions.begin() + long(first), regions.begin() + long(std::min(regions.size(), first + kReadRegionsMax))},
            sink);
    });
    const double act_bytes = double(rows * hidden * 4 + rows * top_k * inner * 4);
    const double bytes = distinct * expert_bytes + act_bytes;
    const double gbs = bytes / graph / 1e9, ceiling_fraction = distinct * expert_bytes / ceiling / 1e9 / copy_gbs;
    std::printf("%-5s %-22s batch %ld  experts read %5.1f  eager %8.1f us  graph %8.1f us  %7.1f GB/s  %5.1f%% of copy"
                "  | read ceiling %7.1f us (%5.1f%% of copy), op at %5.1f%% of it\n",
                format.c_str(), name, long(rows), distinct, eager * 1e6, graph * 1e6, gbs, 100.0 * gbs / copy_gbs,
                ceiling * 1e6, 100.0 * ceiling_fraction, 100.0 * ceiling / graph);
    // The products' FLOPs (2 per weight and item), for batches that are compute-bound.
    const double tflops = 2.0 * double(rows * top_k) * 3.0 * double(hidden * inner) / graph / 1e12;
    if (rows > 8) std::printf("      %-22s batch %ld  %.1f TFLOP/s\n", name, long(rows), tflops);
    rows_out.push_back({{"batch", rows}, {"distinct_experts", distinct}, {"bytes", bytes}, {"us_eager", eager * 1e6},
                        {"us_graph", graph * 1e6}, {"gb_per_s", gbs}, {"fraction_of_copy", gbs / copy_gbs},
                        {"us_read_ceiling", ceiling * 1e6}, {"read_ceiling_fraction_of_copy", ceiling_fraction},
                        {"fraction_of_read_ceiling", ceiling / graph}, {"tflops", tflops}});
  }
  return {{"op", "moe_experts_" + format}, {"shape", name}, {"hidden", hidden}, {"inner", inner}, {"top_k", top_k},
          {"experts", experts}, {"expert_bytes", expert_bytes}, {"results", rows_out}};
}

nlohmann::json bench_dense(Backend& backend, int64_t n, int64_t k, double copy_gbs) {
  const auto host = random_bf16(size_t(n * k));
  const Tensor w = backend.upload({"w", DType::bf16, {n, k}, reinterpret_cast<const uint8_t*>(host.data()), host.size() * 2, "bench"});
  nlohmann::json rows_out = nlohmann::json::array();
  for (int64_t rows : {1, 4, 8}) {
    Tensor x = backend.alloc({rows, k}), y = backend.alloc({rows, n});
    const std::vector<float> ones(size_t(rows * k), 0.5f);
    backend.from_host(ones.data(), x);
    const double s = eager_seconds_per_call(backend, y, kWarmup, kTimed, [&] { backend.matmul(x, w, nullptr, y); });
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
  const std::string formats = argc > 2 ? argv[2] : "w2,w2k,fp4,bf16";
  for (size_t begin = 0; begin <= formats.size();) {  // every name must be one of the four
    const size_t end = std::min(formats.find(',', begin), formats.size());
    const std::string name = formats.substr(begin, end - begin);
    if (name != "w2" && name != "w2k" && name != "fp4" && name != "bf16") {
      std::fprintf(stderr,
                   "cuda_moe_bench: unknown expert format '%s' (formats: w2, w2k, fp4, bf16, comma-separated)\n",
                   name.c_str());
      return 2;
    }
    begin = end + 1;
  }
  const moet::CudaBenchStart start = moet::start_cuda_bench("cuda_moe_bench");
  if (!start.backend) return 0;
  moet::Backend* backend = start.backend.get();
  const double copy_gbs = start.copy_gbs;
  nlohmann::json report = {{"backend", backend->name()}, {"copy_gb_per_s", copy_gbs}};
  for (const char* format : {"w2", "w2k", "fp4", "bf16"}) {
    if (("," + formats + ",").find(std::string(",") + format + ",") == std::string::npos) continue;
    report["benchmarks"].push_back(moet::bench_moe(*backend, "DeepSeek-V3 7168x2048", format, 7168, 2048, copy_gbs));
    report["benchmarks"].push_back(moet::bench_moe(*backend, "Qwen3-235B 4096x1536", format, 4096, 1536, copy_gbs));
  }
  report["benchmarks"].push_back(moet::bench_dense(*backend, 151936, 4096, copy_gbs));
  if (argc > 1 && std::string(argv[1]) != "-") std::ofstream(argv[1]) << report.dump(2) << "\n";
  return 0;
}
#else
#include <cstdio>
int main() {
  std::printf("cuda_moe_bench: built without CUDA; nothing to measure\n");
  return 0;
}
#endif
