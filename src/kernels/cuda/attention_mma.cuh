// Device building blocks of the tensor-core attention kernels (prefill_attention.cu,
// splitk_attention.cu, splitk_mla_attention.cu): ldmatrix, the exact three-piece BF16 split of
// FP32 operands (a query's A fragments), Q K^T and P V over 16 staged keys, FP8 codes as BF16, and
// one 16-key step of the online softmax over an m16n8k16 accumulator (two n-tiles of 8 keys),
// whose layout is the A layout of P for P V. Row g and g + 8 of an MMA (lane = 4 g + c) are the
// rows a lane holds; its columns are 2c, 2c + 1 (+ 8 in the second n-tile).
#pragma once

#include "core/paged_kv.h"
#include "kernels/cuda/cp_async.cuh"
#include "kernels/cuda/w2_mma.cuh"

#include <cuda_bf16.h>
#include <cuda_fp8.h>

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

// O's n-tile o <- o * alpha (per row) + t, rounded FP32 operations.
__device__ __forceinline__ void rescale_add(float (&o)[4], const float (&t)[4], const float (&alpha)[2]) {
#pragma unroll
  for (int e = 0; e < 4; ++e) o[e] = __fadd_rn(__fmul_rn(o[e], alpha[e >> 1]), t[e]);
}

// The A fragments (per piece) of one k-step of 16 query columns from d0: row_g / row_g8 are the
// lane's rows g and g + 8 (null: a zero row). a0: row g, a1: row g + 8, a2 / a3: columns + 8.
__device__ __forceinline__ void q_pieces(const float* row_g, const float* row_g8, int d0,
                                         uint32_t (&q)[kPieces][4]) {
  const int c = int(threadIdx.x) & 3;
#pragma unroll
  for (int reg = 0; reg < 4; ++reg) {
    const float* src = reg & 1 ? row_g8 : row_g;
    const int d = d0 + 8 * (reg >> 1) + 2 * c;
    uint32_t split[kPieces];
    split_pair(src ? src[d] : 0.0f, src ? src[d + 1] : 0.0f, split);
#pragma unroll
    for (int piece = 0; piece < kPieces; ++piece) q[piece][reg] = split[piece];
  }
}

// Adds Q K^T of 16 staged BF16 key rows (`pitch` values apart) to s_hi (Q's hi piece) and
// s_small (its mid and lo pieces), k-steps [K0, K1) of q at columns k_rows + 16 (ks - K0).
template <int K0, int K1, int KSteps>
__device__ __forceinline__ void qk_16keys(const __nv_bfloat16* k_rows, int pitch,
                                          const uint32_t (&q)[KSteps][kPieces][4], float (&s_hi)[2][4],
                                          float (&s_small)[2][4]) {
  const int lane = int(threadIdx.x) & 31;
  const __nv_bfloat16* at = k_rows + ((lane & 7) + 8 * (lane >> 4)) * pitch + 8 * ((lane >> 3) & 1);
#pragma unroll
  for (int ks = K0; ks < K1; ++ks) {
    uint32_t kb[4];  // keys 0-7 (d, d + 8), keys 8-15 (d, d + 8)
    ldmatrix_x4<false>(kb, at + 16 * (ks - K0));
#pragma unroll
    for (int n = 0; n < 2; ++n) {
      mma_bf16_16816(s_hi[n], q[ks][0][0], q[ks][0][1], q[ks][0][2], q[ks][0][3], kb[2 * n], kb[2 * n + 1]);
#pragma unroll
      for (int p = 1; p < kPieces; ++p)
        mma_bf16_16816(s_small[n], q[ks][p][0], q[ks][p][1], q[ks][p][2], q[ks][p][3], kb[2 * n], kb[2 * n + 1]);
    }
  }
}

// O = O * alpha + P V over 16 staged BF16 value rows (`pitch` values apart), columns
// v_rows[0, Dims) into o's n-tiles (P's A fragments per piece).
template <int Dims>
__device__ __forceinline__ void pv_16keys(const __nv_bfloat16* v_rows, int pitch, const uint32_t (&pf)[kPieces][4],
                                          const float (&alpha)[2], float (&o)[Dims / 8][4]) {
  const int lane = int(threadIdx.x) & 31;
#pragma unroll
  for (int vg = 0; vg < Dims / 16; ++vg) {
    uint32_t vb[4];  // columns d..d+7 (keys 0-7, 8-15), then d+8..d+15
    ldmatrix_x4<true>(vb, v_rows + (lane & 15) * pitch + 16 * vg + 8 * (lane >> 4));
    float t[2][4] = {};  // one k-step: its MMAs share a fresh accumulator
#pragma unroll
    for (int n = 0; n < 2; ++n)
#pragma unroll
      for (int p = 0; p < kPieces; ++p)
        mma_bf16_16816(t[n], pf[p][0], pf[p][1], pf[p][2], pf[p][3], vb[2 * n], vb[2 * n + 1]);
#pragma unroll
    for (int n = 0; n < 2; ++n) rescale_add(o[2 * vg + n], t[n], alpha);
  }
}

// Two FP8 codes (the low byte first) as two BF16 values in one word (exact: half, then BF16).
template <KvDtype T>
__device__ __forceinline__ uint32_t fp8x2_to_bf16x2(uint32_t codes) {
  const __half2_raw h = __nv_cvt_fp8x2_to_halfraw2(__nv_fp8x2_storage_t(codes & 0xffffu),
                                                   T == KvDtype::fp8_e5m2 ? __NV_E5M2 : __NV_E4M3);
  const float2 f = __half22float2(__half2(h));
  return bits(__floats2bfloat162_rn(f.x, f.y));
}

// Sixteen FP8 codes (a 16-byte load) as sixteen BF16 values (a 32-byte store).
template <KvDtype T>
__device__ __forceinline__ void fp8x16_to_bf16(const uint8_t* codes, __nv_bfloat16* values) {
  const uint4 w = *reinterpret_cast<const uint4*>(codes);
  const uint32_t words[4] = {w.x, w.y, w.z, w.w};
  uint32_t out[8];
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    out[2 * i] = fp8x2_to_bf16x2<T>(words[i]);
    out[2 * i + 1] = fp8x2_to_bf16x2<T>(words[i] >> 16);
  }
  reinterpret_cast<uint4*>(values)[0] = make_uint4(out[0], out[1], out[2], out[3]);
  reinterpret_cast<uint4*>(values)[1] = make_uint4(out[4], out[5], out[6], out[7]);
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

}  // namespace moet::cuda
