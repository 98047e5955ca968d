// AVX2/FMA W2 dot products of up to kW2RowsPerPass rows sharing each block's decoding (compiled
// with -mavx2 -mfma; called only where cpu_isa_has_avx2). Per row the operations are avx2::dot_w2's
// (w2_matmul_avx2.cpp): the two products of a block's low words, the two FMAs of its high words,
// one FMA of their sum with the block scale into the row's total, the same horizontal sum.
#include "kernels/cpu/w2_rows.h"

#include "kernels/cpu/w2_matmul.h"
#include "kernels/cpu/w2_simd_avx2.h"

#include <cstring>

namespace moet::avx2 {

void dot_w2_rows(const float* x, int64_t rows, const uint8_t* codes, const uint8_t* scales, int64_t k, float* out) {
  const __m256i low_shifts = _mm256_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14);
  const __m256i high_shifts = _mm256_setr_epi32(16, 18, 20, 22, 24, 26, 28, 30);
  const __m256i three = _mm256_set1_epi32(3);
  const __m256 levels = _mm256_setr_ps(-4, -1, 1, 4, -4, -1, 1, 4);
  __m256 total[kW2RowsPerPass];
  for (int64_t r = 0; r < rows; ++r) total[r] = _mm256_setzero_ps();
  for (int64_t b = 0; b < k / 32; ++b) {
    uint32_t words[2];
    std::memcpy(words, codes + b * 8, 8);
    const __m256i w0 = _mm256_set1_epi32(int(words[0])), w1 = _mm256_set1_epi32(int(words[1]));
    const auto weights = [&](__m256i word, __m256i shifts) {
      return _mm256_permutevar8x32_ps(levels, _mm256_and_si256(_mm256_srlv_epi32(word, shifts), three));
    };
    const __m256 a = weights(w0, low_shifts), c = weights(w0, high_shifts);
    const __m256 d = weights(w1, low_shifts), e = weights(w1, high_shifts);
    const __m256 scale = _mm256_set1_ps(ue8m0_to_float(scales[b]));
    for (int64_t r = 0; r < rows; ++r) {
      const float* xb = x + r * k + b * 32;
      __m256 acc0 = _mm256_mul_ps(a, _mm256_loadu_ps(xb));
      __m256 acc1 = _mm256_mul_ps(c, _mm256_loadu_ps(xb + 8));
      acc0 = _mm256_fmadd_ps(d, _mm256_loadu_ps(xb + 16), acc0);
      acc1 = _mm256_fmadd_ps(e, _mm256_loadu_ps(xb + 24), acc1);
      total[r] = _mm256_fmadd_ps(_mm256_add_ps(acc0, acc1), scale, total[r]);
    }
  }
  for (int64_t r = 0; r < rows; ++r) out[r] = horizontal_sum(total[r]);
}

}  // namespace moet::avx2
