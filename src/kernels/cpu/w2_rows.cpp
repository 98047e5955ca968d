// The column-parallel drivers of the shared-decoding W2 products (see w2_rows.h): one column at a
// time on the portable and avx2 levels, a pair of columns at a time on avx512 (a pair never spans
// two threads' ranges, and an odd last column is paired with itself, so the results do not depend
// on the thread count or on n's parity).
#include "kernels/cpu/w2_rows.h"

#include "kernels/cpu/w2_matmul.h"

#include <algorithm>

namespace moet {
namespace {

size_t grain_columns(int64_t k, int64_t rows) {
  return size_t(std::max<int64_t>(1, 16384 / std::max<int64_t>(1, k * rows)));
}

void matmul_w2_column_pairs(const float* x, int64_t rows, int64_t k, const uint8_t* codes, const uint8_t* scales,
                            int64_t n, float* y, ThreadPool& pool) {
  const int64_t row_code_bytes = k / 4, row_scales = k / 32;
  const size_t grain = std::max<size_t>(1, grain_columns(k, rows) / 2);
  pool.parallel_for(size_t((n + 1) / 2), [&](size_t begin, size_t end) {
    float out[2 * kW2RowsPerPass];
    for (int64_t col = 2 * int64_t(begin); col < std::min(n, 2 * int64_t(end)); col += 2) {
      const int64_t second = std::min(col + 1, n - 1);
      const W2ColumnPair w{{codes + col * row_code_bytes, codes + second * row_code_bytes},
                           {scales + col * row_scales, scales + second * row_scales}};
      for (int64_t t0 = 0; t0 < rows; t0 += kW2RowsPerPass) {
        const int64_t m = std::min(kW2RowsPerPass, rows - t0);
        avx512::dot_w2_rows_pair(x + t0 * k, m, w, k, out);
        for (int64_t r = 0; r < m; ++r) {
          y[(t0 + r) * n + col] = out[2 * r];
          if (second != col) y[(t0 + r) * n + second] = out[2 * r + 1];
        }
      }
    }
  }, grain);
}

}  // namespace

void matmul_w2_rows(const float* x, int64_t rows, int64_t k, const uint8_t* codes, const uint8_t* scales, int64_t n,
                    float* y, ThreadPool& pool, CpuIsa isa) {
  if (isa == CpuIsa::avx512) return matmul_w2_column_pairs(x, rows, k, codes, scales, n, y, pool);
  const int64_t row_code_bytes = k / 4, row_scales = k / 32;
  pool.parallel_for(size_t(n), [&](size_t begin, size_t end) {
    float out[kW2RowsPerPass];
    for (size_t col = begin; col < end; ++col) {
      const uint8_t* c = codes + int64_t(col) * row_code_bytes;
      const uint8_t* s = scales + int64_t(col) * row_scales;
      for (int64_t t0 = 0; t0 < rows; t0 += kW2RowsPerPass) {
        const int64_t m = std::min(kW2RowsPerPass, rows - t0);
        if (isa == CpuIsa::avx2 && m > 1) {
          avx2::dot_w2_rows(x + t0 * k, m, c, s, k, out);
        } else {
          for (int64_t r = 0; r < m; ++r) out[r] = dot_w2(x + (t0 + r) * k, c, s, k, isa);
        }
        for (int64_t r = 0; r < m; ++r) y[(t0 + r) * n + int64_t(col)] = out[r];
      }
    }
  }, grain_columns(k, rows));
}

}  // namespace moet
