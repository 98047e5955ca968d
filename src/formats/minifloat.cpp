// Minifloat rounding/encoding (see minifloat.h). All arithmetic is on doubles whose scaling by
// powers of two is exact, so the only rounding step is the explicit nearbyint (ties to even).
#include "formats/minifloat.h"

#include <algorithm>
#include <cmath>

namespace moet {

double minifloat_round(double x, const MinifloatSpec& spec) {
  if (x == 0 || std::isnan(x)) return x;
  const double a = std::fabs(x);
  double r;
  if (std::isinf(a)) {
    r = spec.saturating ? spec.max_finite : a;
  } else {
    const int min_exp = 1 - spec.bias;
    const int e = std::max(std::ilogb(a), min_exp);
    r = std::ldexp(std::nearbyint(std::ldexp(a, spec.mant_bits - e)), e - spec.mant_bits);
    if (r > spec.max_finite) r = spec.saturating ? spec.max_finite : INFINITY;
  }
  return std::copysign(r, x);
}

uint32_t minifloat_encode(double value, const MinifloatSpec& spec) {
  const uint32_t sign = std::signbit(value) ? 1u << (spec.exp_bits + spec.mant_bits) : 0u;
  const uint32_t all_exp = (1u << spec.exp_bits) - 1;
  if (std::isnan(value)) return sign | (all_exp << spec.mant_bits) | ((1u << spec.mant_bits) - 1);
  const double a = std::fabs(value);
  if (a == 0) return sign;
  if (std::isinf(a)) return sign | (all_exp << spec.mant_bits);
  const int min_exp = 1 - spec.bias;
  const int e = std::ilogb(a);
  if (e < min_exp) return sign | uint32_t(std::ldexp(a, spec.mant_bits - min_exp));
  const uint32_t mantissa = uint32_t(std::ldexp(a, spec.mant_bits - e)) - (1u << spec.mant_bits);
  return sign | (uint32_t(e + spec.bias) << spec.mant_bits) | mantissa;
}

double minifloat_decode(uint32_t bits, const MinifloatSpec& spec) {
  const uint32_t mant_mask = (1u << spec.mant_bits) - 1;
  const uint32_t exp_field = (bits >> spec.mant_bits) & ((1u << spec.exp_bits) - 1);
  const uint32_t mantissa = bits & mant_mask;
  const bool negative = (bits >> (spec.exp_bits + spec.mant_bits)) & 1u;
  double m;
  if (exp_field == 0) {
    m = std::ldexp(double(mantissa), 1 - spec.bias - spec.mant_bits);
  } else {
    m = std::ldexp(double(mantissa | (1u << spec.mant_bits)),
                   int(exp_field) - spec.bias - spec.mant_bits);
    if (m > spec.max_finite) m = (spec.saturating || mantissa) ? NAN : INFINITY;
  }
  return negative ? -m : m;
}

uint8_t e4m3_from_double(double x) { return uint8_t(minifloat_encode(minifloat_round(x, kE4M3), kE4M3)); }

double e4m3_to_double(uint8_t bits) { return minifloat_decode(bits, kE4M3); }

}  // namespace moet
