// In-place rotary embedding (see rope.h).
#include "kernels/cpu/rope.h"

#include <algorithm>
#include <cmath>

namespace moet {
void rope_apply(const RopeTable& table, float* x, int64_t rows, int64_t heads, int64_t row_stride,
                int64_t head_stride, int64_t offset, const int32_t* positions) {
  const int64_t pairs = int64_t(table.inv_freq.size());
  std::vector<float> cos_v(static_cast<size_t>(pairs)), sin_v(static_cast<size_t>(pairs)), tmp(static_cast<size_t>(2 * pairs));
  for (int64_t t = 0; t < rows; ++t) {
    const float pos = float(positions[t]);
    for (int64_t i = 0; i < pairs; ++i) {
      const float angle = pos * table.inv_freq[size_t(i)];
      cos_v[size_t(i)] = std::cos(angle) * table.scale;
      sin_v[size_t(i)] = std::sin(angle) * table.scale;
    }
    for (int64_t h = 0; h < heads; ++h) {
      float* v = x + t * row_stride + h * head_stride + offset;
      for (int64_t i = 0; i < pairs; ++i) {
        const float a = table.interleaved ? v[2 * i] : v[i];
        const float b = table.interleaved ? v[2 * i + 1] : v[i + pairs];
        tmp[size_t(i)] = a * cos_v[size_t(i)] - b * sin_v[size_t(i)];
        tmp[size_t(i + pairs)] = b * cos_v[size_t(i)] + a * sin_v[size_t(i)];
      }
      std::copy(tmp.begin(), tmp.end(), v);
    }
  }
}

}  // namespace moet
