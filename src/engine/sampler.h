// Token sampling from one row of logits: greedy (temperature 0) or temperature + top-k + top-p
// with a seeded generator, so a given seed reproduces the same tokens.
#pragma once

#include <cstdint>
#include <random>
#include <vector>

namespace moet {

struct SamplingParams {
  float temperature = 0.0f;  // 0 = greedy
  float top_p = 1.0f;
  int64_t top_k = 0;         // 0 = all
  uint64_t seed = 0;
};

class Sampler {
 public:
  explicit Sampler(const SamplingParams& params);
  int32_t sample(const float* logits, int64_t vocab);

 private:
  SamplingParams params_;
  std::mt19937_64 rng_;
  std::vector<int32_t> order_;
  std::vector<double> probs_;
};

// Index of the largest value (the lowest index among equals).
int32_t argmax(const float* values, int64_t n);

}  // namespace moet
