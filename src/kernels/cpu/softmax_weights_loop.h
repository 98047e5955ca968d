// The loop of softmax_weights() (softmax_weights.h), included by the portable build
// (softmax_weights.cpp) and the AVX2 one (softmax_weights_avx2.cpp): static, so each file keeps
// its own copy. Blocks of 8 with 8 partial sums, a shape GCC vectorises (-O3, as the two files
// are compiled); the sum's order is fixed by the blocks, not by the vector width.
#pragma once

#include "kernels/cpu/softmax_weights.h"

namespace moet {

static double softmax_weights_loop(const float* values, int64_t n, float max, float inverse_temperature,
                                   float* weights) {
  constexpr int kLanes = 8;
  double lane[kLanes] = {};
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes)
    for (int j = 0; j < kLanes; ++j) {
      const float w = exp_nonpositive((values[i + j] - max) * inverse_temperature);
      weights[i + j] = w;
      lane[j] += double(w);
    }
  for (int j = 0; i + j < n; ++j) {
    const float w = exp_nonpositive((values[i + j] - max) * inverse_temperature);
    weights[i + j] = w;
    lane[j] += double(w);
  }
  double total = 0.0;
  for (double s : lane) total += s;
  return total;
}

}  // namespace moet
