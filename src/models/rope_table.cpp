// Rope frequency tables (default / linear / yarn), following transformers' rope utilities:
// frequencies in float32 as torch computes them, yarn's ramp between the beta_fast/beta_slow
// correction dimensions, and its attention factor from mscale / mscale_all_dim.
#include "models/rope_table.h"

#include "core/error.h"

#include <algorithm>
#include <cmath>

namespace moet {
namespace {

double yarn_mscale(double factor, double mscale) {
  return factor <= 1.0 ? 1.0 : 0.1 * mscale * std::log(factor) + 1.0;
}

void yarn_adjust(const RopeConfig& rope, RopeTable& table) {
  const double dim = double(rope.dim);
  const double factor = rope.factor;
  auto correction_dim = [&](double rotations) {
    return dim * std::log(double(rope.original_max_position_embeddings) / (rotations * 2 * M_PI)) /
           (2 * std::log(rope.theta));
  };
  double low = correction_dim(rope.beta_fast);
  double high = correction_dim(rope.beta_slow);
  if (rope.truncate) {
    low = std::floor(low);
    high = std::ceil(high);
  }
  low = std::max(low, 0.0);
  high = std::min(high, dim - 1);
  if (low == high) high += 0.001;
  for (size_t i = 0; i < table.inv_freq.size(); ++i) {
    // transformers computes these in float32; do the same so frequencies match bit for bit.
    const float pos_freq = std::pow(float(rope.theta), float(2 * i) / float(rope.dim));
    const float extrapolation = 1.0f / pos_freq;
    const float interpolation = 1.0f / (float(factor) * pos_freq);
    const float ramp = std::clamp(float((double(i) - low) / (high - low)), 0.0f, 1.0f);
    const float extrapolation_factor = 1.0f - ramp;
    table.inv_freq[i] =
        interpolation * (1.0f - extrapolation_factor) + extrapolation * extrapolation_factor;
  }
  double attention = rope.attention_factor;
  if (attention == 0.0) {
    attention = (rope.mscale != 0.0 && rope.mscale_all_dim != 0.0)
                    ? yarn_mscale(factor, rope.mscale) / yarn_mscale(factor, rope.mscale_all_dim)
                    : yarn_mscale(factor, 1.0);
  }
  table.scale = float(attention);
}

}  // namespace

RopeTable rope_table_build(const RopeConfig& rope) {
  MOET_CHECK(rope.dim > 0 && rope.dim % 2 == 0, "rope dimension {} must be positive and even", rope.dim);
  RopeTable table;
  table.interleaved = rope.interleaved;
  const int64_t pairs = rope.dim / 2;
  for (int64_t i = 0; i < pairs; ++i) {
    const float exponent = float(2 * i) / float(rope.dim);
    table.inv_freq.push_back(1.0f / std::pow(float(rope.theta), exponent));
  }
  if (rope.type == "linear") {
    for (float& f : table.inv_freq) f = float(f / rope.factor);
  } else if (rope.type == "yarn") {
    yarn_adjust(rope, table);
  }
  return table;
}

}  // namespace moet
