// The softmax partial of the decode attention kernels (attention.cu, splitk_attention.cu,
// splitk_mla_attention.cu) and its fold: the state of a softmax over some keys for one float4 of
// one head's output, the rule that joins two such states, and the split kernels' "last block of a
// row folds the splits in order" (arrival_count.cuh's protocol). Explicitly rounded operations, so
// every call site computes the same bits whatever the compiler contracts around it.
#pragma once

#include "kernels/cuda/arrival_count.cuh"

#include <cuda_runtime.h>

#include <cstdint>

namespace moet::cuda {

// Maximum score m, sum l of exp(score - m), o = sum of exp(score - m) * v.
struct Partial {
  float m, l;
  float4 o;
};

__device__ __forceinline__ Partial cleared() { return {-INFINITY, 0.0f, make_float4(0.0f, 0.0f, 0.0f, 0.0f)}; }

__device__ __forceinline__ float scaled_sum(float x, float a, float y, float b) {
  return __fadd_rn(__fmul_rn(x, a), __fmul_rn(y, b));
}

// acc <- acc (+) s, both rescaled to the larger maximum. From the cleared state the fold is exact
// (a = 0, b = 1): acc becomes s. s must be non-empty (finite m).
__device__ __forceinline__ void fold(Partial& acc, const Partial& s) {
  const float m = fmaxf(acc.m, s.m);
  const float a = expf(acc.m - m), b = expf(s.m - m);
  acc.l = scaled_sum(acc.l, a, s.l, b);
  acc.o = make_float4(scaled_sum(acc.o.x, a, s.o.x, b), scaled_sum(acc.o.y, a, s.o.y, b),
                      scaled_sum(acc.o.z, a, s.o.z, b), scaled_sum(acc.o.w, a, s.o.w, b));
  acc.m = m;
}

// The partial stored at src by another block of this launch (m, l, two unused floats, then the
// output's float4s), float4 d4 of its output; read through L2.
__device__ __forceinline__ Partial load_partial(const float* src, int d4) {
  return {__ldcg(src), __ldcg(src + 1), __ldcg(reinterpret_cast<const float4*>(src + 4) + d4)};
}

// Splits 0..used-1 of one head's partials (`width` floats apart from `first`) folded in order,
// float4 d4 of the output.
__device__ __forceinline__ Partial fold_splits(const float* first, int64_t width, int used, int d4) {
  Partial total = cleared();
  for (int split = 0; split < used; ++split) fold(total, load_partial(first + split * width, d4));
  return total;
}

// Called by every thread of a block after storing its partials: whether the block is the last of
// the `used` ones sharing *counter to arrive (then every other block's partials are visible to
// its threads, and the counter is reset for the next launch).
__device__ __forceinline__ bool last_to_arrive(int32_t* counter, int used) {
  __shared__ int last;
  __syncthreads();  // every thread's partials before thread 0's arrival
  if (threadIdx.x == 0) {
    last = count_arrival(reinterpret_cast<uint32_t*>(counter)) == uint32_t(used - 1);
    if (last) *counter = 0;
  }
  __syncthreads();
  return last != 0;
}

// out[0..n) <- o / l, n <= 4 (the last float4 of a row may be cut).
__device__ __forceinline__ void store_normalised(float* out, const Partial& p, int n) {
  const float o[4] = {p.o.x, p.o.y, p.o.z, p.o.w};
#pragma unroll
  for (int c = 0; c < 4; ++c)
    if (c < n) out[c] = __fdiv_rn(o[c], p.l);
}

}  // namespace moet::cuda
