// AVX2/FMA MXFP4 dot product (compiled with -mavx2 -mfma; called only where cpu_isa_has_avx2).
// Eight weights are four code bytes: broadcast, shift each lane by 4*lane, permute the magnitude
// vector {0,.5,1,1.5,2,3,4,6} by the low 3 bits and move bit 3 to the float sign bit.
#include "kernels/cpu/w2_matmul.h"

#include "kernels/cpu/w2_simd_avx2.h"

#include <cstring>

namespace moet::avx2 {

float dot_fp4(const float* x, const uint8_t* codes, const uint8_t* scales, int64_t k) {
  const __m256i shifts = _mm256_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28);
  const __m256i low3 = _mm256_set1_epi32(7), bit3 = _mm256_set1_epi32(8);
  const __m256 magnitudes = _mm256_setr_ps(0, 0.5f, 1, 1.5f, 2, 3, 4, 6);
  __m256 total = _mm256_setzero_ps();
  for (int64_t b = 0; b < k / 32; ++b) {
    const uint8_t* c = codes + b * 16;
    const float* xb = x + b * 32;
    __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
    for (int g = 0; g < 4; ++g) {
      int bits;
      std::memcpy(&bits, c + 4 * g, 4);
      const __m256i nibbles = _mm256_srlv_epi32(_mm256_set1_epi32(bits), shifts);
      const __m256 mag = _mm256_permutevar8x32_ps(magnitudes, _mm256_and_si256(nibbles, low3));
      const __m256i sign = _mm256_slli_epi32(_mm256_and_si256(nibbles, bit3), 28);
      const __m256 w = _mm256_xor_ps(mag, _mm256_castsi256_ps(sign));
      if (g & 1) {
        acc1 = _mm256_fmadd_ps(w, _mm256_loadu_ps(xb + 8 * g), acc1);
      } else {
        acc0 = _mm256_fmadd_ps(w, _mm256_loadu_ps(xb + 8 * g), acc0);
      }
    }
    total = _mm256_fmadd_ps(_mm256_add_ps(acc0, acc1), _mm256_set1_ps(ue8m0_to_float(scales[b])), total);
  }
  return horizontal_sum(total);
}

}  // namespace moet::avx2
