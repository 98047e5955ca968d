// The split of an FP32 value into two BF16 pieces on the device, hi = bf16(v) and lo = bf16(v - hi)
// with core/dtype.h's rounding (to nearest even, NaN kept quiet): the bits of kernels/cpu's
// split_bf16 for every finite v (v - hi is exact in FP32). Shared by the activations' split
// (elementwise.h) and the FP8-block weights' (fp8_split.h) that feed the tensor-core GEMMs.
#pragma once

#include <cstdint>

namespace moet::cuda {

// core/dtype.h's float_to_bf16.
__device__ __forceinline__ uint16_t to_bf16(float value) {
  uint32_t bits = __float_as_uint(value);
  if ((bits & 0x7fffffffu) > 0x7f800000u) return uint16_t((bits >> 16) | 0x40);
  bits += 0x7fffu + ((bits >> 16) & 1u);
  return uint16_t(bits >> 16);
}

__device__ __forceinline__ void split_bf16_value(float v, uint16_t& hi, uint16_t& lo) {
  hi = to_bf16(v);
  lo = to_bf16(v - __uint_as_float(uint32_t(hi) << 16));
}

}  // namespace moet::cuda
