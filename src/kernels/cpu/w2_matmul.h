// Expert matmuls over the stored block-of-32 formats (formats/mx_block.h, formats/w2k.h): y[t, n] =
// sum_k x[t, k] * W[n, k] with W [N, K] as W2 (2-bit codes, levels {-4,-1,1,4}) or MXFP4 (e2m1
// nibbles), each block of 32 along K scaled by its UE8M0 byte, or W2K (four E8 codewords per
// block, scaled by its UE5M3 byte). FP32 accumulation: per block the level products are summed,
// then multiplied by the exact scale (power-of-two; W2K's has 4 significant bits). Parallel over output
// columns, each y element computed by one thread in a fixed order (results independent of the
// thread count); AVX2 versions where available (rounding differs slightly from the scalar ones).
// At the avx512 level matmul_w2 runs two columns per 512-bit instruction with the AVX2 level's
// bits (kernels/cpu/w2_rows.h); the single-row dots and the FP4 / W2K products run their AVX2
// versions there. K must be a multiple of 32.
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
void matmul_w2k(const float* x, int64_t rows, int64_t k, const uint8_t* codes, const uint8_t* scales,
                int64_t n, float* y, ThreadPool& pool, CpuIsa isa);

// One row: codes and scales of a single weight row (K/4 or K/2 bytes, K/32 scales).
float dot_w2(const float* x, const uint8_t* codes, const uint8_t* scales, int64_t k, CpuIsa isa);
float dot_fp4(const float* x, const uint8_t* codes, const uint8_t* scales, int64_t k, CpuIsa isa);
float dot_w2k(const float* x, const uint8_t* codes, const uint8_t* scales, int64_t k, CpuIsa isa);

// 2^(byte - 127) as float (byte 0 is the subnormal 2^-127).
inline float ue8m0_to_float(uint8_t byte) {
  return std::bit_cast<float>(byte == 0 ? 0x00400000u : uint32_t(byte) << 23);
}

// W2K decoding tables (built once from formats/w2k.h): per grid index the 8 magnitudes h + 1/2
// as floats and the parity the count of negative signs must have.
struct W2kTables {
  float magnitude[256][8];
  uint8_t parity[256];
  uint8_t odd[128];  // popcount parity of seven sign bits (no POPCNT needed in the AVX2 build)
};
const W2kTables& w2k_tables();

// The UE5M3 scale byte of W2K as float ((1 + m/8) 2^(e - 24), e = byte >> 3; e = 0: m 2^-26).
inline float w2k_scale_to_float(uint8_t byte) {
  return byte >= 8 ? std::bit_cast<float>((uint32_t(byte >> 3) + 103u) << 23 | uint32_t(byte & 7) << 20)
                   : float(byte) * 0x1p-26f;
}

// One W2K codeword's eight sign bits (bit j: weight j negative; bit 7 from the parity rule).
inline uint32_t w2k_signs(uint32_t code, const W2kTables& tables) {
  const uint32_t signs = (code >> 8) & 0x7f;
  return signs | uint32_t(tables.odd[signs] ^ tables.parity[code & 0xff]) << 7;
}

namespace scalar {
float dot_w2(const float* x, const uint8_t* codes, const uint8_t* scales, int64_t k);
float dot_fp4(const float* x, const uint8_t* codes, const uint8_t* scales, int64_t k);
float dot_w2k(const float* x, const uint8_t* codes, const uint8_t* scales, int64_t k);
}  // namespace scalar

namespace avx2 {
float dot_w2(const float* x, const uint8_t* codes, const uint8_t* scales, int64_t k);
float dot_fp4(const float* x, const uint8_t* codes, const uint8_t* scales, int64_t k);
float dot_w2k(const float* x, const uint8_t* codes, const uint8_t* scales, int64_t k);
}  // namespace avx2

}  // namespace moet
