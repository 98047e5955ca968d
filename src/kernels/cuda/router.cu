// Top-k routing (see router.h).
#include "kernels/cuda/router.h"

#include "kernels/cuda/block_reduce.cuh"

namespace moet::cuda {
namespace {

constexpr int kThreads = 256;

// A candidate (value, index); the better one has the larger value, ties the lower index.
struct Candidate {
  float value;
  int index;
};

struct BetterOp {
  __device__ __forceinline__ Candidate operator()(Candidate a, Candidate b) const {
    return (a.value > b.value || (a.value == b.value && a.index < b.index)) ? a : b;
  }
};

__device__ __forceinline__ Candidate shfl_candidate(Candidate c, int offset) {
  return {__shfl_xor_sync(0xffffffffu, c.value, offset), __shfl_xor_sync(0xffffffffu, c.index, offset)};
}

// Best of values[0..n) among those not yet taken (taken[i] != 0); ties to the lower index.
__device__ Candidate block_best(const float* values, const unsigned char* taken, int n, Candidate* scratch) {
  Candidate best{-INFINITY, n};
  for (int i = threadIdx.x; i < n; i += blockDim.x)
    if (!taken[i]) best = BetterOp()(best, Candidate{values[i], i});
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) best = BetterOp()(best, shfl_candidate(best, offset));
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  __syncthreads();
  if (lane == 0) scratch[warp] = best;
  __syncthreads();
  best = lane < int(blockDim.x >> 5) ? scratch[lane] : Candidate{-INFINITY, n};
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) best = BetterOp()(best, shfl_candidate(best, offset));
  return best;
}

__global__ void __launch_bounds__(kThreads) router_kernel(RouterArgs p, const float* logits, int32_t* ids,
                                                          float* weights) {
  __shared__ float scores[1024], choice[1024], group_score[1024];
  __shared__ unsigned char taken[1024];
  __shared__ float scratch[32];
  __shared__ Candidate best_scratch[32];
  __shared__ int chosen[64];
  const int n = int(p.experts);
  const float* row = logits + int64_t(blockIdx.x) * n;
  if (p.sigmoid) {
    for (int e = threadIdx.x; e < n; e += blockDim.x) scores[e] = 1.0f / (1.0f + expf(-row[e]));
  } else {
    float m = -INFINITY;
    for (int e = threadIdx.x; e < n; e += blockDim.x) m = fmaxf(m, row[e]);
    m = block_reduce(m, MaxOp(), -INFINITY, scratch);
    for (int e = threadIdx.x; e < n; e += blockDim.x) scores[e] = expf(row[e] - m);
    __syncthreads();
    if (threadIdx.x == 0) {
      float sum = 0.0f;
      for (int e = 0; e < n; ++e) sum += scores[e];
      scratch[0] = sum;
    }
    __syncthreads();
    const float sum = scratch[0];
    for (int e = threadIdx.x; e < n; e += blockDim.x) scores[e] /= sum;
  }
  __syncthreads();
  for (int e = threadIdx.x; e < n; e += blockDim.x) {
    choice[e] = scores[e] + (p.correction_bias ? p.correction_bias[e] : 0.0f);
    taken[e] = 0;
  }
  __syncthreads();
  if (p.groups > 1) {
    const int per_group = n / int(p.groups);
    for (int g = threadIdx.x; g < p.groups; g += blockDim.x) {
      // Sum of the group's two best choices (one when the group has one member).
      int first = 0;
      for (int i = 1; i < per_group; ++i)
        if (choice[g * per_group + i] > choice[g * per_group + first]) first = i;
      float total = 0.0f + choice[g * per_group + first];
      if (per_group > 1) {
        int second = first == 0 ? 1 : 0;
        for (int i = 0; i < per_group; ++i)
          if (i != first && choice[g * per_group + i] > choice[g * per_group + second]) second = i;
        total += choice[g * per_group + second];
      }
      group_score[g] = total;
      taken[g] = 0;
    }
    __syncthreads();
    for (int i = 0; i < p.top_groups; ++i) {
      const Candidate best = block_best(group_score, taken, int(p.groups), best_scratch);
      __syncthreads();
      if (threadIdx.x == 0) taken[best.index] = 1;  // kept groups are marked in `taken`
      __syncthreads();
    }
    for (int e = threadIdx.x; e < n; e += blockDim.x)
      if (!taken[e / per_group]) choice[e] = -INFINITY;
    __syncthreads();
    for (int e = threadIdx.x; e < n; e += blockDim.x) taken[e] = 0;
    __syncthreads();
  }
  for (int i = 0; i < p.top_k; ++i) {
    const Candidate best = block_best(choice, taken, n, best_scratch);
    __syncthreads();
    if (threadIdx.x == 0) {
      taken[best.index] = 1;
      chosen[i] = best.index;
    }
    __syncthreads();
  }
  if (threadIdx.x == 0) {
    float total = 0.0f;
    for (int i = 0; i < p.top_k; ++i) total += scores[chosen[i]];
    const float denom = p.sigmoid ? total + 1e-20f : total;
    for (int i = 0; i < p.top_k; ++i) {
      const float w = scores[chosen[i]];
      ids[int64_t(blockIdx.x) * p.top_k + i] = chosen[i];
      weights[int64_t(blockIdx.x) * p.top_k + i] = (p.normalize ? w / denom : w) * p.scaling;
    }
  }
}

}  // namespace

void router_launch(const RouterArgs& p, const float* logits, int64_t rows, int32_t* expert_ids,
                   float* weights, cudaStream_t stream) {
  router_kernel<<<unsigned(rows), kThreads, 0, stream>>>(p, logits, expert_ids, weights);
}

}  // namespace moet::cuda
