// exp_nonpositive against the double exponential (within 2 float ulps over [-87, 0], exactly 1 at
// 0, and 0 below -87, at -inf and for NaN), and softmax_weights (the Sampler's weights) against
// a plain scalar statement of its contract, bit for bit: weights and the sum of 8 interleaved
// partial sums. Whichever build the CPU dispatches to (AVX2 here, the portable one under
// MOET_CPU_SCALAR=1 in kernels_scalar_paths) must give exactly these numbers. count_at_least
// (min-p's count) against the comparison in double.
#include "../cpu_isa_env.h"
#include "../random_values.h"
#include "kernels/cpu/softmax_weights.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>

namespace moet {
namespace {

TEST(SoftmaxWeights, ExpWithinTwoUlps) {
  double worst = 0.0;
  for (int i = 0; i <= 2000000; ++i) {
    const float x = -87.0f * float(i) / 2000000.0f + 1e-6f * float(i % 7);  // off the grid's round values
    if (!(x <= 0.0f && x > -87.0f)) continue;
    const double exact = std::exp(double(x));
    const double ulp = std::ldexp(1.0, std::ilogb(float(exact)) - 23);
    worst = std::max(worst, std::fabs(double(exp_nonpositive(x)) - exact) / ulp);
  }
  EXPECT_LE(worst, 2.0);
  EXPECT_EQ(exp_nonpositive(0.0f), 1.0f);
  EXPECT_EQ(exp_nonpositive(-0.0f), 1.0f);
  for (float x : {-87.0f, -88.0f, -1000.0f, -INFINITY, NAN}) EXPECT_EQ(exp_nonpositive(x), 0.0f) << x;
}

TEST(SoftmaxWeights, EqualTheScalarStatementBitForBit) {
  for (int64_t n : {1, 7, 8, 9, 1000, 151936}) {
    std::vector<float> values = random_floats(size_t(n), uint64_t(n), 4.0f);
    if (n > 9) {
      values[3] = NAN;
      values[5] = -INFINITY;
      values[6] = -200.0f;
    }
    float max = -INFINITY;
    for (float v : values) max = v > max ? v : max;
    for (float inverse_temperature : {1.0f, 1.0f / 0.7f, 0.2f}) {
      std::vector<float> weights(static_cast<size_t>(n)), expected(static_cast<size_t>(n));
      double lane[8] = {};
      for (int64_t i = 0; i < n; ++i) {
        expected[size_t(i)] = exp_nonpositive((values[size_t(i)] - max) * inverse_temperature);
        lane[i % 8] += double(expected[size_t(i)]);
      }
      double expected_sum = 0.0;
      for (double s : lane) expected_sum += s;
      const double sum = softmax_weights(values.data(), n, max, inverse_temperature, weights.data(), test_cpu_isa());
      EXPECT_EQ(0, std::memcmp(weights.data(), expected.data(), size_t(n) * sizeof(float))) << "n " << n;
      EXPECT_EQ(0, std::memcmp(&sum, &expected_sum, sizeof sum)) << "n " << n << ": " << sum << " vs " << expected_sum;
      if (n > 9) {
        EXPECT_EQ(weights[3], 0.0f);
        EXPECT_EQ(weights[5], 0.0f);
      }
    }
  }
}

// count_at_least() against the double comparison, at thresholds on, just above and just below
// float weights and at values no float equals.
TEST(SoftmaxWeights, CountAtLeastComparesAsDoubles) {
  std::vector<float> weights = random_floats(1003, 9);
  for (float& w : weights) w = std::fabs(w);
  weights[10] = weights[11] = 0.5f;
  for (double threshold : {0.5, std::nextafter(0.5, 1.0), std::nextafter(0.5, 0.0), 0.1, 1.0 / 3.0, 0.0, 7.0,
                           double(weights[7]), double(weights[7]) + 1e-12, double(weights[7]) - 1e-12}) {
    int64_t expected = 0;
    for (float w : weights) expected += double(w) >= threshold ? 1 : 0;
    EXPECT_EQ(count_at_least(weights.data(), int64_t(weights.size()), threshold), expected) << threshold;
  }
}

}  // namespace
}  // namespace moet
