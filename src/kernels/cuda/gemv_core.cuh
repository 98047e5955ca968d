// The inner loop every dense product on the GPU shares (dense matmul, per-head matmul, MoE
// experts): one warp computes NW output columns for up to kMaxRows FP32 activation rows, reading
// each weight byte once, 16 bytes per lane per load (32 for F32) with several loads in flight, and
// accumulating in FP32. The summation order depends only on k (each lane owns fixed k chunks,
// then a fixed xor-shuffle tree), never on the number of rows or the launch, so results are
// bit-identical run to run and batch-invariant. The vector path needs k a multiple of the chunk
// (8 BF16/F32 weights, 16 FP8 codes) and 16-byte aligned rows; otherwise the scalar path
// (lane-strided) is used.
// FP8-block weights (W = Fp8Block): a chunk is 16 e4m3 codes (one 16-byte load), decoded in
// registers (cvt e4m3x2 -> f16x2 on sm_89+, cuda_fp8.h's fallback before) and summed against x in
// FP32, the sum then multiplied by the chunk's block scale (16 codes never straddle a 128-column
// block: a row starts at a block boundary and 128 % 16 == 0). The scalar path scales each weight.
#pragma once

#include "kernels/cuda/block_reduce.cuh"

#include <cuda_fp8.h>

#include <cstdint>

