// Row-wise and element-wise GPU kernels on FP32 activations, with the semantics of
// kernels/cpu/elementwise.h and kernels/cpu/rope.h: embedding lookup (BF16 or F32 table),
// RMSNorm (sum of squares in double, like the CPU), SiLU-and-mul, residual add, and rotary
// embedding (halves or interleaved-then-de-interleaved, on a rot_dim slice of each head).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace moet::cuda {

void embedding_launch(const int32_t* ids, int64_t rows, const void* table, bool table_bf16, int64_t dim,
                      float* out, cudaStream_t stream);
// Each of `groups` groups of `dim` floats (x and out contiguous, may alias) normalised.
void rmsnorm_launch(const float* x, int64_t groups, int64_t dim, const float* weight, float eps, float* out,
                    cudaStream_t stream);
void silu_mul_launch(const float* gate_up, int64_t rows, int64_t inner, float* out, cudaStream_t stream);
void add_launch(float* y, const float* x, int64_t n, cudaStream_t stream);

constexpr int kMaxRopePairs = 128;
struct RopeArgs {
  float inv_freq[kMaxRopePairs];
  int pairs;
  float scale;
  bool interleaved;
};
// x: [rows, heads, row_stride] with heads head_stride apart; rotates x[..., offset : offset + 2 * pairs].
void rope_launch(const RopeArgs& table, float* x, int64_t rows, int64_t heads, int64_t row_stride,
                 int64_t head_stride, int64_t offset, const int32_t* positions, cudaStream_t stream);

}  // namespace moet::cuda
