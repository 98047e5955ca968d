// The inner loop of the MXFP4 and W2K expert products on CUDA cores (docs/formats.md; W2 runs on
// tensor cores instead: moe_w2.cu). The block format is a template parameter (a Codes type: its
// bytes per block, load, decode of eight weights, scale byte value): one warp computes NW output
// columns for up to R FP32 activation rows. Each lane owns whole blocks of 32 weights (block b,
// b + 32, ...): it loads the block's codes (MXFP4: 16 bytes of e2m1; W2K: four 16-bit E8
// codewords, 8 bytes) and its scale byte, decodes the codes in registers, sums level * x over the
// block in FP32 and then multiplies by the block's scale, as the CPU kernels do. Decoding is done
// once per weight, however many rows use it. The summation order depends only on k (fixed lane
// ownership of blocks, then a fixed xor-shuffle tree): bit-identical run to run.
//
// MXFP4 decoding (no shared memory, no local arrays): per four nibbles, two prmt give the two top bytes
// of the magnitude {0, .5, ..., 6}, a third (sign-replicating selector nibbles) gives the signs; one prmt per two weights interleaves
// them into two BF16-like halves, unpacked with an AND and a shift.
#pragma once

#include "kernels/cuda/block_reduce.cuh"

#include <cstdint>

namespace moet::cuda {

__device__ __forceinline__ uint32_t prmt(uint32_t a, uint32_t b, uint32_t selector) {
  uint32_t d;
  asm("prmt.b32 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(selector));
  return d;
}

// 2^(byte - 127) (byte 0 is the subnormal 2^-127), as kernels/cpu/w2_matmul.h.
__device__ __forceinline__ float ue8m0_value(uint32_t byte) {
  return __uint_as_float(byte == 0 ? 0x00400000u : byte << 23);
}

struct Mxfp4Codes {  // one block of 32 e2m1 nibbles: 16 bytes, low nibble = even k
  static constexpr int kBits = 4;
  uint4 v;
  __device__ __forceinline__ static float scale(uint32_t byte) { return ue8m0_value(byte); }
  __device__ __forceinline__ void load(const uint8_t* p) { v = __ldg(reinterpret_cast<const uint4*>(p)); }
  __device__ __forceinline__ void decode(int c, float (&f)[8]) const {
    const uint32_t word = c == 0 ? v.x : c == 1 ? v.y : c == 2 ? v.z : v.w;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const uint32_t nib = word >> (16 * h);
      const uint32_t mag = nib & 0x7777u;
      const uint32_t hi = prmt(0x3F3F3F00u, 0x40404040u, mag);  // top byte of |e2m1|
      const uint32_t lo = prmt(0xC0800000u, 0xC0804000u, mag);  // second byte
      const uint32_t sign = prmt(0x80u, 0u, nib & 0x8888u);     // 0xFF where the sign is set, else 0x80
      const uint32_t top = hi | ((sign << 7) & 0x80808080u);
      const uint32_t p01 = prmt(top, lo, 0x0415u), p23 = prmt(top, lo, 0x2637u);
      f[4 * h + 0] = __uint_as_float(p01 & 0xFFFF0000u);
      f[4 * h + 1] = __uint_as_float(p01 << 16);
      f[4 * h + 2] = __uint_as_float(p23 & 0xFFFF0000u);
      f[4 * h + 3] = __uint_as_float(p23 << 16);
    }
  }
};

// acc[r][j] = sum_k x[r][k] * W_j[k] for r < rows, complete in every lane on return. codes[j] and
// scales[j] are the rows of column j (k * bits / 8 and k / 32 bytes); k % 32 == 0; x rows 16-byte
// aligned.
// W2K (formats/w2k.h): four little-endian 16-bit codewords (8 bytes), codeword c = weights
// 8c..8c+7. Weight j = (sign_j (h_j + 1/2) + shift) with h_j two bits of the grid entry, the eighth
// sign from the parity rule (popcount of the seven sign bits plus the number of h_j = 1). The grid
// (512 bytes, formats/w2k_grid.inc) is read through the read-only cache.
__device__ const uint16_t kW2kGridDevice[256] = {
#include "formats/w2k_grid.inc"
};

struct W2kCodes {
  static constexpr int kBits = 2;
  uint2 v;
  __device__ __forceinline__ static float scale(uint32_t byte) {  // UE5M3: (1 + m/8) 2^(e - 24)
    return byte >= 8 ? __uint_as_float(((byte >> 3) + 103u) << 23 | (byte & 7u) << 20) : float(byte) * 0x1p-26f;
  }
  __device__ __forceinline__ void load(const uint8_t* p) { v = __ldg(reinterpret_cast<const uint2*>(p)); }
  __device__ __forceinline__ void decode(int c, float (&f)[8]) const {
    const uint32_t word = c < 2 ? v.x : v.y;
    const uint32_t code = (c & 1) ? word >> 16 : word & 0xffffu;
    const uint32_t grid = __ldg(kW2kGridDevice + (code & 0xffu));
    const uint32_t signs7 = (code >> 8) & 0x7fu;
    const uint32_t signs = signs7 | ((__popc(signs7) + __popc(grid & 0x5555u)) & 1u) << 7;
    const float shift = (code & 0x8000u) ? -0.25f : 0.25f;
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      const float m = float((grid >> (2 * j)) & 3u) + 0.5f;
      f[j] = ((signs >> j) & 1u) ? shift - m : shift + m;
    }
  }
};

