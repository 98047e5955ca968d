// The inner loop of the MXFP4 expert products on CUDA cores (docs/formats.md, section 2; W2 runs
// on tensor cores instead: moe_w2.cu). The block format is a template parameter: one warp
// computes NW output columns for up to R FP32 activation rows. Each lane owns whole blocks of 32
// weights (block b, b + 32, ...): it loads the block's codes (16 bytes of e2m1, one coalesced
// load per column) and its UE8M0 scale, decodes the codes in registers with byte permutes (prmt)
// against lookup tables held in immediates, sums level * x over the block in FP32
// and then multiplies by the exact power-of-two scale, as the CPU kernels do. Decoding is done
// once per weight, however many rows use it. The summation order depends only on k (fixed lane
// ownership of blocks, then a fixed xor-shuffle tree): bit-identical run to run.
//
// Decoding (no shared memory, no local arrays): per four nibbles, two prmt give the two top bytes
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

template <int kBits> struct QuantCodes;

template <> struct QuantCodes<4> {  // one block of 32 e2m1 nibbles: 16 bytes, low nibble = even k
  uint4 v;
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
template <int kBits, int NW, int R>
__device__ __forceinline__ void quant_warp_dot(const float* const (&x)[R], int rows, const uint8_t* const (&codes)[NW],
                                               const uint8_t* const (&scales)[NW], int k, float (&acc)[R][NW]) {
  constexpr int kBlockBytes = 32 * kBits / 8;
  const int lane = threadIdx.x & 31;
#pragma unroll
  for (int r = 0; r < R; ++r)
#pragma unroll
    for (int j = 0; j < NW; ++j) acc[r][j] = 0.0f;
  const int blocks = k / 32;
  auto process = [&](const QuantCodes<kBits> (&q)[NW], const uint32_t (&s)[NW], int b) {
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
      const float scale = ue8m0_value(s[j]);
#pragma unroll
      for (int r = 0; r < R; ++r) acc[r][j] = fmaf(part[r][j], scale, acc[r][j]);
    }
  };
  int b = lane;
  for (; b + 32 < blocks; b += 64) {  // two blocks per column in flight
    QuantCodes<kBits> q0[NW], q1[NW];
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
    QuantCodes<kBits> q0[NW];
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
