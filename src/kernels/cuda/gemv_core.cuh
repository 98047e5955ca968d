// The inner loop every BF16/F32-weight product on the GPU shares (dense matmul, per-head matmul,
// MoE experts): one warp computes NW output columns for up to kMaxRows FP32 activation rows,
// reading each weight byte once, 16 bytes per lane per load with several loads in flight, and
// accumulating in FP32. The summation order depends only on k (each lane owns fixed k chunks,
// then a fixed xor-shuffle tree), never on the number of rows or the launch, so results are
// bit-identical run to run and batch-invariant. The vector path needs k % 8 == 0 and 16-byte
// aligned rows; otherwise the scalar path (lane-strided) is used.
#pragma once

#include "kernels/cuda/block_reduce.cuh"

#include <cstdint>

namespace moet::cuda {

constexpr int kMaxRows = 8;     // activation rows per pass over the weights (at most)
constexpr int kChunk = 8;       // weights per lane per load (16 bytes of BF16)
constexpr int kInFlight = 4;    // default chunks per lane loaded before the first use

// Eight weights of type W as they sit in one load.
template <typename W> struct WeightChunk;

template <> struct WeightChunk<uint16_t> {
  uint4 v;
  __device__ __forceinline__ void load(const uint16_t* p) { v = __ldg(reinterpret_cast<const uint4*>(p)); }
  __device__ __forceinline__ float get(int i) const {
    const uint32_t word = i < 2 ? v.x : i < 4 ? v.y : i < 6 ? v.z : v.w;
    return __uint_as_float((i & 1) ? (word & 0xffff0000u) : (word << 16));
  }
};

template <> struct WeightChunk<float> {
  float4 a, b;
  __device__ __forceinline__ void load(const float* p) {
    a = __ldg(reinterpret_cast<const float4*>(p));
    b = __ldg(reinterpret_cast<const float4*>(p) + 1);
  }
  __device__ __forceinline__ float get(int i) const {
    const float4& h = i < 4 ? a : b;
    const int j = i & 3;
    return j == 0 ? h.x : j == 1 ? h.y : j == 2 ? h.z : h.w;
  }
};

__device__ __forceinline__ float weight_value(const uint16_t* p) { return __uint_as_float(uint32_t(*p) << 16); }
__device__ __forceinline__ float weight_value(const float* p) { return *p; }

template <typename W, int NW, int R>
__device__ __forceinline__ void accumulate_chunk(const WeightChunk<W> (&w)[NW], const float* const (&x)[R], int rows,
                                                 int base, float (&acc)[R][NW]) {
#pragma unroll
  for (int r = 0; r < R; ++r) {
    if (r >= rows) break;
    const float4 x0 = *reinterpret_cast<const float4*>(x[r] + base);
    const float4 x1 = *reinterpret_cast<const float4*>(x[r] + base + 4);
    const float xv[kChunk] = {x0.x, x0.y, x0.z, x0.w, x1.x, x1.y, x1.z, x1.w};
#pragma unroll
    for (int j = 0; j < NW; ++j)
#pragma unroll
      for (int i = 0; i < kChunk; ++i) acc[r][j] = fmaf(xv[i], w[j].get(i), acc[r][j]);
  }
}

// acc[r][j] = sum_k x[r][k] * w[j][k] for the rows r < rows <= R, complete in every lane on
// return. F chunks per lane are loaded before the first is used. A row's sums depend on neither F
// nor R (chunks ascend per lane; rows never mix).
template <typename W, int NW, int F = kInFlight, int R = kMaxRows>
__device__ __forceinline__ void warp_dot(const float* const (&x)[R], int rows, const W* const (&w)[NW], int k,
                                         bool vec, float (&acc)[R][NW]) {
  const int lane = threadIdx.x & 31;
#pragma unroll
  for (int r = 0; r < R; ++r)
#pragma unroll
    for (int j = 0; j < NW; ++j) acc[r][j] = 0.0f;
  if (vec) {
    constexpr int stride = 32 * kChunk;
    int base = lane * kChunk;
    for (; base + (F - 1) * stride + kChunk <= k; base += F * stride) {
      WeightChunk<W> chunk[F][NW];
#pragma unroll
      for (int u = 0; u < F; ++u)
#pragma unroll
        for (int j = 0; j < NW; ++j) chunk[u][j].load(w[j] + base + u * stride);
#pragma unroll
      for (int u = 0; u < F; ++u) accumulate_chunk<W, NW, R>(chunk[u], x, rows, base + u * stride, acc);
    }
    for (; base + kChunk <= k; base += stride) {
      WeightChunk<W> chunk[NW];
#pragma unroll
      for (int j = 0; j < NW; ++j) chunk[j].load(w[j] + base);
      accumulate_chunk<W, NW, R>(chunk, x, rows, base, acc);
    }
  } else {
    for (int i = lane; i < k; i += 32) {
#pragma unroll
      for (int r = 0; r < R; ++r) {
        if (r >= rows) break;
        const float xv = x[r][i];
#pragma unroll
        for (int j = 0; j < NW; ++j) acc[r][j] = fmaf(xv, weight_value(w[j] + i), acc[r][j]);
      }
    }
  }
  warp_sum_rows(acc, rows);
}

}  // namespace moet::cuda
