// Element codecs: exhaustive agreement with core/dtype.h decoders and the generic rounding, the
// e2m1 threshold encoder against minifloat_round, and the saturation / NaN rules.
#include "core/dtype.h"
#include "formats/minifloat.h"
#include "formats/mx_block.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>

namespace moet {

TEST(Minifloat, E4m3DecodeMatchesCoreAndEncodeRoundTrips) {
  for (int b = 0; b < 256; ++b) {
    const double v = e4m3_to_double(uint8_t(b));
    const float core = fp8_e4m3_to_float(uint8_t(b));
    if (std::isnan(core)) {
      EXPECT_TRUE(std::isnan(v)) << b;
      continue;
    }
    EXPECT_EQ(v, double(core)) << b;
    EXPECT_EQ(e4m3_from_double(v), uint8_t(b)) << b;
  }
}

TEST(Minifloat, E4m3SaturatesAndRoundsToEven) {
  EXPECT_EQ(e4m3_to_double(e4m3_from_double(1e9)), 448.0);
  EXPECT_EQ(e4m3_to_double(e4m3_from_double(-INFINITY)), -448.0);
  EXPECT_EQ(e4m3_to_double(e4m3_from_double(464.0)), 448.0);
  EXPECT_EQ(e4m3_from_double(-0.0), 0x80);
  EXPECT_TRUE(std::isnan(e4m3_to_double(e4m3_from_double(NAN))));
  // 1 + 1/16 is halfway between 1 and 1.125: ties to even (1).
  EXPECT_EQ(e4m3_to_double(e4m3_from_double(1.0625)), 1.0);
  EXPECT_EQ(e4m3_to_double(e4m3_from_double(1.1875)), 1.25);
  // Smallest subnormal 2^-9; half of it ties to zero, a bit more rounds up.
  EXPECT_EQ(e4m3_to_double(e4m3_from_double(std::ldexp(1.0, -10))), 0.0);
  EXPECT_EQ(e4m3_to_double(e4m3_from_double(std::ldexp(1.01, -10))), std::ldexp(1.0, -9));
}

TEST(Minifloat, Bf16AndF16MatchCoreRounding) {
  std::mt19937 rng(7);
  std::uniform_int_distribution<uint32_t> bits;
  for (int i = 0; i < 200000; ++i) {
    const float f = std::bit_cast<float>(bits(rng));
    if (std::isnan(f)) continue;
    EXPECT_EQ(minifloat_encode(minifloat_round(f, kBF16), kBF16), float_to_bf16(f)) << f;
    EXPECT_EQ(minifloat_encode(minifloat_round(f, kF16), kF16), float_to_f16(f)) << f;
  }
}

TEST(Minifloat, E2m1ThresholdsEqualGenericRounding) {
  std::mt19937 rng(11);
  std::uniform_real_distribution<double> dist(-8, 8);
  std::vector<double> xs = {0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 6.0, 7.0, 0.0, -0.0, 1e-300};
  for (int i = 0; i < 100000; ++i) xs.push_back(dist(rng));
  for (double x : xs) {
    for (double s : {x, -x}) {
      const double generic = minifloat_round(s, kE2M1);
      const uint8_t nibble = e2m1_from_double(s);
      EXPECT_EQ(e2m1_to_double(nibble), generic) << s;
      EXPECT_EQ(nibble, minifloat_encode(generic, kE2M1)) << s;
    }
  }
}

TEST(MxBlock, ExponentIsRoundedLog2) {
  std::mt19937 rng(3);
  std::uniform_real_distribution<double> dist(-140, 140);
  for (int i = 0; i < 100000; ++i) {
    const double amax = std::exp2(dist(rng));
    const int expect = std::clamp(int(std::nearbyint(std::log2(amax / 6))), -127, 127);
    EXPECT_EQ(mx_block_exponent(amax), expect) << amax;
  }
  EXPECT_EQ(mx_block_exponent(0), -127);
  EXPECT_EQ(mx_block_exponent(6), 0);
  EXPECT_EQ(mx_block_exponent(1e300), 127);
}

}  // namespace moet
