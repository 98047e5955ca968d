// AVX2/FMA W2 dot product (compiled with -mavx2 -mfma; called only where cpu_isa_has_avx2).
// A block's 32 codes are two 32-bit words; each is broadcast once and serves two groups of eight
// weights: shift lane i by 2i (or 16 + 2i), mask to the code and permute the level vector
// {-4,-1,1,4} by it. Two accumulators per block, then one FMA with the block scale.
#include "kernels/cpu/w2_matmul.h"

#include "kernels/cpu/w2_simd_avx2.h"

#include <cstring>

namespace moet::avx2 {

float dot_w2(const float* x, const uint8_t* codes, const uint8_t* scales, int64_t k) {
  const __m256i low_shifts = _mm256_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14);
  const __m256i high_shifts = _mm256_setr_epi32(16, 18, 20, 22, 24, 26, 28, 30);
  const __m256i three = _mm256_set1_epi32(3);
  const __m256 levels = _mm256_setr_ps(-4, -1, 1, 4, -4, -1, 1, 4);
  __m256 total = _mm256_setzero_ps();
  for (int64_t b = 0; b < k / 32; ++b) {
    uint32_t words[2];
    std::memcpy(words, codes + b * 8, 8);  // 16 codes per 32-bit word
    const float* xb = x + b * 32;
    const __m256i w0 = _mm256_set1_epi32(int(words[0])), w1 = _mm256_set1_epi32(int(words[1]));
    const auto weights = [&](__m256i word, __m256i shifts) {
      return _mm256_permutevar8x32_ps(levels, _mm256_and_si256(_mm256_srlv_epi32(word, shifts), three));
    };
    __m256 acc0 = _mm256_mul_ps(weights(w0, low_shifts), _mm256_loadu_ps(xb));
    __m256 acc1 = _mm256_mul_ps(weights(w0, high_shifts), _mm256_loadu_ps(xb + 8));
    acc0 = _mm256_fmadd_ps(weights(w1, low_shifts), _mm256_loadu_ps(xb + 16), acc0);
    acc1 = _mm256_fmadd_ps(weights(w1, high_shifts), _mm256_loadu_ps(xb + 24), acc1);
    total = _mm256_fmadd_ps(_mm256_add_ps(acc0, acc1), _mm256_set1_ps(ue8m0_to_float(scales[b])), total);
  }
  return horizontal_sum(total);
}

}  // namespace moet::avx2
