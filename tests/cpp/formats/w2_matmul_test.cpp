// W2 / W2K / FP4 expert matmul kernels (scalar and AVX2) against dequantize-then-float64 references.
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
  c.w = quantize(format, view, {ZeroMode::sign, W2Quantizer::reference, nullptr}, pool);
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

// The kernels of a format: the matmul driver and the scalar / AVX2 dot products.
struct Kernels {
  decltype(&matmul_w2) matmul;
  decltype(&scalar::dot_w2) scalar_dot, avx2_dot;
};

Kernels kernels_of(StoreFormat format) {
  switch (format) {
    case StoreFormat::w2: return {matmul_w2, scalar::dot_w2, avx2::dot_w2};
    case StoreFormat::w2k: return {matmul_w2k, scalar::dot_w2k, avx2::dot_w2k};
    case StoreFormat::fp4: break;
  }
  return {matmul_fp4, scalar::dot_fp4, avx2::dot_fp4};
}

void check(StoreFormat format) {
  const int64_t rows = 3, n = 37, k = 320;
  const Case c = make_case(format, rows, n, k, 1 + int(format));
  const Kernels kernels = kernels_of(format);
  ThreadPool pool(2);
  std::vector<float> y(size_t(rows * n));
  kernels.matmul(c.x.data(), rows, k, c.w.codes.data(), c.w.scales.data(), n, y.data(), pool, test_cpu_isa());
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
      EXPECT_NEAR(kernels.scalar_dot(x, codes, scales, k), ref, tol);
      if (cpu_supports_avx2()) EXPECT_NEAR(kernels.avx2_dot(x, codes, scales, k), ref, tol);
    }
  }
}

}  // namespace

TEST(W2Matmul, MatchesDequantizedReference) { check(StoreFormat::w2); }
TEST(Fp4Matmul, MatchesDequantizedReference) { check(StoreFormat::fp4); }
TEST(W2kMatmul, MatchesDequantizedReference) { check(StoreFormat::w2k); }

TEST(W2kMatmul, ScaleBytesAsTheFormatDefinesThem) {
  for (int b = 0; b < 256; ++b) EXPECT_EQ(w2k_scale_to_float(uint8_t(b)), w2k_scale_value(uint8_t(b))) << b;
}

TEST(W2Matmul, ScaleBytesCoverTheFullRange) {
  EXPECT_EQ(ue8m0_to_float(127), 1.0f);
  EXPECT_EQ(ue8m0_to_float(0), std::ldexp(1.0f, -127));
  EXPECT_EQ(ue8m0_to_float(254), std::ldexp(1.0f, 127));
}

}  // namespace moet
