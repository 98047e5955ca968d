// Requantization: same bytes for any thread count, the pipeline's block rules (exponent,
// saturation, zero signs, zero modes), verbatim MXFP4 scales, errors on NaN, and the study math.
#include "core/error.h"
#include "formats/checkpoint_formats.h"
#include "formats/minifloat.h"
#include "formats/requant.h"
#include "formats/sign_study.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>

namespace moet {
namespace {

std::vector<double> random_values(int64_t n, uint32_t seed, double zero_fraction = 0.1) {
  std::mt19937 rng(seed);
  std::normal_distribution<double> normal(0, 0.02);
  std::uniform_real_distribution<double> u(0, 1);
  std::vector<double> v(static_cast<size_t>(n));
  for (auto& x : v) x = u(rng) < zero_fraction ? 0.0 : double(float(normal(rng)));
  return v;
}

SourceView f64_as_f32_view(const std::vector<double>& v, std::vector<float>* storage, int64_t rows, int64_t cols) {
  storage->assign(v.begin(), v.end());
  return source_view_f32(storage->data(), rows, cols, "test");
}

}  // namespace

TEST(Requant, SameBytesForAnyThreadCount) {
  const int64_t rows = 67, cols = 256;
  const auto v = random_values(rows * cols, 1);
  const Fp8BlockTensor fp8 = fp8_block_quantize(v.data(), rows, cols, "t");
  const SourceView src = fp8.view("t");
  ThreadPool one(1), two(2), three(3);
  const W2Tensor a = quantize_w2(src, ZeroMode::automatic, one);
  const W2Tensor b = quantize_w2(src, ZeroMode::automatic, two);
  const W2Tensor c = quantize_w2(src, ZeroMode::automatic, three);
  EXPECT_EQ(a.codes, b.codes);
  EXPECT_EQ(a.codes, c.codes);
  EXPECT_EQ(a.scales, c.scales);
  EXPECT_EQ(quantize_fp4(src, one).codes, quantize_fp4(src, three).codes);
}

TEST(Requant, BlockRulesOnHandPickedValues) {
  // One block: amax 6 -> exp 0; values hit the RNE midpoints and the W2 split at 2.5.
  std::vector<double> v(32, 0.0);
  const double picks[] = {6, 2.5, 2.50001, -3, 0.25, -0.1, 0.0, -0.0, 5.0, 5.1};
  std::copy(std::begin(picks), std::end(picks), v.begin());
  std::vector<float> storage;
  ThreadPool pool(1);
  const SourceView src = f64_as_f32_view(v, &storage, 1, 32);
  const Fp4Tensor fp4 = quantize_fp4(src, pool);
  EXPECT_EQ(fp4.scales[0], 127);
  const auto deq = block_tensor_dequant(StoreFormat::fp4, fp4);
  EXPECT_EQ(deq[0], 6.0f);
  EXPECT_EQ(deq[1], 2.0f);
  EXPECT_EQ(deq[2], 3.0f);
  EXPECT_EQ(deq[3], -3.0f);
  EXPECT_EQ(deq[4], 0.0f);
  EXPECT_TRUE(std::signbit(deq[5]));  // -0.1 rounds to -0 and keeps its sign
  EXPECT_EQ(deq[8], 4.0f);
  EXPECT_EQ(deq[9], 6.0f);
  const auto w2 = block_tensor_dequant(StoreFormat::w2, quantize_w2(src, ZeroMode::sign, pool));
  const float expect[] = {4, 1, 4, -4, 1, -1, 1, -1, 4, 4};
  for (int i = 0; i < 10; ++i) EXPECT_EQ(w2[size_t(i)], expect[i]) << i;
}

TEST(Requant, AllZeroBlockUsesMinimumExponent) {
  std::vector<double> v(64, 0.0);
  v[40] = 1.0;
  std::vector<float> storage;
  ThreadPool pool(1);
  const W2Tensor t = quantize_w2(f64_as_f32_view(v, &storage, 1, 64), ZeroMode::sign, pool);
  EXPECT_EQ(t.scales[0], 0);  // 2^-127
  EXPECT_EQ(ue8m0_exponent(t.scales[1]), -3);  // round(log2(1/6)) = -3
}

TEST(Requant, ZeroModes) {
  // All zeros positive (an export that wrote +0 everywhere): auto -> alt.
  std::vector<double> v = random_values(4 * 64, 5, 0.3);
  for (auto& x : v) if (x == 0) x = 0.0;
  std::vector<float> storage;
  ThreadPool pool(2);
  const SourceView src = f64_as_f32_view(v, &storage, 4, 64);
  EXPECT_EQ(zero_mode_resolve(ZeroMode::automatic, source_zero_counts(src, pool)), ZeroMode::alt);
  const auto sign = block_tensor_dequant(StoreFormat::w2, quantize_w2(src, ZeroMode::sign, pool));
  const auto alt = block_tensor_dequant(StoreFormat::w2, quantize_w2(src, ZeroMode::alt, pool));
  const auto automatic = block_tensor_dequant(StoreFormat::w2, quantize_w2(src, ZeroMode::automatic, pool));
  EXPECT_EQ(alt, automatic);
  for (size_t i = 0; i < v.size(); ++i) {
    if (v[i] != 0) {
      EXPECT_EQ(sign[i], alt[i]);
    } else {
      EXPECT_GT(sign[i], 0);
      EXPECT_EQ(alt[i] > 0, (i % 64) % 2 == 0) << i;
    }
  }
  // Balanced zero signs: auto -> sign.
  for (size_t i = 0; i < v.size(); ++i) if (v[i] == 0 && i % 3 == 0) v[i] = -0.0;
  const SourceView balanced = f64_as_f32_view(v, &storage, 4, 64);
  EXPECT_EQ(zero_mode_resolve(ZeroMode::automatic, source_zero_counts(balanced, pool)), ZeroMode::sign);
  EXPECT_THROW(zero_mode_parse("both"), Error);
}

TEST(Requant, Mxfp4SourceKeepsScalesVerbatim) {
  // A block whose largest code is 4: the pipeline would pick a smaller exponent, verbatim keeps it.
  std::vector<uint8_t> codes(16, 0), scales = {130};
  codes[0] = 0x6 | (0xD << 4);  // +4, -3
  codes[1] = 0x1 | (0x8 << 4);  // +0.5, -0
  SourceView src;
  src.format = SourceFormat::mxfp4;
  src.rows = 1;
  src.cols = 32;
  src.data = codes.data();
  src.scales = scales.data();
  ThreadPool pool(1);
  const Fp4Tensor fp4 = quantize_fp4(src, pool);
  EXPECT_EQ(fp4.codes, codes);
  EXPECT_EQ(fp4.scales, scales);
  const auto w2 = block_tensor_dequant(StoreFormat::w2, quantize_w2(src, ZeroMode::sign, pool));
  EXPECT_EQ(w2[0], 32.0f);
  EXPECT_EQ(w2[1], -32.0f);
  EXPECT_EQ(w2[2], 8.0f);
  EXPECT_EQ(w2[3], -8.0f);
}

TEST(Requant, NanIsAnErrorInfSaturates) {
  std::vector<double> v(32, 0.5);
  v[3] = INFINITY;
  std::vector<float> storage;
  ThreadPool pool(1);
  const auto deq = block_tensor_dequant(StoreFormat::fp4, quantize_fp4(f64_as_f32_view(v, &storage, 1, 32), pool));
  EXPECT_EQ(deq[3], 6.0f * std::ldexp(1.0f, mx_block_exponent(0.5)));
  v[5] = NAN;
  const SourceView bad = f64_as_f32_view(v, &storage, 1, 32);
  try {
    quantize_w2(bad, ZeroMode::sign, pool);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("NaN"), std::string::npos);
    EXPECT_NE(std::string(e.what()).find("test"), std::string::npos);
  }
  EXPECT_THROW(fp8_block_quantize(v.data(), 1, 32, "x"), Error);
}

