// Dense matrix products y[t, n] = sum_k x[t, k] * W[n, k] (+ bias[n]) with FP32 accumulation,
// W stored row-major [N, K] in BF16 or F32 as checkpoints ship it (nn.Linear layout).
// Parallel over output columns n; each y element is computed by one thread in a fixed order, so
// results depend neither on the thread count nor on how many rows are in x (batch invariance).
// Vectorised with AVX2 where available (BF16 weights are read once per four rows).
#pragma once

#include "core/thread_pool.h"
#include "core/cpu_isa.h"

#include <cstdint>

namespace moet {

void matmul_bf16(const float* x, int64_t rows, int64_t k, const uint16_t* w, int64_t n,
                 const float* bias, float* y, ThreadPool& pool, CpuIsa isa);
void matmul_f32(const float* x, int64_t rows, int64_t k, const float* w, int64_t n,
                const float* bias, float* y, ThreadPool& pool, CpuIsa isa);

// Single dot products and y += a * x, exposed for the kernels built on them (and their tests).
float dot_bf16(const float* x, const uint16_t* w, int64_t k, CpuIsa isa);
float dot_f32(const float* x, const float* w, int64_t k, CpuIsa isa);
void axpy_f32(float a, const float* x, float* y, int64_t n, CpuIsa isa);

namespace avx2 {
float dot_bf16(const float* x, const uint16_t* w, int64_t k);
float dot_f32(const float* x, const float* w, int64_t k);
void axpy_f32(float a, const float* x, float* y, int64_t n);
// Four rows against one weight row; out[r] equals dot_bf16(x[r], w, k) bit for bit.
void dot_bf16_rows4(const float* const x[4], const uint16_t* w, int64_t k, float out[4]);
}  // namespace avx2

}  // namespace moet
