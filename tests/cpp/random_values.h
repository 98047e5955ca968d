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

}  // namespace moet
