// GPU microbenchmark of the GLM-5 / DeepSeek-V4 kernels (kernels/cuda/sparse_ops.h) through the
// CUDA backend, one decode row at the real shapes, next to the device copy bandwidth of the same
// run: GLM-5's lightning indexer (32 heads x 128, top 2048) over 4096 and 16384 cached keys and its
// sparse MLA attention (64 heads over 2048 chosen latent rows of 512 + 64), DeepSeek-V4-Flash's
// compressor closing a window (head 512, overlap), its attention over a 128-token window plus 512
// chosen entries (64 heads of 512, sinks) and its hyper-connections (4 streams of 4096) at batch 1
// and 8. Each op is captured 64 times into one CUDA graph and replayed (graph_seconds_per_call):
// what a decode step with graphs pays. bf16 KV caches; bytes counted: the cache rows read (the
// weights for hyper-connections). Prints a table. Not run on a GPU yet (reference-grade kernels).
#ifdef MOET_HAVE_CUDA
#include "gpu_bench_start.h"
#include "core/dtype.h"

#include <algorithm>
#include <random>
#include <string>
#include <vector>

namespace moet {
namespace {

constexpr int kCalls = 64, kReplays = 10;

struct Bench {
  Backend& backend;
  double copy_gbs;
  int64_t next_key = 0;

