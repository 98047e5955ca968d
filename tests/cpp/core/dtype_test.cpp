// Scalar dtype conversions against exact expectations (bf16/f16 rounding, fp8 e4m3 decoding).
#include "core/dtype.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>

namespace moet {

TEST(DType, ParseAndSizeRoundTrip) {
  for (const char* name : {"F32", "F16", "BF16", "F8_E4M3", "U8", "I8", "I64", "BOOL"}) {
    DType dtype;
    ASSERT_TRUE(dtype_parse(name, &dtype)) << name;
    EXPECT_EQ(dtype_name(dtype), name);
  }
  DType dtype;
  EXPECT_FALSE(dtype_parse("F8_E5M3", &dtype));
  EXPECT_EQ(dtype_size(DType::bf16), 2u);
  EXPECT_EQ(dtype_size(DType::f8_e4m3), 1u);
}

TEST(DType, Bf16RoundsToNearestEven) {
  EXPECT_EQ(float_to_bf16(1.0f), 0x3f80);
  // 1 + 2^-8 is exactly halfway between bf16 1.0 and 1.0078125: ties to even (1.0).
  EXPECT_EQ(float_to_bf16(1.00390625f), 0x3f80);
  // 1 + 3*2^-8 is halfway between 1.0078125 (odd) and 1.015625 (even): rounds up.
  EXPECT_EQ(float_to_bf16(1.01171875f), 0x3f82);
  EXPECT_TRUE(std::isnan(bf16_to_float(float_to_bf16(NAN))));
  for (uint32_t bits = 0; bits < 0x10000; bits += 7) {
    const float value = bf16_to_float(uint16_t(bits));
    if (!std::isnan(value)) {
      EXPECT_EQ(float_to_bf16(value), bits);
    }
  }
}

TEST(DType, F16RoundTripsEveryFiniteValue) {
  for (uint32_t bits = 0; bits < 0x10000; ++bits) {
    const float value = f16_to_float(uint16_t(bits));
    if (std::isnan(value)) continue;
    EXPECT_EQ(float_to_f16(value), bits) << bits;
  }
  EXPECT_EQ(float_to_f16(65520.0f), 0x7c00);
  EXPECT_EQ(f16_to_float(0x0001), std::ldexp(1.0f, -24));
}

TEST(DType, Fp8E4m3Decodes) {
  EXPECT_EQ(fp8_e4m3_to_float(0x00), 0.0f);
  EXPECT_TRUE(std::signbit(fp8_e4m3_to_float(0x80)));
  EXPECT_EQ(fp8_e4m3_to_float(0x38), 1.0f);
  EXPECT_EQ(fp8_e4m3_to_float(0x7e), 448.0f);
  EXPECT_EQ(fp8_e4m3_to_float(0x01), std::ldexp(1.0f, -9));
  EXPECT_TRUE(std::isnan(fp8_e4m3_to_float(0x7f)));
  EXPECT_EQ(fp8_e4m3_to_float(0xfe), -448.0f);
}

}  // namespace moet
