// AVX-512 W2 dot products of two weight rows (two output columns) against up to kW2RowsPerPass
// activation rows (compiled with AVX-512 F/BW/DQ/VL; called only with CpuIsa::avx512). One 512-bit
// register holds both columns: lanes 0-7 the first, lanes 8-15 the second, and each half does
// exactly avx2::dot_w2's operations in its order (w2_matmul_avx2.cpp): per block the products of
// the low words' 8 + 8 weights, the FMAs of the high words', their sum, one FMA with the block
// scale into the total, and at the end the same horizontal sum of each half. So the results are the
// AVX2 level's bit for bit, while a block's decoding (shift and permute) and arithmetic serve two
// columns per instruction. The level vector repeats {-4,-1,1,4} over 16 entries, so the permute,
// which reads the index's low 4 bits, needs no mask: the code above a weight's does not change it.
#include "kernels/cpu/w2_rows.h"

#include "kernels/cpu/w2_matmul.h"
#include "kernels/cpu/w2_simd_avx2.h"

#include <array>
#include <cstring>
#include <utility>

namespace moet::avx512 {
namespace {

constexpr __mmask16 kSecondColumn = 0xff00;

// A 32-bit word of each column's block codes: lanes 0-7 the first's, lanes 8-15 the second's.
__m512i word_pair(const uint8_t* first, const uint8_t* second) {
  uint32_t a, b;
  std::memcpy(&a, first, 4);
  std::memcpy(&b, second, 4);
  return _mm512_mask_set1_epi32(_mm512_set1_epi32(int(a)), kSecondColumn, int(b));
}

// Eight activations in both halves.
__m512 both_halves(const float* x) { return _mm512_broadcast_f32x8(_mm256_loadu_ps(x)); }

template <int kRows>
void dot_w2_pair(const float* x, int64_t k, const W2ColumnPair& w, float* out) {
  const __m512i low_shifts = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 0, 2, 4, 6, 8, 10, 12, 14);
  const __m512i high_shifts = _mm512_add_epi32(low_shifts, _mm512_set1_epi32(16));
  const __m512 levels = _mm512_setr_ps(-4, -1, 1, 4, -4, -1, 1, 4, -4, -1, 1, 4, -4, -1, 1, 4);
  __m512 total[kRows];
  for (int r = 0; r < kRows; ++r) total[r] = _mm512_setzero_ps();
  for (int64_t b = 0; b < k / 32; ++b) {
    const __m512i w0 = word_pair(w.codes[0] + b * 8, w.codes[1] + b * 8);
    const __m512i w1 = word_pair(w.codes[0] + b * 8 + 4, w.codes[1] + b * 8 + 4);
    const auto weights = [&](__m512i word, __m512i shifts) {
      return _mm512_permutexvar_ps(_mm512_srlv_epi32(word, shifts), levels);
    };
    const __m512 a = weights(w0, low_shifts), c = weights(w0, high_shifts);
    const __m512 d = weights(w1, low_shifts), e = weights(w1, high_shifts);
    const __m512 scale = _mm512_mask_blend_ps(kSecondColumn, _mm512_set1_ps(ue8m0_to_float(w.scales[0][b])),
                                              _mm512_set1_ps(ue8m0_to_float(w.scales[1][b])));
    for (int r = 0; r < kRows; ++r) {
      const float* xb = x + r * k + b * 32;
      __m512 acc0 = _mm512_mul_ps(a, both_halves(xb));
      __m512 acc1 = _mm512_mul_ps(c, both_halves(xb + 8));
      acc0 = _mm512_fmadd_ps(d, both_halves(xb + 16), acc0);
      acc1 = _mm512_fmadd_ps(e, both_halves(xb + 24), acc1);
      total[r] = _mm512_fmadd_ps(_mm512_add_ps(acc0, acc1), scale, total[r]);
    }
  }
  for (int r = 0; r < kRows; ++r) {
    out[2 * r] = avx2::horizontal_sum(_mm512_castps512_ps256(total[r]));
    out[2 * r + 1] = avx2::horizontal_sum(_mm512_extractf32x8_ps(total[r], 1));
  }
}

// dot_w2_pair for each row count 1..kW2RowsPerPass (the totals stay in registers).
template <size_t... kRowsLess1>
constexpr auto pair_kernels(std::index_sequence<kRowsLess1...>) {
  return std::array{&dot_w2_pair<int(kRowsLess1) + 1>...};
}
constexpr auto kPairKernels = pair_kernels(std::make_index_sequence<size_t(kW2RowsPerPass)>());

}  // namespace

void dot_w2_rows_pair(const float* x, int64_t rows, const W2ColumnPair& w, int64_t k, float* out) {
  kPairKernels[size_t(rows - 1)](x, k, w, out);
}

}  // namespace moet::avx512
