// Expert matmuls over the stored block-of-32 formats (formats/mx_block.h): y[t, n] =
// sum_k x[t, k] * W[n, k] with W [N, K] as W2 (2-bit codes, levels {-4,-1,1,4}) or MXFP4 (e2m1
// nibbles), each block of 32 along K scaled by its UE8M0 byte. FP32 accumulation: per block the
// level products are summed, then multiplied by the exact power-of-two scale. Parallel over output
// columns, each y element computed by one thread in a fixed order (results independent of the
// thread count); AVX2 versions where available (rounding differs slightly from the scalar ones).
// K must be a multiple of 32.
#pragma once

#include "core/thread_pool.h"
#include "core/cpu_isa.h"

#include <bit>
#include <cstdint>

namespace moet {

void matmul_w2(const float* x, int64_t rows, int64_t k, const uint8_t* codes, const uint8_t* scales,
               int64_t n, float* y, ThreadPool& pool, CpuIsa isa);
void matmul_fp4(const float* x, int64_t rows, int64_t k, const uint8_t* codes, const uint8_t* scales,
                int64_t n, float* y, ThreadPool& pool, CpuIsa isa);

// One row: codes and scales of a single weight row (K/4 or K/2 bytes, K/32 scales).
float dot_w2(const float* x, const uint8_t* codes, const uint8_t* scales, int64_t k, CpuIsa isa);
float dot_fp4(const float* x, const uint8_t* codes, const uint8_t* scales, int64_t k, CpuIsa isa);

// 2^(byte - 127) as float (byte 0 is the subnormal 2^-127).
inline float ue8m0_to_float(uint8_t byte) {
  return std::bit_cast<float>(byte == 0 ? 0x00400000u : uint32_t(byte) << 23);
}

namespace scalar {
float dot_w2(const float* x, const uint8_t* codes, const uint8_t* scales, int64_t k);
float dot_fp4(const float* x, const uint8_t* codes, const uint8_t* scales, int64_t k);
}  // namespace scalar

namespace avx2 {
float dot_w2(const float* x, const uint8_t* codes, const uint8_t* scales, int64_t k);
float dot_fp4(const float* x, const uint8_t* codes, const uint8_t* scales, int64_t k);
}  // namespace avx2

}  // namespace moet
