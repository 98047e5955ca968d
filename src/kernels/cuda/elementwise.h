// Row-wise and element-wise GPU kernels on FP32 activations, with the semantics of
// kernels/cpu/elementwise.h: embedding lookup (BF16 or F32 table), SiLU-and-mul, residual add,
// the split of FP32 values into two BF16 pieces.
// RMSNorm lives in rmsnorm.h, rotary embedding in head_norm_rope.h.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace moet::cuda {

// first_row / table_rows: a vocab-parallel rank's rows of the table (ids outside them give zeros).
void embedding_launch(const int32_t* ids, int64_t rows, const void* table, bool table_bf16, int64_t first_row,
                      int64_t table_rows, int64_t dim, float* out, cudaStream_t stream);
void silu_mul_launch(const float* gate_up, int64_t rows, int64_t inner, float* out, cudaStream_t stream);
void add_launch(float* y, const float* x, int64_t n, cudaStream_t stream);
void split_bf16_launch(const float* x, int64_t n, uint16_t* hi, uint16_t* lo, cudaStream_t stream);

}  // namespace moet::cuda