namespace moet::cuda {

constexpr int kMaxRows = 8;     // activation rows per pass over the weights (at most)
constexpr int kChunk = 8;       // BF16/F32 weights per lane per load (16 bytes of BF16)
constexpr int kInFlight = 4;    // default chunks per lane loaded before the first use
constexpr int kFp8Block = 128;  // columns (and rows) of one FP8 block scale

// Tag of FP8-block weights, and one of their rows as warp_dot reads it: codes from the first
// column read, and the scales of the row's block row from that column's block (the first column
// is a multiple of kFp8Block).
struct Fp8Block {};
struct Fp8Row {
  const uint8_t* codes;
  const float* scales;
};

// One load of weights of type W: Row (a pointer to a row's first weight read, or Fp8Row), kSize
// weights, decoded to floats; value() reads one weight (the scalar path). kScaled: the chunk
// carries a scale that multiplies its sum.
template <typename W> struct WeightChunk;

template <> struct WeightChunk<uint16_t> {
  using Row = const uint16_t*;
  static constexpr int kSize = kChunk, kElementBytes = 2;
  static constexpr bool kScaled = false;
  uint4 v;
  __device__ __forceinline__ void load(Row row, int base) { v = __ldg(reinterpret_cast<const uint4*>(row + base)); }
  __device__ __forceinline__ void decode(float (&f)[kSize]) const {
    const uint32_t words[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
    for (int i = 0; i < kSize; ++i)
      f[i] = __uint_as_float((i & 1) ? (words[i / 2] & 0xffff0000u) : (words[i / 2] << 16));
  }
  static __device__ __forceinline__ float value(Row row, int i) { return __uint_as_float(uint32_t(row[i]) << 16); }
  static __device__ __forceinline__ const void* address(Row row) { return row; }
};

template <> struct WeightChunk<float> {
  using Row = const float*;
  static constexpr int kSize = kChunk, kElementBytes = 4;
  static constexpr bool kScaled = false;
  float4 a, b;
  __device__ __forceinline__ void load(Row row, int base) {
    a = __ldg(reinterpret_cast<const float4*>(row + base));
    b = __ldg(reinterpret_cast<const float4*>(row + base) + 1);
  }
  __device__ __forceinline__ void decode(float (&f)[kSize]) const {
    f[0] = a.x, f[1] = a.y, f[2] = a.z, f[3] = a.w, f[4] = b.x, f[5] = b.y, f[6] = b.z, f[7] = b.w;
  }
  static __device__ __forceinline__ float value(Row row, int i) { return row[i]; }
  static __device__ __forceinline__ const void* address(Row row) { return row; }
};

template <> struct WeightChunk<Fp8Block> {
  using Row = Fp8Row;
  static constexpr int kSize = 16, kElementBytes = 1;
  static constexpr bool kScaled = true;
  uint4 v;
  float scale;
  __device__ __forceinline__ void load(const Row& row, int base) {
    v = __ldg(reinterpret_cast<const uint4*>(row.codes + base));
    scale = __ldg(row.scales + base / kFp8Block);
  }
  __device__ __forceinline__ void decode(float (&f)[kSize]) const {
    const uint32_t words[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
    for (int i = 0; i < kSize; i += 2) {
      const __half2_raw raw = __nv_cvt_fp8x2_to_halfraw2(
          static_cast<__nv_fp8x2_storage_t>(words[i / 4] >> (8 * (i % 4))), __NV_E4M3);
      const float2 pair = __half22float2(__half2(raw));
      f[i] = pair.x;
      f[i + 1] = pair.y;
    }
  }
  static __device__ __forceinline__ float value(const Row& row, int i) {
    const __half_raw raw = __nv_cvt_fp8_to_halfraw(row.codes[i], __NV_E4M3);
    return __half2float(__half(raw)) * __ldg(row.scales + i / kFp8Block);
  }
  static __device__ __forceinline__ const void* address(const Row& row) { return row.codes; }
};

// acc[r][j] += the chunk's products with x[r][base, base + kSize) for the rows r < rows; a scaled
// chunk's products are summed first, then multiplied by its scale.
template <typename W, int NW, int R>
__device__ __forceinline__ void accumulate_chunk(const WeightChunk<W> (&w)[NW], const float* const (&x)[R], int rows,
                                                 int base, float (&acc)[R][NW]) {
  using Chunk = WeightChunk<W>;
  float wv[NW][Chunk::kSize];
#pragma unroll
  for (int j = 0; j < NW; ++j) w[j].decode(wv[j]);
#pragma unroll
  for (int r = 0; r < R; ++r) {
    if (r >= rows) break;
    float xv[Chunk::kSize];
#pragma unroll
    for (int q = 0; q < Chunk::kSize / 4; ++q) {
      const float4 x4 = *reinterpret_cast<const float4*>(x[r] + base + 4 * q);
      xv[4 * q] = x4.x, xv[4 * q + 1] = x4.y, xv[4 * q + 2] = x4.z, xv[4 * q + 3] = x4.w;
    }
#pragma unroll
    for (int j = 0; j < NW; ++j) {
      if constexpr (Chunk::kScaled) {
        float sum = 0.0f;
#pragma unroll
        for (int i = 0; i < Chunk::kSize; ++i) sum = fmaf(xv[i], wv[j][i], sum);
        acc[r][j] = fmaf(sum, w[j].scale, acc[r][j]);
      } else {
#pragma unroll
        for (int i = 0; i < Chunk::kSize; ++i) acc[r][j] = fmaf(xv[i], wv[j][i], acc[r][j]);
      }
    }
  }
}

// acc[r][j] = sum_k x[r][k] * w[j][k] for the rows r < rows <= R, complete in every lane on
// return. F chunks per lane are loaded before the first is used. A row's sums depend on neither F
// nor R (chunks ascend per lane; rows never mix).
template <typename W, int NW, int F = kInFlight, int R = kMaxRows>
__device__ __forceinline__ void warp_dot(const float* const (&x)[R], int rows,
                                         const typename WeightChunk<W>::Row (&w)[NW], int k, bool vec,
                                         float (&acc)[R][NW]) {
  using Chunk = WeightChunk<W>;
  const int lane = threadIdx.x & 31;
#pragma unroll
  for (int r = 0; r < R; ++r)
#pragma unroll
    for (int j = 0; j < NW; ++j) acc[r][j] = 0.0f;
  if (vec) {
    constexpr int stride = 32 * Chunk::kSize;
    int base = lane * Chunk::kSize;
    for (; base + (F - 1) * stride + Chunk::kSize <= k; base += F * stride) {
      Chunk chunk[F][NW];
#pragma unroll
      for (int u = 0; u < F; ++u)
#pragma unroll
        for (int j = 0; j < NW; ++j) chunk[u][j].load(w[j], base + u * stride);
#pragma unroll
      for (int u = 0; u < F; ++u) accumulate_chunk<W, NW, R>(chunk[u], x, rows, base + u * stride, acc);
    }
    for (; base + Chunk::kSize <= k; base += stride) {
      Chunk chunk[NW];
#pragma unroll
      for (int j = 0; j < NW; ++j) chunk[j].load(w[j], base);
      accumulate_chunk<W, NW, R>(chunk, x, rows, base, acc);
    }
  } else {
    for (int i = lane; i < k; i += 32) {
#pragma unroll
      for (int r = 0; r < R; ++r) {
        if (r >= rows) break;
        const float xv = x[r][i];
#pragma unroll
        for (int j = 0; j < NW; ++j) acc[r][j] = fmaf(xv, Chunk::value(w[j], i), acc[r][j]);
      }
    }
  }
  warp_sum_rows(acc, rows);
}

}  // namespace moet::cuda
