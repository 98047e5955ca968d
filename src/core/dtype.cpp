// Element-type table and the scalar conversions declared in dtype.h.
#include "core/dtype.h"

#include <array>
#include <cstring>

namespace moet {
namespace {

struct DTypeInfo {
  DType dtype;
  std::string_view name;
  size_t size;
};

constexpr std::array<DTypeInfo, 15> kDTypes = {{
    {DType::f32, "F32", 4},       {DType::f16, "F16", 2},     {DType::bf16, "BF16", 2},
    {DType::f8_e4m3, "F8_E4M3", 1}, {DType::f64, "F64", 8},   {DType::i8, "I8", 1},
    {DType::u8, "U8", 1},         {DType::i16, "I16", 2},     {DType::i32, "I32", 4},
    {DType::i64, "I64", 8},       {DType::u16, "U16", 2},     {DType::u32, "U32", 4},
    {DType::u64, "U64", 8},       {DType::boolean, "BOOL", 1}, {DType::f8_e8m0, "F8_E8M0", 1},
}};

const DTypeInfo& info(DType dtype) {
  for (const auto& entry : kDTypes)
    if (entry.dtype == dtype) return entry;
  return kDTypes[0];
}

}  // namespace

size_t dtype_size(DType dtype) { return info(dtype).size; }
std::string_view dtype_name(DType dtype) { return info(dtype).name; }

bool dtype_parse(std::string_view name, DType* out) {
  for (const auto& entry : kDTypes) {
    if (entry.name == name) {
      *out = entry.dtype;
      return true;
    }
  }
  return false;
}

float f16_to_float(uint16_t bits) {
  const uint32_t sign = uint32_t(bits & 0x8000u) << 16;
  const uint32_t exponent = (bits >> 10) & 0x1fu;
  const uint32_t mantissa = bits & 0x3ffu;
  if (exponent == 0) {
    const float magnitude = std::ldexp(float(mantissa), -24);
    return sign ? -magnitude : magnitude;
  }
  if (exponent == 31) return std::bit_cast<float>(sign | 0x7f800000u | (mantissa << 13));
  return std::bit_cast<float>(sign | ((exponent + 112) << 23) | (mantissa << 13));
}

uint16_t float_to_f16(float value) {
  const uint32_t bits = std::bit_cast<uint32_t>(value);
  const uint16_t sign = uint16_t((bits >> 16) & 0x8000u);
  const float magnitude = std::fabs(value);
  if (std::isnan(value)) return sign | 0x7e00u;
  if (magnitude >= 65520.0f) return sign | 0x7c00u;  // rounds to infinity
  if (magnitude < 6.103515625e-05f) {                 // subnormal: multiples of 2^-24
    return sign | uint16_t(std::nearbyint(magnitude * 16777216.0f));
  }
  uint32_t rounded = (bits & 0x7fffffffu) + 0xfffu + ((bits >> 13) & 1u);
  return sign | uint16_t((rounded >> 13) - (112u << 10));
}

float fp8_e4m3_to_float(uint8_t bits) {
  const bool negative = bits & 0x80u;
  const uint32_t exponent = (bits >> 3) & 0xfu;
  const uint32_t mantissa = bits & 0x7u;
  float magnitude;
  if (exponent == 0xf && mantissa == 0x7) {
    magnitude = NAN;
  } else if (exponent == 0) {
    magnitude = std::ldexp(float(mantissa), -9);
  } else {
    magnitude = std::ldexp(float(8 + mantissa), int(exponent) - 10);
  }
  return negative ? -magnitude : magnitude;
}

}  // namespace moet
