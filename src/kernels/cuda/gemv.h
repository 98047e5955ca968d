// Batched products y = x @ w^T (+ bias) with BF16, F32 or FP8-block weights [n, k] (e4m3 codes
// with one F32 scale per 128x128 block, scales [ceil(n/128), ceil(k/128)]), FP32 activations and
// FP32 accumulation, for few rows (decode) and many (prefill: weights are re-read once per 8
// rows, or 16 on the tensor cores, which take the large BF16 and FP8-block products of 4 rows
// and more: gemv_mma.h). One launch runs up to kGemvMaxParts products of the same x (GQA's q, k and v), each
// with its own weights and output; a part may hold `batch` independent problems laid out with
// element strides (per-head matmuls of MLA use batch = heads). Deterministic and batch-invariant
// (see gemv_core.cuh); a part's results are bit-identical whatever else its launch holds.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace moet::cuda {

constexpr int kGemvMaxParts = 4;

enum class GemvWeights { bf16, f32, fp8_block };

struct GemvPart {
  const void* w;           // uint16_t (BF16), float or uint8_t (e4m3 codes), [batch][n, k]
  int64_t w_batch_stride;  // elements
  const float* bias;       // [n] or null
  float* y;
  int64_t y_row_stride, y_batch_stride;
  int64_t n, batch;
  const float* w_scales;   // FP8-block only (batch 1): [ceil(n/128), ceil(k/128)]
};

struct GemvArgs {
  const float* x;
  int64_t x_row_stride, x_batch_stride;  // floats; x_batch_stride: between a part's problems
  GemvWeights weights;                    // every part alike
  int64_t rows, k;
  GemvPart parts[kGemvMaxParts];
  int part_count;
  // A decode-like step's product (StepInputs::row_invariant): the tensor cores take the parts
  // their shape suits from one row on (gemv_mma.h), so a row's kernel, and its bits, do not
  // depend on the row count.
  bool row_invariant = false;
};

// Whether the 16-byte vector path applies to these pointers and strides.
bool gemv_vector_ok(const GemvArgs& a);
void gemv_launch(const GemvArgs& a, cudaStream_t stream);

}  // namespace moet::cuda
