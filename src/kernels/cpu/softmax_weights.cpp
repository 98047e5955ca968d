// Softmax weights (see softmax_weights.h): the AVX2 build when the CPU has it, else this one.
#include "kernels/cpu/softmax_weights.h"

#include "kernels/cpu/cpu_features.h"
#include "kernels/cpu/softmax_weights_loop.h"

namespace moet {

double softmax_weights(const float* values, int64_t n, float max, float inverse_temperature, float* weights) {
  if (cpu_has_avx2()) return avx2::softmax_weights(values, n, max, inverse_temperature, weights);
  return softmax_weights_loop(values, n, max, inverse_temperature, weights);
}

}  // namespace moet
