// Embedding, RMSNorm, SiLU-and-mul, residual add and the BF16 split (see elementwise.h).
#include "kernels/cpu/elementwise.h"

#include "core/dtype.h"

#include <algorithm>
#include <cmath>

namespace moet {

void embedding(const int32_t* ids, int64_t rows, const void* table, bool table_bf16, int64_t first_row,
               int64_t table_rows, int64_t dim, float* out) {
  for (int64_t t = 0; t < rows; ++t) {
    const int64_t row = int64_t(ids[t]) - first_row;
    float* o = out + t * dim;
    if (row < 0 || row >= table_rows) {
      std::fill(o, o + dim, 0.0f);
    } else if (table_bf16) {
      const uint16_t* values = static_cast<const uint16_t*>(table) + row * dim;
      for (int64_t i = 0; i < dim; ++i) o[i] = bf16_to_float(values[i]);
    } else {
      std::copy_n(static_cast<const float*>(table) + row * dim, dim, o);
    }
  }
}

void rmsnorm(const float* x, int64_t rows, int64_t dim, int64_t stride, const float* weight,
             float eps, float* out, int64_t out_stride, ThreadPool& pool) {
  pool.parallel_for(size_t(rows), [&](size_t begin, size_t end) {
    for (size_t t = begin; t < end; ++t) {
      const float* in = x + int64_t(t) * stride;
      float* o = out + int64_t(t) * out_stride;
      double sum = 0.0;
      for (int64_t i = 0; i < dim; ++i) sum += double(in[i]) * double(in[i]);
      const float inv = 1.0f / std::sqrt(float(sum / double(dim)) + eps);
      for (int64_t i = 0; i < dim; ++i) o[i] = weight[i] * (in[i] * inv);
    }
  }, 64);
}

void silu_mul(const float* gate_up, int64_t rows, int64_t inner, float* out, float limit) {
  for (int64_t t = 0; t < rows; ++t) {
    const float* gate = gate_up + t * 2 * inner;
    const float* up = gate + inner;
    for (int64_t i = 0; i < inner; ++i) {
      const float g = limit > 0.0f ? std::min(gate[i], limit) : gate[i];
      const float u = limit > 0.0f ? std::clamp(up[i], -limit, limit) : up[i];
      out[t * inner + i] = g / (1.0f + std::exp(-g)) * u;
    }
  }
}

void layernorm(const float* x, int64_t rows, int64_t dim, const float* weight, const float* bias, float eps,
               float* out) {
  for (int64_t t = 0; t < rows; ++t) {
    const float* in = x + t * dim;
    float* o = out + t * dim;
    double sum = 0.0;
    for (int64_t i = 0; i < dim; ++i) sum += double(in[i]);
    const float mean = float(sum / double(dim));
    double var = 0.0;
    for (int64_t i = 0; i < dim; ++i) var += double(in[i] - mean) * double(in[i] - mean);
    const float inv = 1.0f / std::sqrt(float(var / double(dim)) + eps);
    for (int64_t i = 0; i < dim; ++i) o[i] = (in[i] - mean) * inv * weight[i] + bias[i];
  }
}

void add_inplace(float* y, const float* x, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] += x[i];
}

void split_bf16(const float* x, int64_t n, uint16_t* hi, uint16_t* lo) {
  for (int64_t i = 0; i < n; ++i) {
    hi[i] = float_to_bf16(x[i]);
    lo[i] = float_to_bf16(x[i] - bf16_to_float(hi[i]));
  }
}

}  // namespace moet
