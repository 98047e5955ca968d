// Seeded random test inputs shared by the C++ test suites (included as "../random_values.h"):
// the same seed gives the same values on every machine (std::mt19937_64 is fully specified; the
// normal distribution is libstdc++'s, the same in CI and here).
#pragma once

#include <cstddef>
#include <cstdint>
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

}  // namespace moet
