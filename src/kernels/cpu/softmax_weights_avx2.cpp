// Softmax weights on 8-float vectors (compiled with -mavx2 but not -mfma, so that no multiply
// and add are fused and the results equal the portable build's; called only where cpu_isa_has_avx2).
#include "kernels/cpu/softmax_weights_loop.h"

namespace moet::avx2 {

double softmax_weights(const float* values, int64_t n, float max, float inverse_temperature, float* weights) {
  return softmax_weights_loop(values, n, max, inverse_temperature, weights);
}

}  // namespace moet::avx2
