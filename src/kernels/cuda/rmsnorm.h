// RMSNorm of FP32 groups on the GPU, with the semantics of kernels/cpu/elementwise.h: each group
// of `dim` contiguous floats becomes x / sqrt(mean(x^2) + eps) * weight (sum of squares in
// double), and the fused form adds a residual branch first (the decoder's
// "residual += branch; normed = rmsnorm(residual)"). A group is held in registers by one warp
// (dim <= 256: several groups per block) or one block (larger dims), see rms_span.cuh; float4
// accesses when dim % 4 == 0 and every pointer is 16-byte aligned, scalar ones otherwise.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace moet::cuda {

constexpr int64_t kRmsNormMaxDim = 8192;  // the widest group one block holds in registers

// out[g] = rmsnorm(x[g]) for g < groups; out may alias x.
void rmsnorm_launch(const float* x, int64_t groups, int64_t dim, const float* weight, float eps, float* out,
                    cudaStream_t stream);
// residual[g] += delta[g]; out[g] = rmsnorm(residual[g]). out must not alias residual or delta.
void add_rmsnorm_launch(float* residual, const float* delta, int64_t groups, int64_t dim, const float* weight,
                        float eps, float* out, cudaStream_t stream);

}  // namespace moet::cuda
