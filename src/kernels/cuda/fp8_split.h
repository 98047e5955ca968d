// FP8-block weights as the tensor-core GEMM takes them (backend/cuda/dense_gemm.h): rows
// [row_begin, row_begin + rows) of an FP8-block weight [n, k] (e4m3 codes, one F32 scale per
// 128x128 block, scales [ceil(n/128), ceil(k/128)]) decoded to their exact F32 values
// w = code * scale (the code exact, the product rounded once to F32: the values of the CPU's
// fp8_block_decode_row) and split into two BF16 pieces, hi = bf16(w) and lo = bf16(w - hi)
// (bf16_split.cuh), into hi [rows, k] and lo [rows, k]. Bit for bit kernels/cpu/fp8_matmul.h's
// fp8_block_split_bf16, except the payload bits of NaN codes. A pure function of its inputs.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace moet::cuda {

// Requires k % 8 == 0, `codes` 8-byte aligned and hi, lo 16-byte aligned (each thread converts 8
// consecutive codes of a row, which never straddle a scale block since 128 % 8 == 0).
void fp8_block_split_bf16_launch(const uint8_t* codes, const float* scales, int64_t k, int64_t row_begin,
                                 int64_t rows, uint16_t* hi, uint16_t* lo, cudaStream_t stream);

}  // namespace moet::cuda
