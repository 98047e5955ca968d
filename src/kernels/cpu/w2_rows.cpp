// The column-parallel driver of the shared-decoding W2 products (see w2_rows.h).
#include "kernels/cpu/w2_rows.h"

#include "kernels/cpu/w2_matmul.h"

#include <algorithm>

namespace moet {

void matmul_w2_rows(const float* x, int64_t rows, int64_t k, const uint8_t* codes, const uint8_t* scales, int64_t n,
                    float* y, ThreadPool& pool, CpuIsa isa) {
  const int64_t row_code_bytes = k / 4, row_scales = k / 32;
  const size_t grain = size_t(std::max<int64_t>(1, 16384 / std::max<int64_t>(1, k * rows)));
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
  }, grain);
}

}  // namespace moet
