// The confidence gate's per-row signals on the GPU (the semantics of kernels/cpu/logit_confidence.h):
// out[2 r] = the largest softmax probability of logits row r, out[2 r + 1] = it minus the second
// largest. One block per row: the two largest values by a fixed reduction tree, then the sum of
// e^(l - l1) in float (accurate expf) over a fixed tree, so a row gives the same bits every run;
// they differ from the CPU's (a double sum of its own exponential) by float rounding. No host
// synchronisation: capturable in a CUDA graph.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace moet::cuda {

constexpr int64_t kLogitConfidenceMaxRows = 65535;  // one grid row per logit row

void logit_confidence_launch(const float* logits, int64_t rows, int64_t vocab, float* out, cudaStream_t stream);

}  // namespace moet::cuda
