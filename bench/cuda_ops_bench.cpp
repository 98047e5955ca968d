// GPU microbenchmark of the dense ops through the CUDA backend, next to the device copy bandwidth
// measured in the same run: the BF16 GEMV at Qwen3-235B's decode shapes (q / o projections
// 8192 x 4096 and 4096 x 8192, K / V 512 x 4096, router gate 128 x 4096; K+V and q+K+V as one
// matmul_group launch) and an LM head (151936 x 4096) at batch 1, 4, 8; prefill-sized BF16
// products (16 to 2048 rows) on the tensor cores next to the GEMV; the FP8-block GEMV (e4m3
// codes, 128x128 F32 block scales) at DeepSeek-V3's dense shapes (q_a 1536 x 7168, q_b 24576 x
// 1536, kv_a 576 x 7168, o 7168 x 16384, shared expert gate_up 4096 x 7168 and down 7168 x 2048;
// labels "fp8 ...") at batch 1, 4, 8, and its prefill-sized products on the tensor cores next to
// the GEMV (o and q_b; labels "gemm fp8 ..."); paged decode attention (64 query / 4 KV heads of
// 128, KV blocks of 16) at contexts 48, 128 and 4096, batch 1 and 8, and at 4096 and 16384 keys for
// every KV cache dtype, GQA and DeepSeek-V3's MLA latent (labels "kv attention [mla] DTYPE N": the
// KV bytes read per second against the copy bandwidth, docs/kv.md; GQA BF16 / FP8 caches take the
// split-K kernel, measured also at 32 / 4 heads, "kv attention 32/4 DTYPE N"; MLA BF16 / FP8 /
// NVFP4 caches the MLA split-K kernel, compute-bound: its rows also print the tensor cores' FLOP/s,
// three BF16 pieces of both products, against the dense BF16 peak kTensorPeakTflops); the attention of 2048- and
// 4096-token prefills (eager, as the engine runs them: the tensor-core prefill kernel; at 2048
// next to the decode kernel, which a graph capture takes) and of a 2048-token DeepSeek-V3 prefill
// (MLA: 128 heads over the latent cache, label "prefill attention mla 2048"); the router (Qwen3: softmax top-8 of
// 128; DeepSeek-V3: sigmoid, grouped top-8 of 256) at batch 1 and 8; top_logits (the best 1, 50
// and 256 logits per row, device sampling) over vocabularies of 151936 (Qwen3) and 129280
// (DeepSeek-V3) at batch 1, 8 and 64; logit_confidence (the confidence gate's signals) over
// 151936 at batch 1, 8 and 64. Each op except the prefill attention is captured kCalls
// times into one CUDA graph (run_graph) and the graph replayed kReplays times, so the time per
// call is what a decode step with graphs pays: kernel plus launch gap. Weights and KV caches
// rotate over copies of at least 256 MB in all (at most 64), so calls do not hit the 50 MB L2.
// Bytes counted: the weights (GEMV; FP8: codes and scales); the K/V rows, once per KV head
// (attention); the logits, once (top_logits, logit_confidence). Prints a table and writes JSON (argument 1,
// optional). MOET_OPS_BENCH_ONLY=TEXT[,TEXT...] runs only the benchmarks whose label ("q_proj",
// "attention 4096", "router softmax", ...) contains one of the TEXTs (^TEXT: starts with it), so
// a profiler such as Nsight Compute can be pointed at the first launches of one op.
#ifdef MOET_HAVE_CUDA
#include "gpu_bench_start.h"
#include "core/dtype.h"
#include "formats/minifloat.h"
#include "kv/kv_cache.h"

#include <fmt/format.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <numeric>
#include <random>
#include <string>
#include <vector>

namespace moet {
namespace {

constexpr int kCalls = 64, kReplays = 10;
constexpr double kRotateBytes = 256.0 * (1 << 20);
constexpr double kTensorPeakTflops = 989.4;  // dense BF16, H100 SXM / H200 (NVIDIA's data sheets)

struct Bench {
  Backend& backend;
  double copy_gbs;
  int64_t next_key = 0;