TEST(Requant, SourcesDecodeExactly) {
  const int64_t rows = 130, cols = 160;
  const auto v = random_values(rows * cols, 9);
  const Fp8BlockTensor fp8 = fp8_block_quantize(v.data(), rows, cols, "t");
  const auto fp8_values = source_dequant(fp8.view());
  for (size_t i = 0; i < v.size(); ++i) ASSERT_NEAR(fp8_values[i], v[i], std::fabs(v[i]) / 8 + 1e-9) << i;
  const Nvfp4Tensor nv = nvfp4_quantize(v.data(), rows, cols, "t");
  const auto nv_values = source_dequant(nv.view());
  double err = 0, ref = 0;
  for (size_t i = 0; i < v.size(); ++i) {
    err += (nv_values[i] - v[i]) * (nv_values[i] - v[i]);
    ref += v[i] * v[i];
  }
  EXPECT_LT(std::sqrt(err / ref), 0.15);
}

TEST(SignStudy, AsymCodebookByDynamicProgramming) {
  // Mass only on four distinct values: the optimum puts one level on each.
  E2m1Histogram h{};
  h[8 + 6] = 10;  // -4
  h[2] = 7;       // +1
  h[8 + 1] = 3;   // -0.5
  h[7] = 2;       // +6
  const AsymCodebook book = asym_codebook_fit(h);
  EXPECT_EQ(book.levels[0], -4.0);
  EXPECT_EQ(book.levels[1], -0.5);
  EXPECT_EQ(book.levels[2], 1.0);
  EXPECT_EQ(book.levels[3], 6.0);
  // Gaussian-like tensor: symmetric W2 has (near) zero bias, the study picks {1, 4}.
  const auto v = random_values(64 * 256, 13, 0.0);
  std::vector<float> storage;
  ThreadPool pool(2);
  const TensorStudy st = sign_study(f64_as_f32_view(v, &storage, 64, 256), ZeroMode::automatic, pool);
  EXPECT_LT(std::fabs(st.sym.bias), 0.05);
  EXPECT_EQ(sign_study_sets().size(), 21u);
  EXPECT_LE(st.asym.rel_rms, st.sym.rel_rms + 1e-12);
}

}  // namespace moet
