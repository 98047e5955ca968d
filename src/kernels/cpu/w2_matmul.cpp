// Portable W2 / FP4 dot products, AVX2 dispatch and the column-parallel drivers (w2_matmul.h).
#include "kernels/cpu/w2_matmul.h"

#include "kernels/cpu/w2_rows.h"

#include "formats/minifloat.h"
#include "formats/mx_block.h"
#include "core/cpu_isa.h"

#include <algorithm>
#include <cmath>

namespace moet {
namespace {

// Per block of 32: sum of level(code) * x, then times the block scale.
template <int kBits, typename Level>
float dot_blocks(const float* x, const uint8_t* codes, const uint8_t* scales, int64_t k, Level level) {
  constexpr int per_byte = 8 / kBits;
  constexpr uint8_t mask = (1u << kBits) - 1;
  float total = 0;
  for (int64_t b = 0; b < k / kMxBlock; ++b) {
    float acc[4] = {0, 0, 0, 0};
    for (int64_t i = b * kMxBlock; i < (b + 1) * kMxBlock; ++i) {
      const uint8_t code = (codes[i / per_byte] >> (kBits * (i % per_byte))) & mask;
      acc[i & 3] += level(code) * x[i];
    }
    total += ((acc[0] + acc[1]) + (acc[2] + acc[3])) * ue8m0_to_float(scales[b]);
  }
  return total;
}

constexpr float kFp4Levels[16] = {0, 0.5f, 1, 1.5f, 2, 3, 4, 6, -0.0f, -0.5f, -1, -1.5f, -2, -3, -4, -6};

template <typename Dot>
void matmul_columns(const float* x, int64_t rows, int64_t k, int64_t row_code_bytes, const uint8_t* codes,
                    const uint8_t* scales, int64_t n, float* y, ThreadPool& pool, Dot dot) {
  const size_t grain = size_t(std::max<int64_t>(1, 16384 / std::max<int64_t>(1, k * rows)));
  pool.parallel_for(size_t(n), [&](size_t begin, size_t end) {
    for (size_t col = begin; col < end; ++col) {
      const uint8_t* c = codes + int64_t(col) * row_code_bytes;
      const uint8_t* s = scales + int64_t(col) * (k / kMxBlock);
      for (int64_t t = 0; t < rows; ++t) y[t * n + int64_t(col)] = dot(x + t * k, c, s, k);
    }
  }, grain);
}

}  // namespace

float scalar::dot_w2(const float* x, const uint8_t* codes, const uint8_t* scales, int64_t k) {
  return dot_blocks<2>(x, codes, scales, k, [](uint8_t c) { return kW2Levels[c]; });
}

float scalar::dot_fp4(const float* x, const uint8_t* codes, const uint8_t* scales, int64_t k) {
  return dot_blocks<4>(x, codes, scales, k, [](uint8_t c) { return kFp4Levels[c]; });
}

float dot_w2(const float* x, const uint8_t* codes, const uint8_t* scales, int64_t k, CpuIsa isa) {
  return cpu_isa_has_avx2(isa) ? avx2::dot_w2(x, codes, scales, k) : scalar::dot_w2(x, codes, scales, k);
}

float dot_fp4(const float* x, const uint8_t* codes, const uint8_t* scales, int64_t k, CpuIsa isa) {
  return cpu_isa_has_avx2(isa) ? avx2::dot_fp4(x, codes, scales, k) : scalar::dot_fp4(x, codes, scales, k);
}

float dot_w2k(const float* x, const uint8_t* codes, const uint8_t* scales, int64_t k, CpuIsa isa) {
  return cpu_isa_has_avx2(isa) ? avx2::dot_w2k(x, codes, scales, k) : scalar::dot_w2k(x, codes, scales, k);
}

void matmul_w2(const float* x, int64_t rows, int64_t k, const uint8_t* codes, const uint8_t* scales,
               int64_t n, float* y, ThreadPool& pool, CpuIsa isa) {
  if (isa == CpuIsa::avx512) return matmul_w2_rows(x, rows, k, codes, scales, n, y, pool, isa);  // column pairs
  matmul_columns(x, rows, k, k / 4, codes, scales, n, y, pool, [isa](const float* a, const uint8_t* c, const uint8_t* s,
                                                                     int64_t len) { return dot_w2(a, c, s, len, isa); });
}

void matmul_fp4(const float* x, int64_t rows, int64_t k, const uint8_t* codes, const uint8_t* scales,
                int64_t n, float* y, ThreadPool& pool, CpuIsa isa) {
  matmul_columns(x, rows, k, k / 2, codes, scales, n, y, pool, [isa](const float* a, const uint8_t* c, const uint8_t* s,
                                                                     int64_t len) { return dot_fp4(a, c, s, len, isa); });
}

void matmul_w2k(const float* x, int64_t rows, int64_t k, const uint8_t* codes, const uint8_t* scales,
                int64_t n, float* y, ThreadPool& pool, CpuIsa isa) {
  const auto dot = [isa](const float* a, const uint8_t* c, const uint8_t* s, int64_t len) {
    return dot_w2k(a, c, s, len, isa);
  };
  matmul_columns(x, rows, k, k / 4, codes, scales, n, y, pool, dot);
}

}  // namespace moet