  template <typename Op>
  double seconds_per_call(const Tensor& out, Op&& op) {
    return graph_seconds_per_call(backend, next_key++, out, kCalls, kReplays, op);
  }

  // `tensor_flops` > 0: also the tensor cores' FLOP/s against kTensorPeakTflops.
  nlohmann::json report(const std::string& what, int64_t batch, double seconds, double bytes,
                        double tensor_flops = 0.0) {
    const double gbs = bytes / seconds / 1e9, tflops = tensor_flops / seconds / 1e12;
    if (bytes > 0) {
      std::printf("%-34s batch %ld  %8.2f us  %7.1f GB/s  %5.1f%% of copy", what.c_str(), long(batch), seconds * 1e6,
                  gbs, 100.0 * gbs / copy_gbs);
    } else {
      std::printf("%-34s batch %ld  %8.2f us", what.c_str(), long(batch), seconds * 1e6);
    }
    if (tensor_flops > 0) std::printf("  %6.1f TFLOP/s  %5.1f%% of peak", tflops, 100.0 * tflops / kTensorPeakTflops);
    std::printf("\n");
    nlohmann::json row = {{"batch", batch}, {"us", seconds * 1e6}};
    if (bytes > 0) row.update({{"bytes", bytes}, {"gb_per_s", gbs}, {"fraction_of_copy", gbs / copy_gbs}});
    if (tensor_flops > 0)
      row.update({{"tensor_tflops", tflops}, {"fraction_of_tensor_peak", tflops / kTensorPeakTflops}});
    return row;
  }

