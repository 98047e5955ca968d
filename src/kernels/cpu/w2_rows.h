// W2 products of several activation rows against one weight matrix, each block of codes decoded
// once for up to kW2RowsPerPass rows: y[t, n] = sum_k x[t, k] * W[n, k] (W2, formats/mx_block.h).
// Every y element is computed with exactly the operations, in the order, of dot_w2 for that row
// (kernels/cpu/w2_matmul.h), so the results are matmul_w2's bit for bit on every isa; only the
// decoding is shared (the portable path runs dot_w2 per row). At the avx512 level two output
// columns share each instruction (w2_rows_avx512.cpp), each with the AVX2 level's operations, so
// avx512 and avx2 give the same bits too. The host experts of tiered residency
// (kernels/cpu/expert_ffn.h) use it: decode batches and prefill rows on the host cost about one
// row's decoding per pass instead of one per row. Parallel over output columns.
#pragma once

#include "core/cpu_isa.h"
#include "core/thread_pool.h"

#include <cstdint>

namespace moet {

constexpr int64_t kW2RowsPerPass = 4;

void matmul_w2_rows(const float* x, int64_t rows, int64_t k, const uint8_t* codes, const uint8_t* scales, int64_t n,
                    float* y, ThreadPool& pool, CpuIsa isa);

namespace avx2 {
// out[r] = dot_w2(x + r * k, codes, scales, k) for r < rows (1 <= rows <= kW2RowsPerPass).
void dot_w2_rows(const float* x, int64_t rows, const uint8_t* codes, const uint8_t* scales, int64_t k, float* out);
}  // namespace avx2

// The codes and scales of two weight rows (two output columns); the same row twice for a lone column.
struct W2ColumnPair {
  const uint8_t* codes[2];
  const uint8_t* scales[2];
};

namespace avx512 {
// out[2 r + j] = dot_w2(x + r * k, w.codes[j], w.scales[j], k) for r < rows (1 <= rows <=
// kW2RowsPerPass), j < 2, with avx2::dot_w2's bits.
void dot_w2_rows_pair(const float* x, int64_t rows, const W2ColumnPair& w, int64_t k, float* out);
}  // namespace avx512

}  // namespace moet
