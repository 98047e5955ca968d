// Element codecs for the small float types the block formats are built from: FP8 e4m3fn, FP4
// e2m1, BF16, F16 (parameterised minifloats), plus the UE8M0 power-of-two scale byte. Every
// rounding here is exact float64 round-to-nearest-even; "saturating" types clamp overflow and
// +-Inf to +-max (e4m3fn, e2m1), IEEE types (bf16, f16) overflow to +-Inf. NaN stays NaN where the
// type has one; callers that quantize blocks reject NaN before they get here.
#pragma once

#include <cstdint>

namespace moet {

struct MinifloatSpec {
  int exp_bits;
  int mant_bits;
  int bias;
  double max_finite;
  bool saturating;  // true: overflow clamps to +-max_finite; false: overflow gives +-Inf
};

inline constexpr MinifloatSpec kE4M3 = {4, 3, 7, 448.0, true};
inline constexpr MinifloatSpec kE2M1 = {2, 1, 1, 6.0, true};
inline constexpr MinifloatSpec kBF16 = {8, 7, 127, 0x1.fep127, false};
inline constexpr MinifloatSpec kF16 = {5, 10, 15, 65504.0, false};

// x rounded to the nearest representable value of `spec` (ties to even), sign of zero kept.
double minifloat_round(double x, const MinifloatSpec& spec);
// Bit pattern of an already representable value (sign | exponent | mantissa). NaN -> all ones.
uint32_t minifloat_encode(double representable, const MinifloatSpec& spec);
double minifloat_decode(uint32_t bits, const MinifloatSpec& spec);

// e4m3fn byte of x (round-to-nearest-even, saturating at +-448; NaN -> 0x7f | sign).
uint8_t e4m3_from_double(double x);
double e4m3_to_double(uint8_t bits);

// e2m1 nibble (sign bit 3, magnitude code bits 0-2) of x: round-to-nearest-even on the grid
// {0, .5, 1, 1.5, 2, 3, 4, 6}, saturating at 6; a value that rounds to zero keeps its sign.
inline uint8_t e2m1_from_double(double x) {
  const double a = x < 0 ? -x : x;
  const uint8_t magnitude = uint8_t((a > 0.25) + (a >= 0.75) + (a > 1.25) + (a >= 1.75) +
                                    (a > 2.5) + (a >= 3.5) + (a > 5.0));
  return uint8_t((__builtin_signbit(x) ? 8 : 0) | magnitude);
}
inline constexpr double kE2M1Values[8] = {0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0};
inline double e2m1_to_double(uint8_t nibble) {
  const double m = kE2M1Values[nibble & 7];
  return (nibble & 8) ? -m : m;
}

// UE8M0 scale byte: 2^(byte - 127); byte 255 is NaN and never produced.
inline uint8_t ue8m0_from_exponent(int exponent) { return uint8_t(exponent + 127); }
inline int ue8m0_exponent(uint8_t byte) { return int(byte) - 127; }

}  // namespace moet
