// Seeded random test inputs shared by the C++ test suites (included as "../random_values.h"):
// the same seed gives the same values on every machine (std::mt19937_64 is fully specified; the
// normal distribution is libstdc++'s, the same in CI and here).
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

namespace moet {

// n normally distributed floats, mean 0, standard deviation `scale`.
inline std::vector<float> random_floats(size_t n, uint64_t seed, float scale = 1.0f) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.0f, scale);
  std::vector<float> out(n);
  for (auto& v : out) v = normal(rng);
  return out;
}

// n e4m3 codes of both signs with exponent fields 0..7 (|value| < 2, subnormals included; never
// NaN), for FP8-block weights.
inline std::vector<uint8_t> random_fp8_codes(size_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<uint8_t> out(n);
  for (auto& v : out) v = uint8_t(rng()) & 0xbf;
  return out;
}

// n FP8 block scales in [scale, 2 * scale) with full F32 mantissas (so code * scale rounds).
inline std::vector<float> random_fp8_scales(size_t n, uint64_t seed, float scale = 0.01f) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> uniform(1.0f, 2.0f);
  std::vector<float> out(n);
  for (auto& v : out) v = scale * uniform(rng);
  return out;
}

// rows x vocab logits with everything a top-k order must settle: runs of equal values (half of
// them rounded to quarters), -0 next to +0, -inf, a rare +inf, NaNs of both signs; from 3 rows
// on, row 1 is all NaN and row 2 one value throughout (ties decided by id alone).
inline std::vector<float> awkward_logits(int64_t rows, int64_t vocab, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.0f, 3.0f);
  const uint32_t negative_nan_bits = 0xffc00001u;
  float negative_nan;
  std::memcpy(&negative_nan, &negative_nan_bits, sizeof negative_nan);
  std::vector<float> out(static_cast<size_t>(rows * vocab));
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t i = 0; i < vocab; ++i) {
      float v = normal(rng);
      const uint64_t pick = rng() % 4096;
      if (pick < 64) v = NAN;
      else if (pick < 96) v = negative_nan;
      else if (pick < 160) v = -INFINITY;
      else if (pick < 161) v = INFINITY;
      else if (pick < 300) v = -0.0f;
      else if (pick < 400) v = 0.0f;
      else if (pick % 2) v = std::round(v * 4.0f) / 4.0f;
      if (rows > 2 && r == 1) v = NAN;
      if (rows > 2 && r == 2) v = 1.25f;
      out[size_t(r * vocab + i)] = v;
    }
  }
  return out;
}

}  // namespace moet