template <typename Codes, int NW, int R>
__device__ __forceinline__ void quant_warp_dot(const float* const (&x)[R], int rows, const uint8_t* const (&codes)[NW],
                                               const uint8_t* const (&scales)[NW], int k, float (&acc)[R][NW]) {
  constexpr int kBlockBytes = 32 * Codes::kBits / 8;
  const int lane = threadIdx.x & 31;
#pragma unroll
  for (int r = 0; r < R; ++r)
#pragma unroll
    for (int j = 0; j < NW; ++j) acc[r][j] = 0.0f;
  const int blocks = k / 32;
  auto process = [&](const Codes (&q)[NW], const uint32_t (&s)[NW], int b) {
    float part[R][NW];
#pragma unroll
    for (int r = 0; r < R; ++r)
#pragma unroll
      for (int j = 0; j < NW; ++j) part[r][j] = 0.0f;
#pragma unroll
    for (int c = 0; c < 4; ++c) {
      float f[NW][8];
#pragma unroll
      for (int j = 0; j < NW; ++j) q[j].decode(c, f[j]);
#pragma unroll
      for (int r = 0; r < R; ++r) {
        if (r >= rows) break;
        const float4 x0 = *reinterpret_cast<const float4*>(x[r] + b * 32 + c * 8);
        const float4 x1 = *reinterpret_cast<const float4*>(x[r] + b * 32 + c * 8 + 4);
        const float xv[8] = {x0.x, x0.y, x0.z, x0.w, x1.x, x1.y, x1.z, x1.w};
#pragma unroll
        for (int j = 0; j < NW; ++j)
#pragma unroll
          for (int i = 0; i < 8; ++i) part[r][j] = fmaf(xv[i], f[j][i], part[r][j]);
      }
    }
#pragma unroll
    for (int j = 0; j < NW; ++j) {
      const float scale = Codes::scale(s[j]);
#pragma unroll
      for (int r = 0; r < R; ++r) acc[r][j] = fmaf(part[r][j], scale, acc[r][j]);
    }
  };
  int b = lane;
  for (; b + 32 < blocks; b += 64) {  // two blocks per column in flight
    Codes q0[NW], q1[NW];
    uint32_t s0[NW], s1[NW];
#pragma unroll
    for (int j = 0; j < NW; ++j) {
      q0[j].load(codes[j] + int64_t(b) * kBlockBytes);
      q1[j].load(codes[j] + int64_t(b + 32) * kBlockBytes);
      s0[j] = __ldg(scales[j] + b);
      s1[j] = __ldg(scales[j] + b + 32);
    }
    process(q0, s0, b);
    process(q1, s1, b + 32);
  }
  if (b < blocks) {
    Codes q0[NW];
    uint32_t s0[NW];
#pragma unroll
    for (int j = 0; j < NW; ++j) {
      q0[j].load(codes[j] + int64_t(b) * kBlockBytes);
      s0[j] = __ldg(scales[j] + b);
    }
    process(q0, s0, b);
  }
  warp_sum_rows(acc, rows);
}

}  // namespace moet::cuda
