// W2 / FP4 expert matmul kernels (scalar and AVX2) against dequantize-then-float64 references.
#include "../cpu_isa_env.h"
#include "formats/requant.h"
#include "core/cpu_isa.h"
#include "kernels/cpu/w2_matmul.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>

namespace moet {
namespace {

struct Case {
  BlockTensor w;
  std::vector<float> dense;  // dequantized W
  std::vector<float> x;
};

Case make_case(StoreFormat format, int64_t rows, int64_t n, int64_t k, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0, 1);
  std::vector<float> source(size_t(n * k));
  for (auto& v : source) v = normal(rng) * std::exp2(float(int(rng() % 8)) - 4);  // varied block scales
  const SourceView view = source_view_f32(source.data(), n, k);
  ThreadPool pool(1);
  Case c;
  c.w = format == StoreFormat::w2 ? quantize_w2(view, ZeroMode::sign, pool) : quantize_fp4(view, pool);
  c.dense = block_tensor_dequant(format, c.w);
  c.x.resize(size_t(rows * k));
  for (auto& v : c.x) v = normal(rng);
  return c;
}

double reference(const Case& c, int64_t t, int64_t col, int64_t k, double* magnitude) {
  double sum = 0;
  *magnitude = 0;
  for (int64_t i = 0; i < k; ++i) {
    const double p = double(c.x[size_t(t * k + i)]) * double(c.dense[size_t(col * k + i)]);
    sum += p;
    *magnitude += std::fabs(p);
  }
  return sum;
}

void check(StoreFormat format) {
  const int64_t rows = 3, n = 37, k = 320;
  const Case c = make_case(format, rows, n, k, format == StoreFormat::w2 ? 1 : 2);
  ThreadPool pool(2);
  std::vector<float> y(size_t(rows * n));
  (format == StoreFormat::w2 ? matmul_w2 : matmul_fp4)(c.x.data(), rows, k, c.w.codes.data(), c.w.scales.data(), n,
                                                        y.data(), pool, test_cpu_isa());
  const int64_t row_bytes = k * store_format_bits(format) / 8;
  for (int64_t t = 0; t < rows; ++t) {
    for (int64_t col = 0; col < n; ++col) {
      double magnitude;
      const double ref = reference(c, t, col, k, &magnitude);
      const double tol = 1e-5 * magnitude + 1e-30;
      EXPECT_NEAR(y[size_t(t * n + col)], ref, tol) << t << "," << col;
      const float* x = c.x.data() + t * k;
      const uint8_t* codes = c.w.codes.data() + col * row_bytes;
      const uint8_t* scales = c.w.scales.data() + col * (k / 32);
      const float s = format == StoreFormat::w2 ? scalar::dot_w2(x, codes, scales, k) : scalar::dot_fp4(x, codes, scales, k);
      EXPECT_NEAR(s, ref, tol);
      if (cpu_supports_avx2()) {
        const float v = format == StoreFormat::w2 ? avx2::dot_w2(x, codes, scales, k) : avx2::dot_fp4(x, codes, scales, k);
        EXPECT_NEAR(v, ref, tol);
      }
    }
  }
}

}  // namespace

TEST(W2Matmul, MatchesDequantizedReference) { check(StoreFormat::w2); }
TEST(Fp4Matmul, MatchesDequantizedReference) { check(StoreFormat::fp4); }

TEST(W2Matmul, ScaleBytesCoverTheFullRange) {
  EXPECT_EQ(ue8m0_to_float(127), 1.0f);
  EXPECT_EQ(ue8m0_to_float(0), std::ldexp(1.0f, -127));
  EXPECT_EQ(ue8m0_to_float(254), std::ldexp(1.0f, 127));
}

}  // namespace moet
