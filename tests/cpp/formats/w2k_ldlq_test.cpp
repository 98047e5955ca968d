// W2K's BlockLDLQ quantizer (formats/w2k_ldlq.h): the decomposition reproduces the damped H;
// with a diagonal H (identity included) nothing feeds back, so the bytes are those of choosing
// each block's nearest codewords (weighted by diag D) and each group's scale among the 13
// candidates by that error, computed here independently; with a correlated H it lowers the
// output error tr((W-Q) H (W-Q)^T) well below the reference quantizer's; the bytes are the same
// for any thread count and any number of rows per call; zero rows, +-Inf and a singular H follow
// the documented rules.
#include "core/error.h"
#include "formats/requant.h"
#include "formats/w2k_ldlq.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>

namespace moet {
namespace {

// H = X^T X / n of n random inputs whose columns are mixed (correlated) and scaled unequally.
std::vector<float> correlated_moments(int64_t K, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<double> normal(0, 1);
  const int64_t n = 4 * K;
  std::vector<double> z(size_t(n * K)), x(size_t(n * K), 0.0);
  for (double& v : z) v = normal(rng);
  for (int64_t r = 0; r < n; ++r)
    for (int64_t k = 0; k < K; ++k) {
      double s = z[size_t(r * K + k)];
      for (int64_t j = std::max<int64_t>(0, k - 6); j < k; ++j) s += 0.6 * z[size_t(r * K + j)];  // neighbours
      x[size_t(r * K + k)] = s * (1 + 3.0 * double(k % 7 == 0));
    }
  std::vector<float> H(size_t(K * K));
  for (int64_t i = 0; i < K; ++i)
    for (int64_t j = 0; j < K; ++j) {
      double s = 0;
      for (int64_t r = 0; r < n; ++r) s += x[size_t(r * K + i)] * x[size_t(r * K + j)];
      H[size_t(i * K + j)] = float(s / double(n));
    }
  return H;
}

std::vector<float> random_weights(int64_t rows, int64_t cols, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0, 0.02f);
  std::vector<float> w(size_t(rows * cols));
  for (float& v : w) v = normal(rng);
  return w;
}

// tr((W - Q) H (W - Q)^T) / tr(W H W^T), H undamped.
double proxy_error(const std::vector<float>& W, const std::vector<float>& Q, const std::vector<float>& H, int64_t K) {
  double num = 0, den = 0;
  for (size_t r = 0; r < W.size() / size_t(K); ++r)
    for (int64_t i = 0; i < K; ++i)
      for (int64_t j = 0; j < K; ++j) {
        const double h = H[size_t(i * K + j)];
        const double ei = double(W[r * K + i]) - Q[r * K + i], ej = double(W[r * K + j]) - Q[r * K + j];
        num += ei * h * ej;
        den += double(W[r * K + i]) * h * W[r * K + j];
      }
  return num / den;
}

// The rule without feedback: per 32 columns, each of the 13 candidate scales (amax / 2.75 x
// linspace(0.25, 1.45, 13), the largest normal UE5M3 value strictly below) with each block's
// nearest codewords under `weight`, the least weighted squared error (the first on a tie).
void independent_blocks(const double* v, const double* weight, int64_t K, uint8_t* codes, uint8_t* scales) {
  for (int64_t c = 0; c < K; c += 32) {
    double amax = 0;
    for (int j = 0; j < 32; ++j) amax = std::max(amax, std::fabs(v[c + j]));
    double best = std::numeric_limits<double>::infinity();
    for (int i = 0; i < 13; ++i) {
      const double f = i == 12 ? 1.45 : double(i) * ((1.45 - 0.25) / 12) + 0.25;
      const double target = amax / 2.75 * f;
      uint8_t byte = 8;
      while (byte < 255 && double(w2k_scale_value(uint8_t(byte + 1))) < target) ++byte;
      const double s = w2k_scale_value(byte);
      double error = 0;
      uint8_t words[8];
      for (int q = 0; q < 4; ++q) {
        double y[8];
        for (int m = 0; m < 8; ++m) y[m] = v[c + 8 * q + m] / s;
        double cost;
        const uint16_t code = w2k_nearest(y, weight + c + 8 * q, &cost);
        words[2 * q] = uint8_t(code), words[2 * q + 1] = uint8_t(code >> 8);
        int8_t levels[8];
        w2k_decode(code, levels);
        for (int m = 0; m < 8; ++m) {
          const double d = v[c + 8 * q + m] - levels[m] * s / 4;
          error += weight[c + 8 * q + m] * d * d;
        }
      }
      if (error < best) {
        best = error;
        scales[c / 32] = byte;
        std::memcpy(codes + c / 4, words, 8);
      }
    }
  }
}

}  // namespace

