// Block-wide reductions with a fixed combination tree (warp xor-shuffles, then warp 0 over the
// per-warp results): the same inputs give the same bits on every run. blockDim.x must be a
// multiple of 32 and at most 1024; `scratch` holds 32 values; every thread gets the result.
#pragma once

namespace moet::cuda {

template <typename T, typename Op>
__device__ __forceinline__ T warp_reduce(T v, Op op) {
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) v = op(v, __shfl_xor_sync(0xffffffffu, v, offset));
  return v;
}

template <typename T, typename Op>
__device__ __forceinline__ T block_reduce(T v, Op op, T identity, T* scratch) {
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, warps = blockDim.x >> 5;
  v = warp_reduce(v, op);
  __syncthreads();  // scratch may still be read by a previous reduction
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  v = lane < warps ? scratch[lane] : identity;
  return warp_reduce(v, op);
}

struct SumOp {
  template <typename T> __device__ __forceinline__ T operator()(T a, T b) const { return a + b; }
};

// Per-lane partial dot products acc[r][j] summed across the warp (same tree as warp_reduce) for
// the rows r < rows; `rows` must be uniform across the warp. Every lane holds the sums after.
template <int R, int NW>
__device__ __forceinline__ void warp_sum_rows(float (&acc)[R][NW], int rows) {
#pragma unroll
  for (int r = 0; r < R; ++r) {
    if (r >= rows) break;
#pragma unroll
    for (int j = 0; j < NW; ++j) acc[r][j] = warp_reduce(acc[r][j], SumOp{});
  }
}
struct MaxOp {
  __device__ __forceinline__ float operator()(float a, float b) const { return fmaxf(a, b); }
};

}  // namespace moet::cuda
