// AVX2/FMA dot products (compiled with -mavx2 -mfma; called only where cpu_isa_has_avx2).
// Two 8-lane accumulators over 16 elements a step, 8 more, then the tail in scalar order. The
// four-row variant loads each weight vector once for four activation rows and performs, per
// row, exactly the operations of the one-row version, so a row's result does not depend on how
// many rows share the call (batch invariance).
#include "kernels/cpu/matmul.h"

#include "core/dtype.h"

#include <immintrin.h>

namespace moet::avx2 {
namespace {

inline __m256 load_bf16x8(const uint16_t* w) {
  const __m128i raw = _mm_loadu_si128(reinterpret_cast<const __m128i*>(w));
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(raw), 16));
}

inline float horizontal_sum(__m256 v) {
  const __m128 low = _mm256_castps256_ps128(v);
  const __m128 high = _mm256_extractf128_ps(v, 1);
  __m128 sum = _mm_add_ps(low, high);
  sum = _mm_add_ps(sum, _mm_movehl_ps(sum, sum));
  sum = _mm_add_ss(sum, _mm_shuffle_ps(sum, sum, 1));
  return _mm_cvtss_f32(sum);
}

}  // namespace

inline __m256 load8(const uint16_t* w) { return load_bf16x8(w); }
inline __m256 load8(const float* w) { return _mm256_loadu_ps(w); }
inline float load1(const uint16_t* w) { return bf16_to_float(*w); }
inline float load1(const float* w) { return *w; }

template <typename W>
float dot(const float* x, const W* w, int64_t k) {
  __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 16 <= k; i += 16) {
    acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(x + i), load8(w + i), acc0);
    acc1 = _mm256_fmadd_ps(_mm256_loadu_ps(x + i + 8), load8(w + i + 8), acc1);
  }
  for (; i + 8 <= k; i += 8) acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(x + i), load8(w + i), acc0);
  float total = horizontal_sum(_mm256_add_ps(acc0, acc1));
  for (; i < k; ++i) total += x[i] * load1(w + i);
  return total;
}

float dot_bf16(const float* x, const uint16_t* w, int64_t k) { return dot(x, w, k); }
float dot_f32(const float* x, const float* w, int64_t k) { return dot(x, w, k); }

void axpy_f32(float a, const float* x, float* y, int64_t n) {
  const __m256 va = _mm256_set1_ps(a);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    _mm256_storeu_ps(y + i, _mm256_fmadd_ps(va, _mm256_loadu_ps(x + i), _mm256_loadu_ps(y + i)));
  for (; i < n; ++i) y[i] += a * x[i];
}

void dot_bf16_rows4(const float* const x[4], const uint16_t* w, int64_t k, float out[4]) {
  __m256 acc0[4], acc1[4];
  for (int r = 0; r < 4; ++r) acc0[r] = acc1[r] = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 16 <= k; i += 16) {
    const __m256 w0 = load_bf16x8(w + i), w1 = load_bf16x8(w + i + 8);
    for (int r = 0; r < 4; ++r) {
      acc0[r] = _mm256_fmadd_ps(_mm256_loadu_ps(x[r] + i), w0, acc0[r]);
      acc1[r] = _mm256_fmadd_ps(_mm256_loadu_ps(x[r] + i + 8), w1, acc1[r]);
    }
  }
  if (i + 8 <= k) {
    const __m256 w0 = load_bf16x8(w + i);
    for (int r = 0; r < 4; ++r) acc0[r] = _mm256_fmadd_ps(_mm256_loadu_ps(x[r] + i), w0, acc0[r]);
    i += 8;
  }
  for (int r = 0; r < 4; ++r) {
    float total = horizontal_sum(_mm256_add_ps(acc0[r], acc1[r]));
    for (int64_t j = i; j < k; ++j) total += x[r][j] * bf16_to_float(w[j]);
    out[r] = total;
  }
}

}  // namespace moet::avx2