TEST(W2kLdlq, DecompositionReproducesTheDampedMatrix) {
  const int64_t K = 64;
  const std::vector<float> H = correlated_moments(K, 1);
  ThreadPool pool(2);
  const W2kLdlqFactor f = w2k_ldlq_factor(H.data(), K, pool);
  double trace = 0;
  for (int64_t k = 0; k < K; ++k) trace += H[size_t(k * K + k)];
  // U D U^T with U unit upper block-triangular (entries of earlier blocks only), D_j = R_j R_j^T
  const auto u = [&](int64_t r, int64_t c) { return r / 8 == c / 8 ? double(r == c) : r < c ? f.U[size_t(r * K + c)] : 0.0; };
  const auto d = [&](int64_t i, int64_t j) {
    if (i / 8 != j / 8) return 0.0;
    const double* R = f.R.data() + (i / 8) * 64;
    double s = 0;
    for (int l = 0; l < 8; ++l) s += R[(i % 8) * 8 + l] * R[(j % 8) * 8 + l];
    return s;
  };
  double worst = 0;
  for (int64_t i = 0; i < K; ++i) {
    EXPECT_NEAR(f.weight[size_t(i)], d(i, i), 1e-12 * d(i, i));
    for (int64_t j = 0; j < K; ++j) {
      double s = 0;
      for (int64_t a = 0; a < K; ++a)
        for (int64_t b = 0; b < K; ++b) s += u(i, a) * d(a, b) * u(j, b);
      const double want = double(H[size_t(i * K + j)]) + (i == j ? 0.01 * trace / double(K) : 0.0);
      worst = std::max(worst, std::fabs(s - want));
    }
  }
  EXPECT_LT(worst, 1e-10 * trace / double(K));
}

TEST(W2kLdlq, DiagonalMomentsRoundEachBlockAlone) {
  const int64_t K = 96, rows = 12;
  std::mt19937_64 rng(2);
  std::uniform_real_distribution<double> spread(0.1, 5);
  for (const bool identity : {true, false}) {
    std::vector<float> H(size_t(K * K), 0.0f);
    for (int64_t k = 0; k < K; ++k) H[size_t(k * K + k)] = identity ? 1.0f : float(spread(rng));
    ThreadPool pool(1);
    const W2kLdlqFactor f = w2k_ldlq_factor(H.data(), K, pool);
    for (int64_t r = 0; r < K; ++r)
      for (int64_t c = (r / 8 + 1) * 8; c < K; ++c) ASSERT_EQ(f.U[size_t(r * K + c)], 0.0) << "no feedback";
    const std::vector<float> W = random_weights(rows, K, 3);
    for (int64_t r = 0; r < rows; ++r) {
      const std::vector<double> v(W.begin() + r * K, W.begin() + (r + 1) * K);
      uint8_t codes[K / 4], scales[K / 32], want_codes[K / 4], want_scales[K / 32];
      w2k_ldlq_quantize_rows(v.data(), 1, f, codes, scales);
      independent_blocks(v.data(), f.weight.data(), K, want_codes, want_scales);
      EXPECT_EQ(0, std::memcmp(codes, want_codes, sizeof codes)) << "identity " << identity << " row " << r;
      EXPECT_EQ(0, std::memcmp(scales, want_scales, sizeof scales)) << "identity " << identity << " row " << r;
    }
  }
}

