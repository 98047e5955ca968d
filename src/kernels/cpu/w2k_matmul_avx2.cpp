// AVX2/FMA W2K dot product (compiled with -mavx2 -mfma; called only where cpu_isa_has_avx2). Per
// codeword: load its eight magnitudes (a 32-byte table row), put its eight sign bits into the
// float sign bits (broadcast, variable shift, mask, xor), add the shift +-1/4 (loaded by its bit:
// a branch on it mispredicts half the time) and multiply-add with x; per block one FMA with the
// scale.
#include "kernels/cpu/w2_matmul.h"

#include "kernels/cpu/w2_simd_avx2.h"

namespace moet::avx2 {

float dot_w2k(const float* x, const uint8_t* codes, const uint8_t* scales, int64_t k) {
  const W2kTables& t = w2k_tables();
  const __m256i to_sign_bit = _mm256_setr_epi32(31, 30, 29, 28, 27, 26, 25, 24);
  const __m256i sign_bit = _mm256_set1_epi32(int(0x80000000u));
  static constexpr float shifts[2] = {0.25f, -0.25f};  // by bit 15 (a random bit: no branch on it)
  __m256 total = _mm256_setzero_ps();
  for (int64_t b = 0; b < k / 32; ++b) {
    const uint8_t* c = codes + b * 8;
    const float* xb = x + b * 32;
    const auto weights = [&](int v) {  // codeword v's eight weights in units of the scale
      const uint32_t code = uint32_t(c[2 * v]) | uint32_t(c[2 * v + 1]) << 8;
      const __m256i signs = _mm256_and_si256(
          _mm256_sllv_epi32(_mm256_set1_epi32(int(w2k_signs(code, t))), to_sign_bit), sign_bit);
      const __m256 m = _mm256_loadu_ps(t.magnitude[code & 0xff]);
      return _mm256_add_ps(_mm256_xor_ps(m, _mm256_castsi256_ps(signs)), _mm256_broadcast_ss(&shifts[code >> 15]));
    };
    __m256 acc0 = _mm256_mul_ps(weights(0), _mm256_loadu_ps(xb));
    __m256 acc1 = _mm256_mul_ps(weights(1), _mm256_loadu_ps(xb + 8));
    acc0 = _mm256_fmadd_ps(weights(2), _mm256_loadu_ps(xb + 16), acc0);
    acc1 = _mm256_fmadd_ps(weights(3), _mm256_loadu_ps(xb + 24), acc1);
    total = _mm256_fmadd_ps(_mm256_add_ps(acc0, acc1), _mm256_set1_ps(w2k_scale_to_float(scales[b])), total);
  }
  return horizontal_sum(total);
}

}  // namespace moet::avx2
