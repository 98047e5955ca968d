// Shared AVX2 helpers of the W2 / FP4 kernels (include only from *_avx2.cpp and *_avx512.cpp files).
#pragma once

#include <immintrin.h>

namespace moet::avx2 {

inline float horizontal_sum(__m256 v) {
  __m128 sum = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  sum = _mm_add_ps(sum, _mm_movehl_ps(sum, sum));
  sum = _mm_add_ss(sum, _mm_shuffle_ps(sum, sum, 1));
  return _mm_cvtss_f32(sum);
}

}  // namespace moet::avx2
