// Dense products with FP8-block weights (DeepSeek-V3 / Kimi-K2 / GLM-FP8 checkpoints, kept as
// stored): y[t, n] = sum_k x[t, k] * W[n, k] (+ bias[n]) with W = e4m3 codes [N, K] times F32
// block scales [ceil(N/128), ceil(K/128)]. Each thread decodes a weight row once into F32 (a
// 256-entry table, times the block's scale: one F32 product, the exact value the loader's decode
// to F32 stores) and dots it with every x row through dot_f32 (FP32 accumulation). So y is bit for
// bit matmul_f32 over the decoded weights: independent of the thread count and the rows in x.
#pragma once

#include "core/thread_pool.h"
#include "core/cpu_isa.h"

#include <cstdint>

namespace moet {

void matmul_fp8_block(const float* x, int64_t rows, int64_t k, const uint8_t* codes, const float* scales,
                      int64_t n, const float* bias, float* y, ThreadPool& pool, CpuIsa isa);

// Row `row` of an FP8-block weight [n, k] (codes of the whole matrix, its scales) as F32 into out[0, k).
void fp8_block_decode_row(const uint8_t* codes, const float* scales, int64_t row, int64_t k, float* out);

// Rows [row_begin, row_begin + rows) of an FP8-block weight [n, k] decoded (fp8_block_decode_row)
// and split into BF16 pieces (elementwise.h's split_bf16) into hi [rows, k] and lo [rows, k]: the
// reference of the CUDA split that feeds the tensor-core GEMM (kernels/cuda/fp8_split.h).
void fp8_block_split_bf16(const uint8_t* codes, const float* scales, int64_t k, int64_t row_begin, int64_t rows,
                          uint16_t* hi, uint16_t* lo);

}  // namespace moet
