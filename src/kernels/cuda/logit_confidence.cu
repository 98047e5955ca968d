// logit_confidence_launch() (see logit_confidence.h).
#include "kernels/cuda/logit_confidence.h"

#include "kernels/cuda/block_reduce.cuh"
#include "kernels/cuda/launch.cuh"

#include <cmath>

namespace moet::cuda {
namespace {

constexpr int kThreads = 256;

// The two largest of (a1 >= a2) and (b1 >= b2), largest first.
__device__ __forceinline__ void merge_top2(float& a1, float& a2, float b1, float b2) {
  const float hi = fmaxf(a1, b1), lo = fmaxf(fminf(a1, b1), fmaxf(a2, b2));
  a1 = hi;
  a2 = lo;
}

__global__ void __launch_bounds__(kThreads) logit_confidence_kernel(const float* logits, int64_t vocab, float* out) {
  __shared__ float pairs[2][32];
  __shared__ float sums[32];
  pdl_trigger();
  pdl_wait();  // the logits come from the LM head
  const float* row = logits + int64_t(blockIdx.x) * vocab;
  float first = -INFINITY, second = -INFINITY;
  for (int64_t i = threadIdx.x; i < vocab; i += kThreads) {
    const float v = row[i];
    if (v != v) continue;
    if (v > first) {
      second = first;
      first = v;
    } else if (v > second) {
      second = v;
    }
  }
  for (int offset = 16; offset > 0; offset >>= 1) {
    const float b1 = __shfl_xor_sync(0xffffffffu, first, offset), b2 = __shfl_xor_sync(0xffffffffu, second, offset);
    merge_top2(first, second, b1, b2);
  }
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  if (lane == 0) {
    pairs[0][warp] = first;
    pairs[1][warp] = second;
  }
  __syncthreads();
  first = lane < kThreads / 32 ? pairs[0][lane] : -INFINITY;
  second = lane < kThreads / 32 ? pairs[1][lane] : -INFINITY;
  for (int offset = 16; offset > 0; offset >>= 1) {
    const float b1 = __shfl_xor_sync(0xffffffffu, first, offset), b2 = __shfl_xor_sync(0xffffffffu, second, offset);
    merge_top2(first, second, b1, b2);
  }
  // Every thread now holds the row's two largest (the same tree in every warp).
  if (first == -INFINITY) {
    if (threadIdx.x == 0) out[2 * blockIdx.x] = out[2 * blockIdx.x + 1] = 0.0f;
    return;
  }
  float sum = 0.0f;
  for (int64_t i = threadIdx.x; i < vocab; i += kThreads) {
    const float v = row[i];
    if (v == v) sum += v == first ? 1.0f : expf(v - first);
  }
  sum = block_reduce(sum, SumOp{}, 0.0f, sums);
  if (threadIdx.x == 0) {
    const float p1 = 1.0f / sum, p2 = (second == first ? 1.0f : expf(second - first)) / sum;
    out[2 * blockIdx.x] = p1;
    out[2 * blockIdx.x + 1] = p1 - p2;
  }
}

}  // namespace

void logit_confidence_launch(const float* logits, int64_t rows, int64_t vocab, float* out, cudaStream_t stream) {
  if (rows == 0) return;
  launch_dependent_kernel<logit_confidence_kernel>(dim3(unsigned(rows)), dim3(kThreads), 0, 1, stream, logits, vocab,
                                                   out);
}

}  // namespace moet::cuda
