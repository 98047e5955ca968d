// Helpers shared by the CUDA suites: the skip when no GPU is visible, a CPU/CUDA backend pair,
// random data put into both, and the comparison of results.
#pragma once

#include "../cpu_isa_env.h"
#include "../random_values.h"
#include "backend/bench_ops.h"
#include "backend/cpu/cpu_backend.h"
#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/device_info.h"

#include <gtest/gtest.h>

#include <cmath>
#include <algorithm>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <vector>

namespace moet::test {

#define MOET_SKIP_WITHOUT_GPU()                                                          \
  if (::moet::cuda_devices().empty()) GTEST_SKIP() << "no CUDA GPU visible: CUDA test skipped"

inline std::vector<uint16_t> to_bf16(const std::vector<float>& values) {
  std::vector<uint16_t> out(values.size());
  for (size_t i = 0; i < values.size(); ++i) out[i] = float_to_bf16(values[i]);
  return out;
}

struct BackendPair {
  std::unique_ptr<Backend> cpu = cpu_backend_create({2, test_cpu_isa()});
  std::unique_ptr<Backend> gpu = cuda_backend_create({});

  // The same FP32 activation in both backends.
  std::pair<Tensor, Tensor> activation(const std::vector<float>& values, std::vector<int64_t> shape) {
    Tensor a = cpu->alloc(shape), b = gpu->alloc(shape);
    cpu->from_host(values.data(), a);
    gpu->from_host(values.data(), b);
    return {a, b};
  }
  // The same weight (BF16 or F32 as stored in `bytes`) uploaded to both.
  std::pair<Tensor, Tensor> weight(const void* bytes, DType dtype, std::vector<int64_t> shape) {
    HostTensor info{"test", dtype, shape, static_cast<const uint8_t*>(bytes), 0, "test"};
    info.bytes = size_t(info.numel()) * dtype_size(dtype);
    return {cpu->upload(info), gpu->upload(info)};
  }
  // The same FP8-block weight (e4m3 codes [n, k], F32 scales [ceil(n/128), ceil(k/128)]) in both.
  std::pair<Tensor, Tensor> fp8_weight(const std::vector<uint8_t>& codes, const std::vector<float>& scales, int64_t n,
                                       int64_t k) {
    auto c = weight(codes.data(), DType::u8, {n, k});
    auto s = weight(scales.data(), DType::f32, fp8_block_scale_shape(n, k));
    return {fp8_block_weight(c.first, s.first, "test"), fp8_block_weight(c.second, s.second, "test")};
  }
  std::pair<Tensor, Tensor> alloc(std::vector<int64_t> shape, DType dtype = DType::f32) {
    return {cpu->alloc(shape, dtype), gpu->alloc(shape, dtype)};
  }
  // The inputs of one MoE call in both backends: routing of `rows` rows to `top_k` distinct experts
  // each, expert 0 in every row (so one expert gets many rows) and the rest a seeded shuffle;
  // random routing weights and activations.
  struct MoeInputs {
    std::pair<Tensor, Tensor> ids, weights, x;
  };
  MoeInputs moe_inputs(int64_t rows, int64_t experts, int64_t top_k, int64_t hidden, uint64_t seed) {
    std::mt19937_64 rng(seed);
    std::vector<int32_t> ids;
    for (int64_t t = 0; t < rows; ++t) {
      std::vector<int32_t> all(static_cast<size_t>(experts));
      std::iota(all.begin(), all.end(), 0);
      std::shuffle(all.begin() + 1, all.end(), rng);
      ids.insert(ids.end(), all.begin(), all.begin() + top_k);
    }
    MoeInputs in{alloc({rows, top_k}, DType::i32), activation(random_floats(size_t(rows * top_k), 300), {rows, top_k}),
                 activation(random_floats(size_t(rows * hidden), 301), {rows, hidden})};
    cpu->from_host(ids.data(), in.ids.first);
    gpu->from_host(ids.data(), in.ids.second);
    return in;
  }
  void begin_step(const StepInputs& step) {
    cpu->begin_step(step);
    gpu->begin_step(step);
  }
};

enum class WeightType { bf16, f32, fp8 };

// A random weight [n, k] in both backends: random_floats of `scale` as BF16 or F32, or FP8-block
// codes (|value| < 2) with block scales in [scale / 2, scale).
inline std::pair<Tensor, Tensor> random_weight(BackendPair& p, WeightType type, int64_t n, int64_t k, uint64_t seed,
                                                float scale = 0.02f) {
  if (type == WeightType::fp8) {
    const std::vector<int64_t> scales = fp8_block_scale_shape(n, k);
    return p.fp8_weight(random_fp8_codes(size_t(n * k), seed),
                        random_fp8_scales(size_t(scales[0] * scales[1]), seed + 1, scale / 2), n, k);
  }
  const auto wf = random_floats(size_t(n * k), seed, scale);
  return type == WeightType::bf16 ? p.weight(to_bf16(wf).data(), DType::bf16, {n, k})
                                  : p.weight(wf.data(), DType::f32, {n, k});
}

template <typename T = float>
std::vector<T> host(Backend& backend, const Tensor& t) {
  std::vector<T> out(size_t(t.numel()));
  backend.to_host(t, out.data());
  return out;
}

// Largest |cpu - gpu| over the tensor pair, relative to max(1, max |cpu|).
inline double max_rel_diff(BackendPair& p, const std::pair<Tensor, Tensor>& t) {
  const auto a = host(*p.cpu, t.first), b = host(*p.gpu, t.second);
  double diff = 0.0, scale = 1.0;
  for (size_t i = 0; i < a.size(); ++i) {
    if (!std::isfinite(b[i])) return INFINITY;
    diff = std::max(diff, std::fabs(double(a[i]) - double(b[i])));
    scale = std::max(scale, std::fabs(double(a[i])));
  }
  return diff / scale;
}

// The profile names of the attention ops the backend ran since the last take_profile() (the
// CUDA backend names the kernels: "attention", "prefill_attention", "prefill_attention+attention");
// profiling must be on (set_profiling) from the step's begin_step().
inline std::vector<std::string> attention_ops(Backend& backend) {
  std::vector<std::string> names;
  for (const OpProfile& op : bench_ops(backend).take_profile())
    if (op.op.find("attention") != std::string::npos) names.push_back(op.op);
  return names;
}

}  // namespace moet::test
