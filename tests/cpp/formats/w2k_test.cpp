// W2K (formats/w2k.h): the grid follows its rule, every codeword is a distinct point of the
// shifted E8 lattice, the UE5M3 scale byte codec, the nearest-codeword search against brute
// force over all 2^16 codewords, the block rules (zero blocks, +-Inf, importance), same bytes
// for any thread count, and W2-opt (requant.h) never worse than the reference W2 per block.
#include "formats/requant.h"
#include "formats/w2k.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <set>

namespace moet {
namespace {

double codeword_cost(const int8_t* q, const double* y, const double* w) {
  double cost = 0;
  for (int j = 0; j < 8; ++j) cost += w[j] * (y[j] - q[j] / 4.0) * (y[j] - q[j] / 4.0);
  return cost;
}

// Weighted error of a quantized row against v.
double row_error(const std::vector<float>& q, const std::vector<double>& v, const std::vector<float>& imp) {
  double e = 0;
  for (size_t k = 0; k < v.size(); ++k) e += double(imp[k % imp.size()]) * (v[k] - q[k]) * (v[k] - q[k]);
  return e;
}

}  // namespace

TEST(W2k, GridIsTheLeastNormPatternsInOrder) {
  std::vector<std::array<int, 8>> patterns;
  for (int i = 0; i < 65536; ++i) {
    std::array<int, 8> h;
    for (int j = 0; j < 8; ++j) h[size_t(j)] = (i >> (2 * (7 - j))) & 3;  // lexicographic in (h_0, ..., h_7)
    patterns.push_back(h);
  }
  const auto norm = [](const std::array<int, 8>& h) {
    int n = 0;
    for (int x : h) n += (2 * x + 1) * (2 * x + 1);
    return n;
  };
  std::stable_sort(patterns.begin(), patterns.end(), [&](const auto& a, const auto& b) { return norm(a) < norm(b); });
  for (int a = 0; a < 256; ++a) {
    uint16_t bits = 0;
    for (int j = 0; j < 8; ++j) bits |= uint16_t(patterns[size_t(a)][size_t(j)] << (2 * j));
    EXPECT_EQ(kW2kGrid[a], bits) << a;
  }
  EXPECT_EQ(norm(patterns[226]), 40);  // norm^2 10 (x 4)
  EXPECT_EQ(norm(patterns[255]), 48);  // norm^2 12
}

TEST(W2k, CodewordsAreDistinctShiftedE8Points) {
  std::set<std::array<int, 8>> seen;
  for (int code = 0; code < 65536; ++code) {
    int8_t q[8];
    w2k_decode(uint16_t(code), q);
    const int shift = code & 0x8000 ? -1 : 1;
    std::array<int, 8> point;
    int sum = 0;
    for (int j = 0; j < 8; ++j) {
      ASSERT_EQ(std::abs(q[j]) % 2, 1);
      const int twice = (q[j] - shift) / 2;  // 2 c_j, c_j = (q_j - shift) / 4 a half-integer
      ASSERT_EQ(std::abs(twice) % 2, 1);
      EXPECT_EQ((std::abs(twice) - 1) / 2, (kW2kGrid[code & 0xff] >> (2 * j)) & 3);
      if (j < 7) EXPECT_EQ(twice < 0, ((code >> (8 + j)) & 1) != 0);
      sum += twice;
      point[size_t(j)] = q[j];
    }
    EXPECT_EQ(sum % 4, 0) << code;  // the coordinates' sum is even: a point of D8 + 1/2 (E8)
    EXPECT_TRUE(seen.insert(point).second) << code;
  }
}

TEST(W2k, ScaleBytes) {
  EXPECT_EQ(w2k_scale_value(0), 0.0f);
  EXPECT_EQ(w2k_scale_value(1), std::ldexp(1.0f, -26));
  EXPECT_EQ(w2k_scale_value(8), std::ldexp(1.0f, -23));
  EXPECT_EQ(w2k_scale_value(24 << 3), 1.0f);
  EXPECT_EQ(w2k_scale_value(255), 240.0f);
  for (int b = 1; b < 256; ++b) {
    EXPECT_LT(w2k_scale_value(uint8_t(b - 1)), w2k_scale_value(uint8_t(b)));
    EXPECT_EQ(w2k_scale_floor(w2k_scale_value(uint8_t(b))), b);
    EXPECT_EQ(w2k_scale_floor(double(w2k_scale_value(uint8_t(b))) * (1 - 1e-9)), b - 1);
  }
  EXPECT_EQ(w2k_scale_floor(0.0), 0);
  EXPECT_EQ(w2k_scale_floor(1e9), 255);
}

TEST(W2k, NearestCodewordMatchesBruteForce) {
  std::vector<int8_t> book(65536 * 8);
  for (int c = 0; c < 65536; ++c) w2k_decode(uint16_t(c), &book[size_t(c) * 8]);
  std::mt19937 rng(31);
  std::normal_distribution<double> normal(0, 1);
  std::uniform_real_distribution<double> u(0, 1);
  for (int trial = 0; trial < 300; ++trial) {
    double y[8], w[8];
    const double spread = trial < 100 ? 0.6 : trial < 200 ? 1.2 : 3.0;  // inside, around and beyond the grid
    for (int j = 0; j < 8; ++j) {
      y[j] = normal(rng) * spread;
      if (trial % 7 == 0 && j % 3 == 0) y[j] = std::round(y[j] * 2) / 2;  // exact half-integers and integers
      w[j] = trial % 5 == 0 ? 1.0 : u(rng) < 0.1 ? 0.0 : u(rng) * 3;
    }
    double cost = -1;
    const uint16_t code = w2k_nearest(y, w, &cost);
    double best = std::numeric_limits<double>::infinity();
    for (int c = 0; c < 65536; ++c) best = std::min(best, codeword_cost(&book[size_t(c) * 8], y, w));
    EXPECT_NEAR(codeword_cost(&book[size_t(code) * 8], y, w), cost, 1e-9 * (1 + cost)) << trial;
    EXPECT_LE(cost, best + 1e-9 * (1 + best)) << trial;
  }
}

TEST(W2k, BlockRules) {
  std::vector<double> v(64, 0.0);
  uint8_t codes[16], scales[2];
  float out[64];
  // Block 0 all zero: scale 0, every weight 0. Block 1: +-Inf saturates to the finite amax.
  v[32] = INFINITY, v[33] = -INFINITY, v[34] = 0.5, v[35] = -0.25;
  w2k_quantize_row(v.data(), nullptr, 64, codes, scales);
  w2k_dequant_row(codes, scales, 64, out);
  EXPECT_EQ(scales[0], 0);
  for (int k = 0; k < 32; ++k) EXPECT_EQ(out[k], 0.0f);
  for (int k = 32; k < 64; ++k) EXPECT_TRUE(std::isfinite(out[k]));
  EXPECT_GT(out[32], 0.3f);
  EXPECT_LT(out[33], -0.3f);
  // A block without any importance is quantized as if unweighted (not to zero).
  std::vector<double> g(32);
  for (int k = 0; k < 32; ++k) g[size_t(k)] = 0.01 * std::sin(k + 1.0);
  const std::vector<float> none(32, 0.0f);
  uint8_t weighted_codes[8], weighted_scale, plain_codes[8], plain_scale;
  w2k_quantize_row(g.data(), none.data(), 32, weighted_codes, &weighted_scale);
  w2k_quantize_row(g.data(), nullptr, 32, plain_codes, &plain_scale);
  EXPECT_NE(plain_scale, 0);
  EXPECT_EQ(weighted_scale, plain_scale);
  EXPECT_EQ(0, std::memcmp(weighted_codes, plain_codes, 8));
  // Dequantized values are q * scale / 4 exactly.
  int8_t q[8];
  w2k_decode(uint16_t(codes[8] | codes[9] << 8), q);
  EXPECT_EQ(double(out[32]), q[0] * double(w2k_scale_value(scales[1])) / 4);
}

TEST(W2k, ImportanceLowersTheWeightedError) {
  std::mt19937 rng(7);
  std::normal_distribution<double> normal(0, 0.02);
  std::uniform_real_distribution<double> u(0, 1);
  const int64_t K = 192;
  std::vector<float> imp(static_cast<size_t>(K)), ones(size_t(K), 1.0f);
  for (auto& x : imp) x = float(u(rng) < 0.2 ? 20 * u(rng) : 0.1 + u(rng));
  double weighted = 0, plain = 0, w2 = 0;
  for (int row = 0; row < 40; ++row) {
    std::vector<double> v(static_cast<size_t>(K));
    for (auto& x : v) x = normal(rng);
    std::vector<uint8_t> codes(static_cast<size_t>(K / 4)), scales(static_cast<size_t>(K / 32));
    std::vector<float> a(static_cast<size_t>(K)), b(static_cast<size_t>(K)), c(static_cast<size_t>(K));
    w2k_quantize_row(v.data(), imp.data(), K, codes.data(), scales.data());
    w2k_dequant_row(codes.data(), scales.data(), K, a.data());
    w2k_quantize_row(v.data(), nullptr, K, codes.data(), scales.data());
    w2k_dequant_row(codes.data(), scales.data(), K, b.data());
    w2_quantize_row(v.data(), K, nullptr, false, codes.data(), scales.data());
    w2_dequant_row(codes.data(), scales.data(), K, c.data());
    weighted += row_error(a, v, imp), plain += row_error(b, v, imp), w2 += row_error(c, v, ones);
    EXPECT_LE(row_error(b, v, ones), row_error(c, v, ones));  // unweighted W2K beats W2 on every row
  }
  EXPECT_LT(weighted, 0.9 * plain);
  EXPECT_GT(w2, 0);
}

TEST(W2k, SameBytesForAnyThreadCount) {
  std::mt19937 rng(3);
  std::normal_distribution<float> normal(0, 0.02f);
  const int64_t rows = 37, cols = 128;
  std::vector<float> data(static_cast<size_t>(rows * cols)), imp(static_cast<size_t>(cols));
  for (auto& x : data) x = normal(rng);
  for (auto& x : imp) x = std::fabs(normal(rng)) * 50;
  const SourceView src = source_view_f32(data.data(), rows, cols, "t");
  ThreadPool one(1), three(3);
  const QuantizeOptions options{ZeroMode::automatic, W2Quantizer::reference, imp.data()};
  const BlockTensor a = quantize(StoreFormat::w2k, src, options, one);
  const BlockTensor b = quantize(StoreFormat::w2k, src, options, three);
  EXPECT_EQ(a.codes, b.codes);
  EXPECT_EQ(a.scales, b.scales);
  EXPECT_EQ(a.codes.size(), store_codes_bytes(StoreFormat::w2k, rows, cols));
}

TEST(W2Opt, NeverWorseThanTheReferencePerBlock) {
  std::mt19937 rng(5);
  std::normal_distribution<double> normal(0, 0.02);
  std::uniform_real_distribution<double> u(0, 1);
  const int64_t K = 256;
  std::vector<float> imp(static_cast<size_t>(K));
  for (auto& x : imp) x = float(0.05 + 4 * u(rng));
  int better = 0;
  for (int row = 0; row < 30; ++row) {
    std::vector<double> v(static_cast<size_t>(K));
    for (auto& x : v) x = u(rng) < 0.05 ? 0.0 : normal(rng);
    uint8_t ref_codes[64], ref_scales[8], opt_codes[64], opt_scales[8];
    float ref[256], opt[256];
    w2_quantize_row(v.data(), K, nullptr, true, ref_codes, ref_scales);
    w2_opt_quantize_row(v.data(), K, nullptr, true, imp.data(), opt_codes, opt_scales);
    w2_dequant_row(ref_codes, ref_scales, K, ref);
    w2_dequant_row(opt_codes, opt_scales, K, opt);
    for (int b = 0; b < K / 32; ++b) {
      double er = 0, eo = 0;
      for (int k = 32 * b; k < 32 * b + 32; ++k) {
        er += imp[size_t(k)] * (v[size_t(k)] - ref[k]) * (v[size_t(k)] - ref[k]);
        eo += imp[size_t(k)] * (v[size_t(k)] - opt[k]) * (v[size_t(k)] - opt[k]);
        if (v[size_t(k)] == 0) EXPECT_EQ(std::signbit(opt[k]), k % 2 == 1);  // alternate zero signs kept
      }
      EXPECT_LE(eo, er);
      better += eo < er;
      if (opt_scales[b] == ref_scales[b]) {  // same exponent: the same codes (the levels are the nearest)
        for (int j = 0; j < 8; ++j) EXPECT_EQ(opt_codes[8 * b + j], ref_codes[8 * b + j]);
      }
    }
  }
  EXPECT_GT(better, 0);
}

}  // namespace moet
