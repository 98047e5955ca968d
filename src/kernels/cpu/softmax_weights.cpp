// Softmax weights (see softmax_weights.h): the AVX2 build when the CPU has it, else this one;
// and the count of weights at or above a threshold (min-p).
#include "kernels/cpu/softmax_weights.h"

#include "kernels/cpu/softmax_weights_loop.h"

#include <cmath>

namespace moet {

double softmax_weights(const float* values, int64_t n, float max, float inverse_temperature, float* weights,
                       CpuIsa isa) {
  if (cpu_isa_has_avx2(isa)) return avx2::softmax_weights(values, n, max, inverse_temperature, weights);
  return softmax_weights_loop(values, n, max, inverse_temperature, weights);
}

int64_t count_at_least(const float* weights, int64_t n, double threshold) {
  float bound = float(threshold);
  if (double(bound) < threshold) bound = std::nextafter(bound, INFINITY);  // w >= threshold <=> w >= bound
  int64_t count = 0;
  for (int64_t i = 0; i < n; ++i) count += weights[i] >= bound ? 1 : 0;
  return count;
}

}  // namespace moet
