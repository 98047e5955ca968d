// MoE routing on the GPU with the semantics of kernels/cpu/router.h (softmax top-k; sigmoid or
// DeepSeek-V4's sqrtsoftplus + correction bias + grouped top-k), ties to the lower expert index,
// experts in descending order
// of choice score. One block per row (a thread per expert), experts <= 1024, top_k <= 64. The
// chosen-weight total is summed in choice order as the CPU does; the softmax denominator is a
// fixed-tree warp sum (deterministic; within rounding of the CPU's serial sum).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace moet::cuda {

struct RouterArgs {
  int64_t experts, top_k;
  bool sigmoid, normalize;
  float scaling;
  int64_t groups, top_groups;
  const float* correction_bias;  // device [experts] or null
  bool sqrtsoftplus = false;      // scores sqrt(softplus(logits)), weighted as sigmoid scores
};

void router_launch(const RouterArgs& p, const float* logits, int64_t rows, int32_t* expert_ids,
                   float* weights, cudaStream_t stream);

}  // namespace moet::cuda
