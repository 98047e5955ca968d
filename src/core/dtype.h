// Element types moet stores and their scalar conversions. Sub-byte and block-scaled formats
// (e2m1, W2, MXFP4, NVFP4) are described in formats/; here a tensor of them is a U8 byte plane.
// Conversions are exact where the target can represent the value; float->bf16/f16 round to
// nearest even. fp8 e4m3 here is the "fn" variant (no infinities, 0x7f/0xff are NaN).
#pragma once

#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <string_view>

namespace moet {

// f8_e8m0: UE8M0 scale bytes (value 2^(bits - 127)), as DeepSeek-V4 checkpoints store their MX and FP8 scales.
enum class DType : uint8_t { f32, f16, bf16, f8_e4m3, f64, i8, u8, i16, i32, i64, u16, u32, u64, boolean, f8_e8m0 };

// Size of one element in bytes.
size_t dtype_size(DType dtype);
// Name as safetensors writes it ("BF16", "F8_E4M3", ...).
std::string_view dtype_name(DType dtype);
// Parses a safetensors dtype string; returns false for an unknown one.
bool dtype_parse(std::string_view name, DType* out);

inline float bf16_to_float(uint16_t bits) { return std::bit_cast<float>(uint32_t(bits) << 16); }

inline uint16_t float_to_bf16(float value) {
  uint32_t bits = std::bit_cast<uint32_t>(value);
  if ((bits & 0x7fffffffu) > 0x7f800000u) return uint16_t((bits >> 16) | 0x40);  // quiet NaN
  bits += 0x7fffu + ((bits >> 16) & 1u);
  return uint16_t(bits >> 16);
}

float f16_to_float(uint16_t bits);
uint16_t float_to_f16(float value);
float fp8_e4m3_to_float(uint8_t bits);

}  // namespace moet
