// In-place rotary embedding (see rope.h).
#include "kernels/cpu/rope.h"

#include <algorithm>
#include <cmath>
#include <vector>

namespace moet {
namespace {

// Rotates one head's 2 * pairs values by the precomputed cos/sin of each pair.
void rotate_head(const RopeTable& table, float* v, const float* cos_v, const float* sin_v, int64_t pairs,
                 float* tmp) {
  for (int64_t i = 0; i < pairs; ++i) {
    const float a = table.interleaved ? v[2 * i] : v[i];
    const float b = table.interleaved ? v[2 * i + 1] : v[i + pairs];
    const float ra = a * cos_v[i] - b * sin_v[i], rb = b * cos_v[i] + a * sin_v[i];
    if (table.interleaved && table.pairs_in_place) {
      v[2 * i] = ra;
      v[2 * i + 1] = rb;
    } else {
      tmp[i] = ra;
      tmp[i + pairs] = rb;
    }
  }
  if (!(table.interleaved && table.pairs_in_place)) std::copy(tmp, tmp + 2 * pairs, v);
}

void angles(const RopeTable& table, float position, bool inverse, float* cos_v, float* sin_v) {
  for (size_t i = 0; i < table.inv_freq.size(); ++i) {
    const float angle = position * table.inv_freq[i];
    cos_v[i] = std::cos(angle) * table.scale;
    sin_v[i] = (inverse ? -std::sin(angle) : std::sin(angle)) * table.scale;
  }
}

}  // namespace

void rope_rotate(const RopeTable& table, float* v, float position, bool inverse) {
  const int64_t pairs = int64_t(table.inv_freq.size());
  std::vector<float> buf(size_t(4 * pairs));
  angles(table, position, inverse, buf.data(), buf.data() + pairs);
  rotate_head(table, v, buf.data(), buf.data() + pairs, pairs, buf.data() + 2 * pairs);
}

void rope_apply(const RopeTable& table, float* x, int64_t rows, int64_t heads, int64_t row_stride,
                int64_t head_stride, int64_t offset, const int32_t* positions, bool inverse) {
  const int64_t pairs = int64_t(table.inv_freq.size());
  std::vector<float> buf(size_t(4 * pairs));
  float *cos_v = buf.data(), *sin_v = cos_v + pairs, *tmp = sin_v + pairs;
  for (int64_t t = 0; t < rows; ++t) {
    angles(table, float(positions[t]), inverse, cos_v, sin_v);
    for (int64_t h = 0; h < heads; ++h)
      rotate_head(table, x + t * row_stride + h * head_stride + offset, cos_v, sin_v, pairs, tmp);
  }
}

}  // namespace moet