  // A step of `rows` rows (row t of sequence t at position positions[t], or of sequence 0 with
  // `one_sequence`; blocks of 16), for run_graph.
  void begin_step(const std::vector<int32_t>& positions, const std::vector<std::vector<int32_t>>& tables,
                  bool one_sequence = false) {
    const int64_t rows = int64_t(positions.size());
    std::vector<int32_t> tokens(static_cast<size_t>(rows), 0), row_seq(static_cast<size_t>(rows), 0);
    std::vector<int64_t> slots(size_t(rows), 0);
    std::vector<const int32_t*> table_ptrs;
    for (int64_t t = 0; t < rows && !one_sequence; ++t) row_seq[size_t(t)] = int32_t(t);
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

// Copies of one weight [n, k] in backend memory: BF16 N(0, 0.02) values, or FP8-block codes of
// such values over scales of 0.02 / 64 (e4m3 of each BF16 pattern value, through a table).
std::vector<Tensor> bench_weights(Backend& backend, bool fp8, int64_t n, int64_t k, int64_t copies) {
  constexpr float kScale = 0.02f / 64.0f;
  std::mt19937 rng(7);
  std::normal_distribution<float> normal(0.0f, 0.02f);
  std::vector<uint16_t> pattern(size_t(1) << 20);
  for (auto& v : pattern) v = float_to_bf16(normal(rng));
  std::vector<uint16_t> host(size_t(n * k));
  for (size_t i = 0; i < host.size(); ++i) host[i] = pattern[i % pattern.size()];
  const std::vector<int64_t> scale_shape = fp8_block_scale_shape(n, k);
  const std::vector<float> scales(size_t(scale_shape[0] * scale_shape[1]), kScale);
  std::vector<uint8_t> codes;
  if (fp8) {
    std::vector<uint8_t> table(size_t(1) << 16);
    for (size_t bits = 0; bits < table.size(); ++bits) table[bits] = e4m3_from_double(bf16_to_float(uint16_t(bits)) / kScale);
    for (uint16_t v : host) codes.push_back(table[v]);
  }
  std::vector<Tensor> out;
  for (int64_t c = 0; c < copies; ++c) {
    if (!fp8) {
      out.push_back(backend.upload({"w", DType::bf16, {n, k}, reinterpret_cast<const uint8_t*>(host.data()),
                                    host.size() * 2, "bench"}));
      continue;
    }
    Tensor code_plane = backend.upload({"w", DType::u8, {n, k}, codes.data(), codes.size(), "bench"});
    Tensor scale_plane = backend.upload({"s", DType::f32, scale_shape, reinterpret_cast<const uint8_t*>(scales.data()),
                                         scales.size() * sizeof(float), "bench"});
    out.push_back(fp8_block_weight(code_plane, scale_plane, "bench"));
  }
  return out;
}

// y = x @ w^T with BF16 (or FP8-block) weights [n, k] per call, or with `group` more products of
// other heights of the same x (Backend::matmul_group, GQA's q, k and v in one launch), counting
// every matrix's bytes.
nlohmann::json bench_gemv(Bench& b, int64_t n, int64_t k, const char* name, const std::vector<int64_t>& group = {},
                          bool fp8 = false) {
  std::vector<int64_t> heights = {n};
  heights.insert(heights.end(), group.begin(), group.end());
  double bytes = 0.0;
  for (int64_t h : heights) {
    const std::vector<int64_t> scales = fp8_block_scale_shape(h, k);
    bytes += fp8 ? double(h * k + scales[0] * scales[1] * 4) : double(h * k * 2);
  }
  std::vector<std::vector<Tensor>> weights;  // per part, rotating copies
  for (int64_t h : heights) weights.push_back(bench_weights(b.backend, fp8, h, k, copies_for(bytes)));
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
    std::string what = std::string(group.empty() ? "matmul " : "matmul_group ") + (fp8 ? "fp8 " : "") + name + " " +
                       std::to_string(n);
    for (int64_t h : group) what += "+" + std::to_string(h);
    rows_out.push_back(b.report(what + "x" + std::to_string(k), rows, s, bytes));
  }
  const std::string op = std::string(group.empty() ? "matmul_" : "matmul_group_") + (fp8 ? "fp8_block" : "bf16");
  return {{"op", op}, {"name", name}, {"n", heights}, {"k", k}, {"results", rows_out}};
}

// Prefill-sized products y = x @ w^T (BF16 or FP8-block weights [n, k]) on the tensor cores (the
// backend's GEMM from gemm_min_rows rows: two BF16 GEMMs over the split activations; FP8: the
// weights decoded and split a scratch tile at a time, three GEMMs) and on the CUDA-core GEMV (a
// second backend with gemm_min_rows = 0) in the same run: time per call and TFLOP/s counting the
// product's 2 rows n k FLOPs once.
nlohmann::json bench_gemm(Bench& b, Bench& gemv_only, int64_t n, int64_t k, const char* name, bool fp8 = false) {
  const std::vector<int64_t> scales = fp8_block_scale_shape(n, k);
  const double bytes = fp8 ? double(n * k + scales[0] * scales[1] * 4) : double(n * k * 2);
  nlohmann::json rows_out = nlohmann::json::array();
  std::vector<Tensor> weights[2] = {bench_weights(b.backend, fp8, n, k, copies_for(bytes)),
                                    bench_weights(gemv_only.backend, fp8, n, k, copies_for(bytes))};
  for (int64_t rows : {16, 64, 256, 2048}) {
    double seconds[2];
    Bench* sides[2] = {&b, &gemv_only};
    for (int side = 0; side < 2; ++side) {
      Backend& backend = sides[side]->backend;
      const Tensor x = sides[side]->filled({rows, k}, 0.5f);
      Tensor y = backend.alloc({rows, n});
      backend.matmul(x, weights[side][0], nullptr, y);  // outside the capture: makes the GEMM
      seconds[side] = sides[side]->seconds_per_call(
          y, [&](int i) { backend.matmul(x, weights[side][size_t(i) % weights[side].size()], nullptr, y); });
    }
    const double flops = 2.0 * double(rows * n * k);
    std::printf("gemm %-3s %-16s %6ldx%-6ld rows %5ld  tensor cores %9.2f us %6.1f TFLOP/s   GEMV %9.2f us %6.1f "
                "TFLOP/s  %5.2fx\n",
                fp8 ? "fp8" : "", name, long(n), long(k), long(rows), seconds[0] * 1e6, flops / seconds[0] / 1e12,
                seconds[1] * 1e6, flops / seconds[1] / 1e12, seconds[1] / seconds[0]);
    rows_out.push_back({{"rows", rows},
                        {"gemm_us", seconds[0] * 1e6},
                        {"gemm_tflops", flops / seconds[0] / 1e12},
                        {"gemv_us", seconds[1] * 1e6},
                        {"gemv_tflops", flops / seconds[1] / 1e12}});
  }
  return {{"op", fp8 ? "matmul_fp8_block_many_rows" : "matmul_bf16_many_rows"},
          {"name", name},
          {"n", n},
          {"k", k},
          {"results", rows_out}};
}

// Fills every slot of `cache` (slots of `values` floats) through kv_write with N(0, 1) values (a
// pattern of 2^20 repeated).
void fill_kv(Bench& b, KvLayerCache& cache, int64_t slots, int64_t values, bool mla) {
  static const std::vector<float> pattern = [] {
    std::mt19937 rng(5);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    std::vector<float> out(size_t(1) << 20);
    for (auto& v : out) v = normal(rng);
    return out;
  }();
  std::vector<float> host(size_t(slots * values));
  for (size_t i = 0; i < host.size(); ++i) host[i] = pattern[(i * 7919) % pattern.size()];
  Tensor k = b.backend.alloc({slots, values});
  b.backend.from_host(host.data(), k);
  std::vector<int32_t> tokens(size_t(slots), 0), positions(size_t(slots), 0), row_seq(size_t(slots), 0);
  std::vector<int64_t> slot_ids(static_cast<size_t>(slots));
  std::iota(slot_ids.begin(), slot_ids.end(), int64_t(0));
  const int32_t table = 0;
  const int32_t* tables[] = {&table};
  b.backend.begin_step({slots, tokens.data(), positions.data(), row_seq.data(), slot_ids.data(), 1, tables, 16});
  b.backend.kv_write(cache, k, mla ? nullptr : &k);
}

// Paged decode attention over `context` keys, batch 1 and 8: GQA (64 query / 4 KV heads of 128)
// or, with `mla`, DeepSeek-V3's 128 heads over the latent cache (576 / 512); the cache in `dtype`,
// filled with N(0, 1) rows through kv_write. Bytes: the K/V slots read (codes and scales), once
// per KV head, so GB/s is the KV bytes read per second.
nlohmann::json bench_attention(Bench& b, int64_t context, KvDtype dtype = KvDtype::f32, bool mla = false,
                               int64_t gqa_heads = 64) {
  const int64_t q_heads = mla ? 128 : gqa_heads, kv_heads = mla ? 1 : 4;
  const int64_t k_dim = mla ? 576 : 128, v_dim = mla ? 512 : 128;
  const int64_t block_size = 16, blocks_per_row = (context + block_size - 1) / block_size;
  const KvLayout layout{dtype, kv_heads, k_dim, v_dim, mla};
  const int64_t slot_bytes = kv_slot_layout(layout).bytes;
  nlohmann::json rows_out = nlohmann::json::array();
  for (int64_t rows : {1, 8}) {
    const double bytes = double(rows * context * (mla ? 1 : 2) * slot_bytes);
    std::vector<KvLayerCache> caches;
    for (int64_t c = 0; c < copies_for(bytes); ++c) {
      caches.push_back(b.backend.alloc_kv(rows * blocks_per_row, block_size, layout));
      fill_kv(b, caches.back(), rows * blocks_per_row * block_size, kv_heads * k_dim, mla);
    }
    std::vector<std::vector<int32_t>> tables(static_cast<size_t>(rows));
    for (int64_t t = 0; t < rows; ++t)
      for (int64_t blk = 0; blk < blocks_per_row; ++blk) tables[size_t(t)].push_back(int32_t(t * blocks_per_row + blk));
    b.begin_step(std::vector<int32_t>(size_t(rows), int32_t(context - 1)), tables);
    const Tensor q = b.filled({rows, q_heads, k_dim}, 0.01f);
    Tensor out = b.backend.alloc({rows, q_heads, v_dim});
    const float scale = 1.0f / std::sqrt(float(k_dim));
    const double s = b.seconds_per_call(out, [&](int i) {
      b.backend.attention(caches[size_t(i) % caches.size()], q, q_heads, k_dim, scale, out);
    });
    const std::string shape = mla ? "attention mla 128 x 576/512" : fmt::format("attention {}/4 x 128", q_heads);
    // The MLA split-K kernel's MMAs: 2 (576 + 512) FLOPs per head and key, times 3 BF16 pieces.
    const bool splitk_mla = mla && dtype != KvDtype::f32;
    const double tensor_flops = splitk_mla ? 3.0 * 2.0 * double((k_dim + v_dim) * q_heads * rows * context) : 0.0;
    rows_out.push_back(
        b.report(fmt::format("{} {} {}", shape, kv_dtype_name(dtype), context), rows, s, bytes, tensor_flops));
  }
  return {{"op", mla ? "attention_mla" : "attention"}, {"kv_cache_dtype", kv_dtype_name(dtype)},
          {"q_heads", q_heads}, {"kv_heads", kv_heads}, {"k_dim", k_dim}, {"v_dim", v_dim}, {"context", context},
          {"kv_bytes_per_token", (mla ? 1 : 2) * slot_bytes}, {"results", rows_out}};
}

// The attention of a prefill: `tokens` rows of one sequence at positions 0..tokens-1 (each row
// attends its causal prefix), q_heads / 4 KV heads of 128; TFLOP/s counting the score and output
// products (4 * head_dim FLOPs per query head and key attended). Eager calls, as the engine runs
// a prefill: the tensor-core prefill kernel (prefill_attention.h). With `with_decode_kernel`,
// next to it the same calls captured in a CUDA graph, which takes the decode kernel (one block
// per row and head group), as every prefill did before. With `mla`, DeepSeek-V3's absorbed MLA
// instead: q_heads heads over the latent cache (one KV head of 576 floats, V its first 512;
// 2 * (576 + 512) FLOPs per query head and key), the decode kernel's graph of 2 calls replayed 3
// times (a call takes tens of ms).
nlohmann::json bench_prefill_attention(Bench& b, int64_t q_heads, int64_t tokens, bool with_decode_kernel,
                                       bool mla = false) {
  const int64_t kv_heads = mla ? 1 : 4, k_dim = mla ? 576 : 128, v_dim = mla ? 512 : 128, block_size = 16;
  const int64_t blocks = (tokens + block_size - 1) / block_size;
  KvLayerCache cache = b.backend.alloc_kv(blocks, block_size, KvLayout{KvDtype::f32, kv_heads, k_dim, v_dim, mla});
  std::vector<int32_t> positions(static_cast<size_t>(tokens)), table(static_cast<size_t>(blocks));
  std::iota(positions.begin(), positions.end(), 0);
  std::iota(table.begin(), table.end(), 0);
  b.begin_step(positions, {table}, true);
  const Tensor q = b.filled({tokens, q_heads, k_dim}, 0.01f);
  Tensor out = b.backend.alloc({tokens, q_heads, v_dim});
  const float scale = 1.0f / std::sqrt(float(k_dim));
  const auto call = [&] { b.backend.attention(cache, q, q_heads, k_dim, scale, out); };
  const double flops = 2.0 * double((k_dim + v_dim) * q_heads) * double(tokens) * double(tokens + 1) / 2.0;
  const double s = eager_seconds_per_call(b.backend, out, 2, mla ? 5 : 10, call);
  const std::string what = mla ? "prefill attention mla " + std::to_string(q_heads) + " x 576/512"
                               : "prefill attention " + std::to_string(q_heads) + "/4 x 128";
  std::printf("%-34s tokens %ld  %9.2f us  %6.2f TFLOP/s", what.c_str(), long(tokens), s * 1e6, flops / s / 1e12);
  nlohmann::json row = {{"op", mla ? "prefill_attention_mla" : "prefill_attention"}, {"q_heads", q_heads},
                        {"kv_heads", kv_heads}, {"k_dim", k_dim}, {"v_dim", v_dim}, {"tokens", tokens},
                        {"us", s * 1e6}, {"tflops", flops / s / 1e12}};
  if (!mla) row["head_dim"] = k_dim;
  if (with_decode_kernel) {
    const double d = mla ? graph_seconds_per_call(b.backend, b.next_key++, out, 2, 3, [&](int) { call(); })
                         : b.seconds_per_call(out, [&](int) { call(); });
    std::printf("   decode kernel %9.2f us  %6.2f TFLOP/s  (%.1fx)", d * 1e6, flops / d / 1e12, d / s);
    row.update({{"decode_kernel_us", d * 1e6}, {"decode_kernel_tflops", flops / d / 1e12}});
  }
  std::printf("\n");
  return row;
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

// Rotating device copies of `rows` logit rows of normal values (as an LM head's), enough of them
// that a timed loop reads from memory, not from L2.
std::vector<Tensor> rotating_logits(Bench& b, int64_t rows, int64_t vocab, std::mt19937& rng) {
  std::normal_distribution<float> normal(0.0f, 2.0f);
  std::vector<float> host(size_t(rows * vocab));
  for (auto& v : host) v = normal(rng);
  std::vector<Tensor> logits;
  for (int64_t c = 0; c < copies_for(double(rows * vocab * 4)); ++c) {
    logits.push_back(b.backend.alloc({rows, vocab}));
    b.backend.from_host(host.data(), logits.back());
  }
  return logits;
}

// The best k logits of each of `rows` rows (normal values, as an LM head's), k = 1, 50, 256.
nlohmann::json bench_top_logits(Bench& b, int64_t vocab) {
  std::mt19937 rng(11);
  b.begin_step({0}, {{0}});
  nlohmann::json rows_out = nlohmann::json::array();
  for (int64_t rows : {1, 8, 64}) {
    const double bytes = double(rows * vocab * 4);
    const std::vector<Tensor> logits = rotating_logits(b, rows, vocab, rng);
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

// The confidence gate's signals (largest probability and margin) of `rows` logit rows.
nlohmann::json bench_logit_confidence(Bench& b, int64_t vocab) {
  std::mt19937 rng(12);
  b.begin_step({0}, {{0}});
  nlohmann::json rows_out = nlohmann::json::array();
  for (int64_t rows : {1, 8, 64}) {
    const double bytes = double(rows * vocab * 4);
    const std::vector<Tensor> logits = rotating_logits(b, rows, vocab, rng);
    Tensor out = b.backend.alloc({rows, 2});
    const double s =
        b.seconds_per_call(out, [&](int i) { b.backend.logit_confidence(logits[size_t(i) % logits.size()], out); });
    rows_out.push_back(b.report("logit_confidence " + std::to_string(vocab), rows, s, bytes));
  }
  return {{"op", "logit_confidence"}, {"vocab", vocab}, {"results", rows_out}};
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
  const auto selected = [&](const std::string& label) {
    if (only == nullptr) return true;
    std::string texts = only;
    for (size_t start = 0, end; start <= texts.size(); start = end + 1) {
      end = std::min(texts.find(',', start), texts.size());
      const std::string text = texts.substr(start, end - start);
      const bool anchored = !text.empty() && text[0] == '^';
      const size_t at = label.find(anchored ? text.substr(1) : text);
      if (anchored ? at == 0 : at != std::string::npos) return true;
    }
    return false;
  };
  const auto run = [&](const std::string& label, auto&& benchmark) {
    if (selected(label)) out.push_back(benchmark());
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
  std::unique_ptr<moet::Backend> gemv_backend;  // the GEMV's side of the GEMM benchmarks
  std::unique_ptr<moet::Bench> gemv_bench;
  const auto gemm = [&](int64_t n, int64_t k, const char* name, bool fp8 = false) {
    run(std::string(fp8 ? "gemm fp8 " : "gemm ") + name, [&] {
      if (!gemv_backend) {
        gemv_backend = moet::cuda_backend_create({0, 0.9, 0.0, true, 0});
        gemv_bench = std::make_unique<moet::Bench>(moet::Bench{*gemv_backend, copy_gbs});
      }
      return moet::bench_gemm(bench, *gemv_bench, n, k, name, fp8);
    });
  };
  gemm(8192, 4096, "q_proj");
  gemm(4096, 8192, "o_proj");
  gemm(512, 4096, "k_proj");
  const auto gemv_fp8 = [&](int64_t n, int64_t k, const char* name) {
    run(std::string("fp8 ") + name, [&] { return moet::bench_gemv(bench, n, k, name, {}, true); });
  };
  gemv_fp8(1536, 7168, "q_a_proj");
  gemv_fp8(24576, 1536, "q_b_proj");
  gemv_fp8(576, 7168, "kv_a_proj");
  gemv_fp8(7168, 16384, "o_proj");
  gemv_fp8(4096, 7168, "shared gate_up");
  gemv_fp8(7168, 2048, "shared down");
  gemm(7168, 16384, "o_proj", true);
  gemm(24576, 1536, "q_b_proj", true);
  for (int64_t context : {48, 128, 4096})
    run("attention " + std::to_string(context), [&] { return moet::bench_attention(bench, context); });
  // Every KV cache dtype at long contexts (labels "kv attention [mla] DTYPE CONTEXT"; the GQA
  // BF16 / FP8 ones run the split-K kernel, also at Qwen3-30B's 32 / 4 heads: "kv attention 32/4 ...").
  for (int64_t context : {4096, 16384})
    for (bool mla : {false, true})
      for (moet::KvDtype dtype : {moet::KvDtype::f32, moet::KvDtype::bf16, moet::KvDtype::fp8_e4m3,
                                  moet::KvDtype::fp8_e5m2, moet::KvDtype::nvfp4}) {
        if (dtype == moet::KvDtype::nvfp4 && !mla) continue;
        const std::string label = fmt::format("kv attention {}{} {}", mla ? "mla " : "", moet::kv_dtype_name(dtype),
                                              context);
        run(label, [&] { return moet::bench_attention(bench, context, dtype, mla); });
        if (mla || dtype == moet::KvDtype::f32) continue;
        run(fmt::format("kv attention 32/4 {} {}", moet::kv_dtype_name(dtype), context),
            [&] { return moet::bench_attention(bench, context, dtype, false, 32); });
      }
  for (int64_t tokens : {2048, 4096})
    for (int64_t q_heads : {32, 64})
      run("prefill attention " + std::to_string(q_heads) + " " + std::to_string(tokens),
          [&] { return moet::bench_prefill_attention(bench, q_heads, tokens, tokens == 2048); });
  run("prefill attention mla 2048", [&] { return moet::bench_prefill_attention(bench, 128, 2048, true, true); });
  run("router softmax", [&] { return moet::bench_router(bench, "softmax 128 top-8", {128, 8, false, true, 1.0f, 1, 1, nullptr}); });
  run("router sigmoid", [&] {
    return moet::bench_router(bench, "sigmoid 256 grouped top-8", {256, 8, true, true, 2.5f, 8, 4, nullptr});
  });
  for (int64_t vocab : {151936, 129280})
    run("top_logits " + std::to_string(vocab), [&] { return moet::bench_top_logits(bench, vocab); });
  run("logit_confidence 151936", [&] { return moet::bench_logit_confidence(bench, 151936); });
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