  Tensor random(std::vector<int64_t> shape, float scale = 1.0f) {
    Tensor t = backend.alloc(std::move(shape));
    std::mt19937 rng(uint32_t(next_key * 7 + 1));
    std::normal_distribution<float> normal(0.0f, scale);
    std::vector<float> values(size_t(t.numel()));
    for (auto& v : values) v = normal(rng);
    backend.from_host(values.data(), t);
    return t;
  }
  // `rows` rows of one sequence of `keys` positions (blocks of 16), the rows at the last positions.
  KvLayerCache cache(int64_t keys, int64_t dim, int64_t value_dim) {
    return backend.alloc_kv((keys + 15) / 16, 16, {KvDtype::bf16, 1, dim, value_dim, true});
  }
  void begin_step(int64_t rows, int64_t keys, std::vector<int32_t>& table) {
    table.resize(size_t((keys + 15) / 16));
    for (size_t i = 0; i < table.size(); ++i) table[i] = int32_t(i);
    std::vector<int32_t> tokens(size_t(rows), 0), positions, row_seq(size_t(rows), 0);
    std::vector<int64_t> slots;
    for (int64_t t = 0; t < rows; ++t) {
      positions.push_back(int32_t(keys - rows + t));
      slots.push_back(keys - rows + t);
    }
    const int32_t* tables[] = {table.data()};
    backend.begin_step({rows, tokens.data(), positions.data(), row_seq.data(), slots.data(), 1, tables, 16});
  }
  template <typename Op>
  void report(const std::string& what, const Tensor& out, double bytes, Op&& op) {
    const double seconds = graph_seconds_per_call(backend, next_key++, out, kCalls, kReplays, [&](int) { op(); });
    const double gbs = bytes / seconds / 1e9;
    std::printf("%-44s %9.2f us  %7.1f GB/s  %5.1f%% of copy\n", what.c_str(), seconds * 1e6, gbs,
                100.0 * gbs / copy_gbs);
  }
};

void indexer(Bench& b, int64_t keys) {
  std::vector<int32_t> table;
  KvLayerCache cache = b.cache(keys, 128, 128);
  b.begin_step(1, keys, table);
  Tensor q = b.random({1, 32 * 128}), w = b.random({1, 32});
  Tensor out = b.backend.alloc({1, 2048}, DType::i32);
  b.report("glm-5 indexer_topk " + std::to_string(keys) + " keys", out, double(keys) * 256.0,
           [&] { b.backend.indexer_topk(cache, q, 32, w, 0.088f, 1, out); });
}

void gather(Bench& b, int64_t keys) {
  std::vector<int32_t> table;
  KvLayerCache cache = b.cache(keys, 576, 512);
  b.begin_step(1, keys, table);
  std::vector<int32_t> chosen(2048);
  for (int64_t i = 0; i < 2048; ++i) chosen[size_t(i)] = int32_t(i * keys / 2048);
  Tensor positions = b.backend.alloc({1, 2048}, DType::i32);
  b.backend.from_host(chosen.data(), positions);
  Tensor q = b.random({1, 64, 576}), out = b.backend.alloc({1, 64, 512});
  const AttentionKeys source{&cache, &positions};
  b.report("glm-5 attention_gather 2048 of " + std::to_string(keys), out, 2048.0 * 1152.0,
           [&] { b.backend.attention_gather({&source, 1}, q, 64, 576, 0.0625f, nullptr, out); });
}

void deepseek_v4(Bench& b) {
  std::vector<int32_t> table;
  const int64_t keys = 4096;
  KvLayerCache window = b.cache(keys, 512, 512), entries = b.cache(keys, 512, 512), state = b.cache(keys, 2048, 2048);
  b.begin_step(1, keys, table);
  std::vector<int32_t> chosen(512);
  for (int64_t i = 0; i < 512; ++i) chosen[size_t(i)] = int32_t(i * 4 + 3);
  Tensor positions = b.backend.alloc({1, 512}, DType::i32);
  b.backend.from_host(chosen.data(), positions);
  Tensor q = b.random({1, 64, 512}), sinks = b.random({64}), out = b.backend.alloc({1, 64, 512});
  const AttentionKeys sources[] = {{&window, nullptr, 128, 1}, {&entries, &positions}};
  b.report("v4 attention_gather window 128 + 512", out, 640.0 * 1024.0,
           [&] { b.backend.attention_gather(sources, q, 64, 512, 0.044f, &sinks, out); });
  Tensor bias = b.random({4, 1024}), norm = b.random({512});
  RopeTable rope;
  for (int i = 0; i < 32; ++i) rope.inv_freq.push_back(1.0f / float(1 << (i % 16)));
  rope.interleaved = rope.pairs_in_place = true;
  b.report("v4 kv_compress window of 4", entries.k, 8.0 * 4096.0,
           [&] { b.backend.kv_compress({4, true, 1e-6f, &bias, &norm, &rope}, state, entries); });
  for (int64_t rows : {1, 8}) {
    b.begin_step(rows, keys, table);
    Tensor streams = b.random({rows, 4, 4096}), fn = b.random({24, 4 * 4096}, 0.01f), base = b.random({24});
    Tensor scale = b.random({3}), post = b.backend.alloc({rows, 4}), comb = b.backend.alloc({rows, 4, 4});
    Tensor collapsed = b.backend.alloc({rows, 4096});
    const HyperConnectionWeights w{&fn, &base, &scale, 4, 20, 1e-6f, 1e-6f};
    b.report("v4 hc_pre + hc_post batch " + std::to_string(rows), collapsed, 24.0 * 16384.0 * 4.0, [&] {
      b.backend.hc_pre(w, streams, post, comb, collapsed);
      b.backend.hc_post(w, streams, collapsed, post, comb);
    });
  }
}

}  // namespace
}  // namespace moet

int main() {
  moet::CudaBenchStart start = moet::start_cuda_bench("cuda_sparse_bench");
  if (!start.backend) return 0;
  moet::Bench bench{*start.backend, start.copy_gbs};
  for (int64_t keys : {4096, 16384}) moet::indexer(bench, keys);
  for (int64_t keys : {4096, 16384}) moet::gather(bench, keys);
  moet::deepseek_v4(bench);
  return 0;
}
#else
#include <cstdio>
int main() {
  std::printf("cuda_sparse_bench: built without CUDA; nothing to measure\n");
  return 0;
}
#endif
