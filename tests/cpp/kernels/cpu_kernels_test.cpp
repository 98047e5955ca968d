// CPU kernels against float64 references written here: dot products / matmul (AVX2 and scalar),
// RMSNorm, paged attention vs dense causal attention, rope (halves, interleaved, partial), and
// the routers (softmax top-k, sigmoid grouped top-k with correction bias).
#include "../cpu_isa_env.h"
#include "../random_values.h"
#include "core/dtype.h"
#include "kernels/cpu/attention.h"
#include "core/cpu_isa.h"
#include "kernels/cpu/elementwise.h"
#include "kernels/cpu/matmul.h"
#include "kernels/cpu/rope.h"
#include "kernels/cpu/router.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <random>

namespace moet {
namespace {

TEST(Matmul, Bf16AndF32MatchFloat64ForEveryPath) {
  ThreadPool pool(3);
  for (int64_t k : {1, 7, 16, 33, 256}) {
    const int64_t rows = 3, n = 11;
    const auto x = random_floats(size_t(rows * k), uint64_t(k));
    const auto wf = random_floats(size_t(n * k), uint64_t(k) + 100);
    std::vector<uint16_t> wb(wf.size());
    for (size_t i = 0; i < wf.size(); ++i) wb[i] = float_to_bf16(wf[i]);
    const auto bias = random_floats(size_t(n), 5);
    std::vector<float> y_bf16(size_t(rows * n)), y_f32(size_t(rows * n));
    matmul_bf16(x.data(), rows, k, wb.data(), n, bias.data(), y_bf16.data(), pool, test_cpu_isa());
    matmul_f32(x.data(), rows, k, wf.data(), n, nullptr, y_f32.data(), pool, test_cpu_isa());
    for (int64_t t = 0; t < rows; ++t) {
      for (int64_t j = 0; j < n; ++j) {
        double ref_b = bias[size_t(j)], ref_f = 0.0;
        for (int64_t i = 0; i < k; ++i) {
          ref_b += double(x[size_t(t * k + i)]) * double(bf16_to_float(wb[size_t(j * k + i)]));
          ref_f += double(x[size_t(t * k + i)]) * double(wf[size_t(j * k + i)]);
        }
        const double tol = 1e-5 * std::sqrt(double(k)) * 4;
        EXPECT_NEAR(y_bf16[size_t(t * n + j)], ref_b, tol) << k;
        EXPECT_NEAR(y_f32[size_t(t * n + j)], ref_f, tol) << k;
        // The AVX2 dot products agree with float64 too (the matmuls above may run the portable
        // path when MOET_CPU_SCALAR=1 or the CPU lacks AVX2).
        if (cpu_supports_avx2()) {
          EXPECT_NEAR(avx2::dot_f32(&x[size_t(t * k)], &wf[size_t(j * k)], k), ref_f, tol);
          EXPECT_NEAR(avx2::dot_bf16(&x[size_t(t * k)], &wb[size_t(j * k)], k), ref_b - bias[size_t(j)], tol);
        }
      }
    }
  }
}

TEST(Matmul, ResultDoesNotDependOnThreadCount) {
  const int64_t rows = 5, k = 96, n = 37;
  const auto x = random_floats(size_t(rows * k), 1);
  const auto w = random_floats(size_t(n * k), 2);
  std::vector<float> one(size_t(rows * n)), many(size_t(rows * n));
  ThreadPool p1(1), p4(4);
  matmul_f32(x.data(), rows, k, w.data(), n, nullptr, one.data(), p1, test_cpu_isa());
  matmul_f32(x.data(), rows, k, w.data(), n, nullptr, many.data(), p4, test_cpu_isa());
  EXPECT_EQ(std::memcmp(one.data(), many.data(), one.size() * sizeof(float)), 0);
}

TEST(Matmul, RowResultsDoNotDependOnBatchSize) {
  ThreadPool pool(2);
  for (int64_t k : {40, 64, 200}) {
    const int64_t rows = 7, n = 9;
    const auto x = random_floats(size_t(rows * k), 11);
    const auto wf = random_floats(size_t(n * k), 12);
    std::vector<uint16_t> w(wf.size());
    for (size_t i = 0; i < wf.size(); ++i) w[i] = float_to_bf16(wf[i]);
    std::vector<float> batched(static_cast<size_t>(rows * n)), single(static_cast<size_t>(n));
    matmul_bf16(x.data(), rows, k, w.data(), n, nullptr, batched.data(), pool, test_cpu_isa());
    for (int64_t t = 0; t < rows; ++t) {
      matmul_bf16(x.data() + t * k, 1, k, w.data(), n, nullptr, single.data(), pool, test_cpu_isa());
      EXPECT_EQ(std::memcmp(single.data(), batched.data() + t * n, sizeof(float) * size_t(n)), 0) << k << " " << t;
    }
  }
}

TEST(RmsNorm, MatchesFloat64) {
  ThreadPool pool(2);
  const int64_t rows = 4, dim = 48;
  const auto x = random_floats(size_t(rows * dim), 3);
  const auto w = random_floats(size_t(dim), 4);
  std::vector<float> out(x.size());
  rmsnorm(x.data(), rows, dim, dim, w.data(), 1e-5f, out.data(), dim, pool);
  for (int64_t t = 0; t < rows; ++t) {
    double ss = 0;
    for (int64_t i = 0; i < dim; ++i) ss += double(x[size_t(t * dim + i)]) * x[size_t(t * dim + i)];
    const double inv = 1.0 / std::sqrt(ss / double(dim) + 1e-5);
    for (int64_t i = 0; i < dim; ++i)
      EXPECT_NEAR(out[size_t(t * dim + i)], double(x[size_t(t * dim + i)]) * inv * w[size_t(i)], 1e-5);
  }
}

TEST(Rope, HalvesInterleavedAndPartial) {
  RopeTable table;
  table.inv_freq = {1.0f, 0.1f};
  table.scale = 0.5f;
  const int32_t pos = 3;
  // halves on dims [0, 4) of a 6-wide head: (x0, x2) and (x1, x3) rotate; x4, x5 untouched.
  std::vector<float> x = {1, 2, 3, 4, 5, 6};
  rope_apply(table, x.data(), 1, 1, 6, 6, 0, &pos);
  const double c0 = std::cos(3.0) * 0.5, s0 = std::sin(3.0) * 0.5, c1 = std::cos(0.3) * 0.5, s1 = std::sin(0.3) * 0.5;
  EXPECT_NEAR(x[0], 1 * c0 - 3 * s0, 1e-6);
  EXPECT_NEAR(x[2], 3 * c0 + 1 * s0, 1e-6);
  EXPECT_NEAR(x[1], 2 * c1 - 4 * s1, 1e-6);
  EXPECT_NEAR(x[3], 4 * c1 + 2 * s1, 1e-6);
  EXPECT_EQ(x[4], 5);
  EXPECT_EQ(x[5], 6);
  // interleaved at offset 2: pairs (x2, x3), (x4, x5), output de-interleaved.
  table.interleaved = true;
  std::vector<float> y = {9, 9, 1, 2, 3, 4};
  rope_apply(table, y.data(), 1, 1, 6, 6, 2, &pos);
  EXPECT_EQ(y[0], 9);
  EXPECT_NEAR(y[2], 1 * c0 - 2 * s0, 1e-6);
  EXPECT_NEAR(y[3], 3 * c1 - 4 * s1, 1e-6);
  EXPECT_NEAR(y[4], 2 * c0 + 1 * s0, 1e-6);
  EXPECT_NEAR(y[5], 4 * c1 + 3 * s1, 1e-6);
}

TEST(Attention, PagedMatchesDenseCausalReference) {
  ThreadPool pool(2);
  const int64_t block = 3, kv_heads = 2, q_heads = 4, dim = 8, tokens = 10;
  // Physical blocks deliberately out of order.
  const std::vector<int32_t> table = {3, 0, 2, 1};
  std::vector<float> k_cache(size_t(4 * block * kv_heads * dim)), v_cache(k_cache.size());
  const PagedKv cache = paged_kv_view({KvDtype::f32, kv_heads, dim, dim, false},
                                      reinterpret_cast<uint8_t*>(k_cache.data()),
                                      reinterpret_cast<uint8_t*>(v_cache.data()), block);
  const auto k = random_floats(size_t(tokens * kv_heads * dim), 7);
  const auto v = random_floats(size_t(tokens * kv_heads * dim), 8);
  const auto q = random_floats(size_t(tokens * q_heads * dim), 9);
  std::vector<int64_t> slots;
  std::vector<int32_t> positions, seq(size_t(tokens), 0);
  for (int64_t t = 0; t < tokens; ++t) {
    slots.push_back(int64_t(table[size_t(t / block)]) * block + t % block);
    positions.push_back(int32_t(t));
  }
  kv_cache_write(cache, k.data(), v.data(), tokens, slots.data());
  const int32_t* tables[] = {table.data()};
  std::vector<float> out(size_t(tokens * q_heads * dim));
  attention_paged(cache, {positions.data(), seq.data(), tables}, q.data(), tokens, q_heads, dim, 0.35f, out.data(), pool,
                  test_cpu_isa());
  for (int64_t t = 0; t < tokens; ++t) {
    for (int64_t h = 0; h < q_heads; ++h) {
      const int64_t g = h / (q_heads / kv_heads);
      std::vector<double> p(size_t(t + 1));
      double mx = -1e300, sum = 0;
      for (int64_t j = 0; j <= t; ++j) {
        double s = 0;
        for (int64_t d = 0; d < dim; ++d) s += double(q[size_t((t * q_heads + h) * dim + d)]) * k[size_t((j * kv_heads + g) * dim + d)];
        p[size_t(j)] = s * 0.35;
        mx = std::max(mx, p[size_t(j)]);
      }
      for (auto& s : p) sum += (s = std::exp(s - mx));
      for (int64_t d = 0; d < dim; ++d) {
        double o = 0;
        for (int64_t j = 0; j <= t; ++j) o += p[size_t(j)] / sum * v[size_t((j * kv_heads + g) * dim + d)];
        EXPECT_NEAR(out[size_t((t * q_heads + h) * dim + d)], o, 1e-5);
      }
    }
  }
}

TEST(Router, SoftmaxTopKRenormalised) {
  const std::vector<float> logits = {0.1f, 2.0f, -1.0f, 1.5f};
  int32_t ids[2];
  float w[2];
  router_topk({4, 2, false, true}, logits.data(), 1, ids, w);
  EXPECT_EQ(ids[0], 1);
  EXPECT_EQ(ids[1], 3);
  const double e1 = std::exp(2.0), e3 = std::exp(1.5);
  EXPECT_NEAR(w[0], e1 / (e1 + e3), 1e-6);
  EXPECT_NEAR(w[1], e3 / (e1 + e3), 1e-6);
  router_topk({4, 2, false, false}, logits.data(), 1, ids, w);
  double total = 0;
  for (float l : logits) total += std::exp(double(l));
  EXPECT_NEAR(w[0], e1 / total, 1e-6);
}

TEST(Router, SigmoidGroupedWithCorrectionBias) {
  // 8 experts in 4 groups of 2; keep 2 groups; top-2. The bias steers the choice but the
  // weights are the unbiased sigmoid scores, renormalised, times the scaling factor.
  const std::vector<float> logits = {3.0f, -3.0f, 0.0f, 0.1f, 2.5f, 2.4f, -2.0f, 1.0f};
  const std::vector<float> bias = {0, 0, 0, 0, 0, 0, 0, 2.0f};
  int32_t ids[2];
  float w[2];
  router_topk({8, 2, true, true, 2.5f, 4, 2, bias.data()}, logits.data(), 1, ids, w);
  auto sig = [](double v) { return 1.0 / (1.0 + std::exp(-v)); };
  // group sums of top-2 choice scores: g0 = s(3)+s(-3) = 1, g1 ~ 1.02, g2 ~ 1.9, g3 = s(-2)+s(1)+2 ~ 2.85
  // -> groups 3 and 2 kept; best choices: expert 7 (s(1)+2), then expert 4.
  EXPECT_EQ(ids[0], 7);
  EXPECT_EQ(ids[1], 4);
  const double a = sig(1.0), b = sig(2.5);
  EXPECT_NEAR(w[0], a / (a + b) * 2.5, 1e-6);
  EXPECT_NEAR(w[1], b / (a + b) * 2.5, 1e-6);
}

}  // namespace
}  // namespace moet
