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
  // A second product of the same x, for batch = 2 (gemv_pair_launch): problem 1 reads these
  // instead of the batch strides. Null: every problem is found through the strides.
  const void* w_second = nullptr;
  const float* bias_second = nullptr;
  float* y_second = nullptr;
};

// Whether the 16-byte vector path applies to these pointers and strides.
bool gemv_vector_ok(const GemvArgs& a);
void gemv_launch(const GemvArgs& a, cudaStream_t stream);
// y = x @ w^T (+ bias) and y_second = x @ w_second^T (+ bias_second) in one launch: `first` is a
// single product (batch 1), w_second has its shape and type. Each result is bit-identical to
// gemv_launch of that product alone.
void gemv_pair_launch(const GemvArgs& first, const void* w_second, const float* bias_second, float* y_second,
                      cudaStream_t stream);

}  // namespace moet::cuda
