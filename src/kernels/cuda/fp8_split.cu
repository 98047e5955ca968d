// The FP8-block weights' split into BF16 pieces (fp8_split.h): a grid-stride loop over groups of 8
// codes of a row, launched as a programmatic dependent launch (launch.cuh) that waits for the
// previous kernel before touching memory (the GEMMs before it may still read the pieces it
// overwrites).
#include "kernels/cuda/fp8_split.h"

#include "kernels/cuda/bf16_split.cuh"
#include "kernels/cuda/launch.cuh"

#include <cuda_fp16.h>
#include <cuda_fp8.h>

namespace moet::cuda {
namespace {

constexpr int kGroup = 8;        // codes per thread
constexpr int64_t kBlock = 128;  // columns (and rows) of one scale

// The exact value of an e4m3 code (every one is a half: 4 significand bits, exponents 2^-9..2^8).
__device__ __forceinline__ float e4m3_value(unsigned short half_bits) {
  __half_raw raw;
  raw.x = half_bits;
  return __half2float(__half(raw));
}

__global__ void fp8_block_split_kernel(const uint8_t* codes, const float* scales, int64_t k, int64_t row_begin,
                                       int64_t groups, uint16_t* hi, uint16_t* lo) {
  pdl_trigger();
  pdl_wait();
  const int64_t groups_per_row = k / kGroup, scale_cols = (k + kBlock - 1) / kBlock;
  for (int64_t g = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; g < groups; g += int64_t(gridDim.x) * blockDim.x) {
    const int64_t r = g / groups_per_row, col = (g - r * groups_per_row) * kGroup, row = row_begin + r;
    const uint2 packed = __ldg(reinterpret_cast<const uint2*>(codes + row * k + col));
    const float scale = __ldg(scales + (row / kBlock) * scale_cols + col / kBlock);
    const uint32_t words[2] = {packed.x, packed.y};
    uint32_t hi_words[kGroup / 2], lo_words[kGroup / 2];
#pragma unroll
    for (int i = 0; i < kGroup; i += 2) {  // codes i and i + 1: bytes i % 4 and i % 4 + 1 of a word
      const __half2_raw pair =
          __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(words[i / 4] >> (8 * (i % 4))), __NV_E4M3);
      uint16_t h0, l0, h1, l1;
      // __fmul_rn: the product rounded on its own, never fused with the split's subtraction.
      split_bf16_value(__fmul_rn(e4m3_value(pair.x), scale), h0, l0);
      split_bf16_value(__fmul_rn(e4m3_value(pair.y), scale), h1, l1);
      hi_words[i / 2] = uint32_t(h0) | (uint32_t(h1) << 16);
      lo_words[i / 2] = uint32_t(l0) | (uint32_t(l1) << 16);
    }
    const int64_t at = r * k + col;
    *reinterpret_cast<uint4*>(hi + at) = make_uint4(hi_words[0], hi_words[1], hi_words[2], hi_words[3]);
    *reinterpret_cast<uint4*>(lo + at) = make_uint4(lo_words[0], lo_words[1], lo_words[2], lo_words[3]);
  }
}

}  // namespace

void fp8_block_split_bf16_launch(const uint8_t* codes, const float* scales, int64_t k, int64_t row_begin,
                                 int64_t rows, uint16_t* hi, uint16_t* lo, cudaStream_t stream) {
  const int64_t groups = rows * (k / kGroup);
  launch_dependent_kernel<fp8_block_split_kernel>(dim3(grid_for(groups, 256)), dim3(256), 0, 1, stream, codes, scales,
                                                  k, row_begin, groups, hi, lo);
}

}  // namespace moet::cuda
