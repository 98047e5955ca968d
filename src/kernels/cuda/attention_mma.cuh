// Device building blocks of the tensor-core attention kernels (prefill_attention.cu,
// splitk_attention.cu): ldmatrix, the exact three-piece BF16 split of FP32 operands, and one
// 16-key step of the online softmax over an m16n8k16 accumulator (two n-tiles of 8 keys), whose
// layout is the A layout of P for P V. Row g and g + 8 of an MMA (lane = 4 g + c) are the rows a
// lane holds; its columns are 2c, 2c + 1 (+ 8 in the second n-tile).
#pragma once

#include "kernels/cuda/cp_async.cuh"

#include <cuda_bf16.h>

#include <cstdint>

namespace moet::cuda {

constexpr int kPieces = 3;  // BF16 pieces per FP32 operand

// Four 8x8 BF16 matrices whose rows lanes 8i..8i+7 address (matrix i into r[i]); .trans gives
// each lane column elements instead of row elements.
template <bool Trans>
__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], const __nv_bfloat16* row) {
  if constexpr (Trans) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(shared_address(row)));
  } else {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(shared_address(row)));
  }
}

__device__ __forceinline__ uint32_t bits(__nv_bfloat162 v) { return *reinterpret_cast<const uint32_t*>(&v); }

// The three BF16 pieces of the pair (x, y), x in the low half of each word (the lower k / column
// index of an MMA fragment register): hi = bf16(x), mid = bf16(x - hi), lo = bf16(x - hi - mid),
// exactly x = hi + mid + lo for finite x.
__device__ __forceinline__ void split_pair(float x, float y, uint32_t (&out)[kPieces]) {
  const __nv_bfloat162 hi = __floats2bfloat162_rn(x, y);
  const float x1 = x - __low2float(hi), y1 = y - __high2float(hi);  // exact
  const __nv_bfloat162 mid = __floats2bfloat162_rn(x1, y1);
  const __nv_bfloat162 lo = __floats2bfloat162_rn(x1 - __low2float(mid), y1 - __high2float(mid));  // exact
  out[0] = bits(hi);
  out[1] = bits(mid);
  out[2] = bits(lo);
}

// One 16-key step of an online softmax: s (scaled scores of n-tiles 0 and 1, -inf where masked)
// becomes P = exp(s - m) with m the rows' new maxima (the 4 lanes of a row: an xor-shuffle tree);
// l (this lane's share of the rows' sums) is rescaled and P added in key order; alpha =
// exp(m_old - m_new) is what O must be rescaled by. m must be finite after a row's first step (the
// step sees one of its keys); a later step that sees none keeps m (alpha 1, P 0).
__device__ __forceinline__ void online_softmax_step(float (&s)[2][4], float (&m)[2], float (&l)[2],
                                                    float (&alpha)[2]) {
  float tile_max[2] = {-INFINITY, -INFINITY};
#pragma unroll
  for (int n = 0; n < 2; ++n)
#pragma unroll
    for (int e = 0; e < 4; ++e) tile_max[e >> 1] = fmaxf(tile_max[e >> 1], s[n][e]);
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    tile_max[i] = fmaxf(tile_max[i], __shfl_xor_sync(0xffffffffu, tile_max[i], 1));
    tile_max[i] = fmaxf(tile_max[i], __shfl_xor_sync(0xffffffffu, tile_max[i], 2));
    const float m_new = fmaxf(m[i], tile_max[i]);
    alpha[i] = expf(m[i] - m_new);
    m[i] = m_new;
    l[i] = __fmul_rn(l[i], alpha[i]);
  }
#pragma unroll
  for (int n = 0; n < 2; ++n)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      s[n][e] = expf(s[n][e] - m[e >> 1]);  // 0 where masked
      l[e >> 1] = __fadd_rn(l[e >> 1], s[n][e]);
    }
}

// P's A fragments (per piece) for P V from the accumulator layout: a0 / a1 (rows g / g + 8) from
// n-tile 0, a2 / a3 from n-tile 1.
__device__ __forceinline__ void p_pieces(const float (&p)[2][4], uint32_t (&pf)[kPieces][4]) {
#pragma unroll
  for (int n = 0; n < 2; ++n)
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      uint32_t split[kPieces];
      split_pair(p[n][2 * i], p[n][2 * i + 1], split);
#pragma unroll
      for (int piece = 0; piece < kPieces; ++piece) pf[piece][2 * n + i] = split[piece];
    }
}

// O's n-tile o <- o * alpha (per row) + t, rounded FP32 operations.
__device__ __forceinline__ void rescale_add(float (&o)[4], const float (&t)[4], const float (&alpha)[2]) {
#pragma unroll
  for (int e = 0; e < 4; ++e) o[e] = __fadd_rn(__fmul_rn(o[e], alpha[e >> 1]), t[e]);
}

}  // namespace moet::cuda
