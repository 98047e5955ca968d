// W2 / W2K / FP4 expert matmul kernels (portable, AVX2, AVX-512) against dequantize-then-float64 references.
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

// The kernels of a format: the matmul driver and the single-row dot product.
struct Kernels {
  decltype(&matmul_w2) matmul;
  decltype(&dot_w2) dot;
};

Kernels kernels_of(StoreFormat format) {
  switch (format) {
    case StoreFormat::w2: return {matmul_w2, dot_w2};
    case StoreFormat::w2k: return {matmul_w2k, dot_w2k};
    case StoreFormat::fp4: break;
  }
  return {matmul_fp4, dot_fp4};
}

// Each format's kernels on each level (skipped where the CPU lacks it), over K multiples of 32
// but not all of 64, 128 or 256, an odd N (the AVX-512 W2 kernel's lone last column) and more rows
// than one pass of the shared-decoding products (kernels/cpu/w2_rows.h).
class BlockMatmul : public testing::TestWithParam<std::tuple<StoreFormat, CpuIsa>> {};

TEST_P(BlockMatmul, MatchesDequantizedReference) {
  const auto [format, isa] = GetParam();
  if (!cpu_supports(isa)) GTEST_SKIP() << cpu_isa_missing(isa);
  const Kernels kernels = kernels_of(format);
  ThreadPool pool(2);
  for (const int64_t k : {int64_t(32), int64_t(96), int64_t(192), int64_t(320), int64_t(2080)}) {
    const int64_t rows = 5, n = 37;
    const Case c = make_case(format, rows, n, k, uint32_t(1 + int(format) + k));
    std::vector<float> y(size_t(rows * n));
    kernels.matmul(c.x.data(), rows, k, c.w.codes.data(), c.w.scales.data(), n, y.data(), pool, isa);
    const int64_t row_bytes = k * store_format_bits(format) / 8;
    for (int64_t t = 0; t < rows; ++t) {
      for (int64_t col = 0; col < n; ++col) {
        double magnitude;
        const double ref = reference(c, t, col, k, &magnitude);
        const double tol = 1e-5 * magnitude + 1e-30;
        EXPECT_NEAR(y[size_t(t * n + col)], ref, tol) << "k " << k << " row " << t << " column " << col;
        const float* x = c.x.data() + t * k;
        const uint8_t* codes = c.w.codes.data() + col * row_bytes;
        const uint8_t* scales = c.w.scales.data() + col * (k / 32);
        EXPECT_NEAR(kernels.dot(x, codes, scales, k, isa), ref, tol) << "k " << k;
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(FormatsAndLevels, BlockMatmul,
                         testing::Combine(testing::Values(StoreFormat::w2, StoreFormat::fp4, StoreFormat::w2k),
                                          testing::ValuesIn(kCpuIsas)),
                         [](const auto& info) {
                           return std::string(store_format_name(std::get<0>(info.param))) + "_" +
                                  cpu_isa_name(std::get<1>(info.param));
                         });

}  // namespace

TEST(W2kMatmul, ScaleBytesAsTheFormatDefinesThem) {
  for (int b = 0; b < 256; ++b) EXPECT_EQ(w2k_scale_to_float(uint8_t(b)), w2k_scale_value(uint8_t(b))) << b;
}

TEST(W2Matmul, ScaleBytesCoverTheFullRange) {
  EXPECT_EQ(ue8m0_to_float(127), 1.0f);
  EXPECT_EQ(ue8m0_to_float(0), std::ldexp(1.0f, -127));
  EXPECT_EQ(ue8m0_to_float(254), std::ldexp(1.0f, 127));
}

}  // namespace moet
