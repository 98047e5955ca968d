// A span of floats held in registers by a team of threads (one warp, or a whole block), the
// building block of the RMSNorm kernels (rmsnorm.cu, head_norm_rope.cu). Every load of a span is
// issued before any arithmetic, so normalising a row costs one memory round trip, not one per
// loop iteration. Team member `rank` of `team` owns chunks c = rank + j * team (j < kChunks) of W
// consecutive floats: W = 4 reads and writes each chunk as one float4 (the span 16-byte aligned,
// its length a multiple of 4), W = 1 takes any span. Chunks past the span's end hold zeros.
// The sum of squares is taken in double like the CPU reference (kernels/cpu/elementwise.cpp):
// each square of a float is exact in double, so the float mean, and with it every output, matches
// the CPU's bits except when the two summation orders straddle a float rounding boundary. The
// order is fixed by (length, W, team), so a result repeats run to run and does not depend on the
// other rows of a batch.
#pragma once

#include "kernels/cuda/block_reduce.cuh"

namespace moet::cuda {

__device__ __forceinline__ void load_chunk(const float* p, float (&v)[4]) {
  const float4 x = *reinterpret_cast<const float4*>(p);
  v[0] = x.x, v[1] = x.y, v[2] = x.z, v[3] = x.w;
}
__device__ __forceinline__ void load_chunk(const float* p, float (&v)[1]) { v[0] = *p; }
__device__ __forceinline__ void store_chunk(float* p, const float (&v)[4]) {
  *reinterpret_cast<float4*>(p) = make_float4(v[0], v[1], v[2], v[3]);
}
__device__ __forceinline__ void store_chunk(float* p, const float (&v)[1]) { *p = v[0]; }

template <int W, int kChunks>
struct RmsSpan {
  static constexpr int kWidth = W;
  float v[kChunks][W];

  // The first float of chunk j of this member, or -1 past the span's end.
  __device__ __forceinline__ static int chunk_start(int j, int len, int rank, int team) {
    const int start = (rank + j * team) * W;
    return start < len ? start : -1;
  }

  __device__ __forceinline__ void load(const float* span, int len, int rank, int team) {
#pragma unroll
    for (int j = 0; j < kChunks; ++j) {
      const int start = chunk_start(j, len, rank, team);
      if (start >= 0) {
        load_chunk(span + start, v[j]);
      } else {
#pragma unroll
        for (int i = 0; i < W; ++i) v[j][i] = 0.0f;
      }
    }
  }

  __device__ __forceinline__ void store(float* span, int len, int rank, int team) const {
#pragma unroll
    for (int j = 0; j < kChunks; ++j) {
      const int start = chunk_start(j, len, rank, team);
      if (start >= 0) store_chunk(span + start, v[j]);
    }
  }

  // v += other, element by element (the CPU's y[i] += x[i]).
  __device__ __forceinline__ void add(const RmsSpan& other) {
#pragma unroll
    for (int j = 0; j < kChunks; ++j)
#pragma unroll
      for (int i = 0; i < W; ++i) v[j][i] += other.v[j][i];
  }

  // This member's share of the sum of squares, in chunk order.
  __device__ __forceinline__ double sum_squares() const {
    double sum = 0.0;
#pragma unroll
    for (int j = 0; j < kChunks; ++j)
#pragma unroll
      for (int i = 0; i < W; ++i) sum += double(v[j][i]) * double(v[j][i]);
    return sum;
  }

  // v = weight * (v * inv), the CPU's expression; `weight` holds the same chunks of the weights.
  __device__ __forceinline__ void normalise(const RmsSpan& weight, float inv) {
#pragma unroll
    for (int j = 0; j < kChunks; ++j)
#pragma unroll
      for (int i = 0; i < W; ++i) v[j][i] = weight.v[j][i] * (v[j][i] * inv);
  }
};

// 1 / sqrt(mean square + eps) from the team's total sum of squares over `len` floats.
__device__ __forceinline__ float rms_inverse(double sum, int len, float eps) {
  return 1.0f / sqrtf(float(sum / double(len)) + eps);
}

}  // namespace moet::cuda