TEST(W2kLdlq, CorrelatedMomentsLowerTheOutputError) {
  const int64_t K = 128, rows = 48;
  const std::vector<float> H = correlated_moments(K, 4), W = random_weights(rows, K, 5);
  std::vector<float> diagonal(static_cast<size_t>(K));
  for (int64_t k = 0; k < K; ++k) diagonal[size_t(k)] = H[size_t(k * K + k)];
  ThreadPool pool(2);
  const W2kLdlqFactor f = w2k_ldlq_factor(H.data(), K, pool);
  const SourceView src = source_view_f32(W.data(), rows, K, "w");
  QuantizeOptions reference;
  reference.importance = diagonal.data();  // the reference's best: weighted by the same inputs' diagonal
  QuantizeOptions ldlq;
  ldlq.ldlq = &f;
  const double e_reference = proxy_error(W, block_tensor_dequant(StoreFormat::w2k, quantize(StoreFormat::w2k, src, reference, pool)), H, K);
  const double e_ldlq = proxy_error(W, block_tensor_dequant(StoreFormat::w2k, quantize(StoreFormat::w2k, src, ldlq, pool)), H, K);
  EXPECT_LT(e_ldlq, 0.8 * e_reference) << e_ldlq << " vs " << e_reference;
}

TEST(W2kLdlq, SameBytesForAnyThreadCountOrRowsPerCall) {
  const int64_t K = 128, rows = 37;
  const std::vector<float> H = correlated_moments(K, 6), W = random_weights(rows, K, 7);
  ThreadPool one(1), three(3);
  const W2kLdlqFactor a = w2k_ldlq_factor(H.data(), K, one), b = w2k_ldlq_factor(H.data(), K, three);
  EXPECT_EQ(0, std::memcmp(a.U.data(), b.U.data(), a.U.size() * sizeof(double)));
  EXPECT_EQ(0, std::memcmp(a.R.data(), b.R.data(), a.R.size() * sizeof(double)));
  const SourceView src = source_view_f32(W.data(), rows, K, "w");
  QuantizeOptions options;
  options.ldlq = &a;
  const BlockTensor x = quantize(StoreFormat::w2k, src, options, one), y = quantize(StoreFormat::w2k, src, options, three);
  EXPECT_EQ(x.codes, y.codes);
  EXPECT_EQ(x.scales, y.scales);
  const std::vector<double> v(W.begin(), W.end());
  std::vector<uint8_t> codes(x.codes.size()), scales(x.scales.size());
  w2k_ldlq_quantize_rows(v.data(), rows, a, codes.data(), scales.data());  // every row in one call
  EXPECT_EQ(codes, x.codes);
  EXPECT_EQ(scales, x.scales);
  for (int64_t r = 0; r < rows; ++r)  // one row per call
    w2k_ldlq_quantize_rows(v.data() + r * K, 1, a, codes.data() + r * (K / 4), scales.data() + r * (K / 32));
  EXPECT_EQ(codes, x.codes);
  EXPECT_EQ(scales, x.scales);
}

TEST(W2kLdlq, EdgeRules) {
  const int64_t K = 64;
  const std::vector<float> H = correlated_moments(K, 8);
  ThreadPool pool(1);
  const W2kLdlqFactor f = w2k_ldlq_factor(H.data(), K, pool);
  std::vector<double> v(static_cast<size_t>(K), 0.0);
  uint8_t codes[K / 4], scales[K / 32];
  w2k_ldlq_quantize_rows(v.data(), 1, f, codes, scales);  // zero row: scale 0, every weight zero
  for (uint8_t b : codes) EXPECT_EQ(b, 0);
  for (uint8_t b : scales) EXPECT_EQ(b, 0);
  v[3] = std::numeric_limits<double>::infinity(), v[5] = 0.5, v[40] = -std::numeric_limits<double>::infinity();
  w2k_ldlq_quantize_rows(v.data(), 1, f, codes, scales);  // +-Inf saturates to the block's largest finite value
  float out[K];
  w2k_dequant_row(codes, scales, K, out);
  for (float x : out) EXPECT_TRUE(std::isfinite(x));
  EXPECT_GT(out[3], 0.25f);
  EXPECT_LT(out[40], -100.0f);  // a block of -Inf only: 2.75 x 240 at the largest scale
  const std::vector<float> zero(size_t(K * K), 0.0f);
  EXPECT_THROW(w2k_ldlq_factor(zero.data(), K, pool), Error);
  EXPECT_THROW(w2k_ldlq_factor(H.data(), 40, pool), Error);
}

}  // namespace moet
