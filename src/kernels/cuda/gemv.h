// Batched products y = x @ w^T (+ bias) with BF16 or F32 weights [n, k], FP32 activations and
// FP32 accumulation, for few rows (decode) and many (prefill: weights are re-read once per 8
// rows). `batch` independent problems are laid out with element strides (per-head matmuls of
// MLA use batch = heads). Deterministic and batch-invariant (see gemv_core.cuh).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace moet::cuda {

struct GemvArgs {
  const float* x;
  int64_t x_row_stride, x_batch_stride;  // floats
  const void* w;                          // uint16_t (BF16) or float
  bool w_bf16;
  int64_t w_batch_stride;                 // elements
  const float* bias;                      // [n] or null (batch 0 only)
  float* y;
  int64_t y_row_stride, y_batch_stride;
  int64_t rows, n, k, batch;
};

// Whether the 16-byte vector path applies to these pointers and strides.
bool gemv_vector_ok(const GemvArgs& a);
void gemv_launch(const GemvArgs& a, cudaStream_t stream);

}  // namespace moet::cuda
