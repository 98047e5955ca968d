// Portable dot products, dispatch to AVX2, and the column-parallel matmul drivers (matmul.h).
#include "kernels/cpu/matmul.h"

#include "core/dtype.h"
#include "core/cpu_isa.h"

namespace moet {
namespace {

// Portable version: 8 interleaved partial sums (rounding differs slightly from AVX2).
template <typename Load>
float dot_scalar(const float* x, int64_t k, Load load) {
  float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  int64_t i = 0;
  for (; i + 8 <= k; i += 8)
    for (int lane = 0; lane < 8; ++lane) acc[lane] += x[i + lane] * load(i + lane);
  float total = ((acc[0] + acc[4]) + (acc[2] + acc[6])) + ((acc[1] + acc[5]) + (acc[3] + acc[7]));
  for (; i < k; ++i) total += x[i] * load(i);
  return total;
}

template <typename W, typename Dot>
void matmul_columns(const float* x, int64_t rows, int64_t k, const W* w, int64_t n,
                    const float* bias, float* y, ThreadPool& pool, Dot dot) {
  const size_t grain = size_t(std::max<int64_t>(1, 16384 / std::max<int64_t>(1, k * rows)));
  pool.parallel_for(size_t(n), [&](size_t begin, size_t end) {
    for (size_t col = begin; col < end; ++col) {
      const W* row = w + int64_t(col) * k;
      const float b = bias ? bias[col] : 0.0f;
      for (int64_t t = 0; t < rows; ++t) y[t * n + int64_t(col)] = dot(x + t * k, row, k) + b;
    }
  }, grain);
}

}  // namespace

float dot_bf16(const float* x, const uint16_t* w, int64_t k, CpuIsa isa) {
  if (cpu_isa_has_avx2(isa)) return avx2::dot_bf16(x, w, k);
  return dot_scalar(x, k, [w](int64_t i) { return bf16_to_float(w[i]); });
}

float dot_f32(const float* x, const float* w, int64_t k, CpuIsa isa) {
  if (cpu_isa_has_avx2(isa)) return avx2::dot_f32(x, w, k);
  return dot_scalar(x, k, [w](int64_t i) { return w[i]; });
}

void axpy_f32(float a, const float* x, float* y, int64_t n, CpuIsa isa) {
  if (cpu_isa_has_avx2(isa)) return avx2::axpy_f32(a, x, y, n);
  for (int64_t i = 0; i < n; ++i) y[i] += a * x[i];
}

void matmul_bf16(const float* x, int64_t rows, int64_t k, const uint16_t* w, int64_t n,
                 const float* bias, float* y, ThreadPool& pool, CpuIsa isa) {
  if (rows < 4 || !cpu_isa_has_avx2(isa)) {
    matmul_columns(x, rows, k, w, n, bias, y, pool,
                   [isa](const float* a, const uint16_t* b, int64_t len) { return dot_bf16(a, b, len, isa); });
    return;
  }
  pool.parallel_for(size_t(n), [&](size_t begin, size_t end) {
    for (size_t col = begin; col < end; ++col) {
      const uint16_t* row = w + int64_t(col) * k;
      const float b = bias ? bias[col] : 0.0f;
      int64_t t = 0;
      for (; t + 4 <= rows; t += 4) {
        const float* xs[4] = {x + t * k, x + (t + 1) * k, x + (t + 2) * k, x + (t + 3) * k};
        float out[4];
        avx2::dot_bf16_rows4(xs, row, k, out);
        for (int r = 0; r < 4; ++r) y[(t + r) * n + int64_t(col)] = out[r] + b;
      }
      for (; t < rows; ++t) y[t * n + int64_t(col)] = avx2::dot_bf16(x + t * k, row, k) + b;
    }
  }, 1);
}

void matmul_f32(const float* x, int64_t rows, int64_t k, const float* w, int64_t n,
                const float* bias, float* y, ThreadPool& pool, CpuIsa isa) {
  matmul_columns(x, rows, k, w, n, bias, y, pool,
                 [isa](const float* a, const float* b, int64_t len) { return dot_f32(a, b, len, isa); });
}

}  // namespace moet
