// FP8-block matmul on the CPU (see fp8_matmul.h): row decode through a lookup table, then the
// F32 dot products of matmul.h; the decoded rows' BF16 split.
#include "kernels/cpu/fp8_matmul.h"

#include "core/dtype.h"
#include "kernels/cpu/elementwise.h"
#include "kernels/cpu/matmul.h"

#include <algorithm>
#include <array>
#include <vector>

namespace moet {
namespace {

constexpr int64_t kBlock = 128;  // columns (and rows) of one scale

const std::array<float, 256>& e4m3_table() {
  static const std::array<float, 256> table = [] {
    std::array<float, 256> t{};
    for (int code = 0; code < 256; ++code) t[size_t(code)] = fp8_e4m3_to_float(uint8_t(code));
    return t;
  }();
  return table;
}

}  // namespace

void fp8_block_decode_row(const uint8_t* codes, const float* scales, int64_t row, int64_t k, float* out) {
  const std::array<float, 256>& table = e4m3_table();
  const uint8_t* c = codes + row * k;
  const float* s = scales + (row / kBlock) * ((k + kBlock - 1) / kBlock);
  for (int64_t b0 = 0; b0 < k; b0 += kBlock) {
    const float scale = s[b0 / kBlock];
    for (int64_t i = b0; i < std::min(k, b0 + kBlock); ++i) out[i] = table[c[i]] * scale;
  }
}

void fp8_block_split_bf16(const uint8_t* codes, const float* scales, int64_t k, int64_t row_begin, int64_t rows,
                          uint16_t* hi, uint16_t* lo) {
  std::vector<float> w(static_cast<size_t>(k));
  for (int64_t r = 0; r < rows; ++r) {
    fp8_block_decode_row(codes, scales, row_begin + r, k, w.data());
    split_bf16(w.data(), k, hi + r * k, lo + r * k);
  }
}

void matmul_fp8_block(const float* x, int64_t rows, int64_t k, const uint8_t* codes, const float* scales,
                      int64_t n, const float* bias, float* y, ThreadPool& pool, CpuIsa isa) {
  const size_t grain = size_t(std::max<int64_t>(1, 16384 / std::max<int64_t>(1, k * rows)));
  pool.parallel_for(size_t(n), [&](size_t begin, size_t end) {
    std::vector<float> w(static_cast<size_t>(k));
    for (size_t col = begin; col < end; ++col) {
      fp8_block_decode_row(codes, scales, int64_t(col), k, w.data());
      const float b = bias ? bias[col] : 0.0f;
      for (int64_t t = 0; t < rows; ++t) y[t * n + int64_t(col)] = dot_f32(x + t * k, w.data(), k, isa) + b;
    }
  }, grain);
}

}  // namespace moet
