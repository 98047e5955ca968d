// Row-wise and element-wise kernels on FP32 activations: embedding lookup, RMSNorm, SiLU-and-mul,
// residual add, BF16 split. All are pure functions of their inputs; rows are independent and run
// in parallel.
#pragma once

#include "core/thread_pool.h"

#include <cstdint>

namespace moet {

// out[t, :] = table[ids[t] - first_row, :] for ids in [first_row, first_row + table_rows), else
// zeros (BF16 or F32 table [table_rows, dim]: a vocab-parallel rank's rows of the embedding).
void embedding(const int32_t* ids, int64_t rows, const void* table, bool table_bf16, int64_t first_row,
               int64_t table_rows, int64_t dim, float* out);
// out[t, :] = x[t, :] / sqrt(mean(x[t, :]^2) + eps) * weight  (x and out may alias).
// x rows are `stride` floats apart (heads of a packed q/k tensor use stride = head_dim).
void rmsnorm(const float* x, int64_t rows, int64_t dim, int64_t stride, const float* weight,
             float eps, float* out, int64_t out_stride, ThreadPool& pool);
// out[t, i] = silu(gate_up[t, i]) * gate_up[t, inner + i]; gate_up is [rows, 2*inner]. limit > 0
// (DeepSeek-V4's swiglu_limit): the gate is clamped to at most limit and the up value to
// [-limit, limit] first.
void silu_mul(const float* gate_up, int64_t rows, int64_t inner, float* out, float limit = 0.0f);
// out[t, :] = (x[t, :] - mean) / sqrt(var + eps) * weight + bias over rows of `dim` (LayerNorm;
// x and out may alias).
void layernorm(const float* x, int64_t rows, int64_t dim, const float* weight, const float* bias, float eps,
               float* out);
// y[i] += x[i]
void add_inplace(float* y, const float* x, int64_t n);
// x[i] as two BF16 pieces: hi[i] = bf16(x[i]), lo[i] = bf16(x[i] - hi[i]) (round to nearest even;
// hi + lo keeps 16 significand bits of x, the tensor-core GEMM's activations: dense_gemm.h).
void split_bf16(const float* x, int64_t n, uint16_t* hi, uint16_t* lo);

}  // namespace moet
