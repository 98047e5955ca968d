// The unnormalised softmax weights a sampler draws from: w[i] = e^((v[i] - max) / T), in float,
// with their sum in double. One function computes them for the Sampler (engine/sampler.cpp) and
// for the tests that restate its draw, so both see the same numbers. The exponential is our own
// vectorisable one (exp_nonpositive): glibc's vector exp is declared only under -ffast-math, which
// would also drop the NaN checks the sampler relies on, and a libm call per token was half the
// cost of a 152k-vocabulary draw (docs/design.md, "Sampling").
#pragma once

#include "core/cpu_isa.h"

#include <cstdint>
#include <cstring>

namespace moet {

// e^x for x <= 0, within 2 float ulps of the exact value down to x = -87 (e^-87 ~ 1.6e-38, the
// smallest normal float's neighbourhood); 0 below that, for -inf and for NaN (a NaN logit has no
// probability). Cephes' expf: x = n ln2 + r with |r| <= ln2 / 2, a degree-6 polynomial in r, and
// 2^n put into the exponent bits; n is rounded by adding 1.5 * 2^23, whose low bits then hold it.
// Always inlined: the portable and AVX2 builds of the weights' loop each get their own copy.
[[gnu::always_inline]] inline float exp_nonpositive(float x) {
  constexpr float kLog2e = 1.44269504088896341f, kLn2Hi = 0.693359375f, kLn2Lo = -2.12194440e-4f;
  constexpr float kRound = 12582912.0f;  // 1.5 * 2^23
  constexpr float kLowest = -87.0f;
  const float clamped = x > kLowest ? x : kLowest;  // also NaN -> kLowest
  const float shifted = clamped * kLog2e + kRound;
  const float n = shifted - kRound;
  const float r = (clamped - n * kLn2Hi) - n * kLn2Lo;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  const float mantissa = (p * r * r + r) + 1.0f;
  uint32_t bits;
  std::memcpy(&bits, &shifted, sizeof bits);
  const uint32_t scale_bits = (bits - 0x4B400000u + 127u) << 23;  // 2^n, n >= -126 here
  float scale;
  std::memcpy(&scale, &scale_bits, sizeof scale);
  return x > kLowest ? mantissa * scale : 0.0f;
}

// weights[i] = exp_nonpositive((values[i] - max) * inverse_temperature) for i < n, where max is
// at least every non-NaN value; returns their sum, taken in 8 interleaved partial sums (index i
// into sum i % 8) that are then added in order. The AVX2 build runs the same operations (no
// fused multiply-adds), so the result depends only on the inputs, not on the CPU or `isa`.
double softmax_weights(const float* values, int64_t n, float max, float inverse_temperature, float* weights,
                       CpuIsa isa);

// How many of weights[0, n) are >= threshold, compared exactly (as doubles), in a loop that
// vectorises: the threshold is rounded up to the nearest float first.
int64_t count_at_least(const float* weights, int64_t n, double threshold);

namespace avx2 {
double softmax_weights(const float* values, int64_t n, float max, float inverse_temperature, float* weights);
}  // namespace avx2

}  // namespace moet
