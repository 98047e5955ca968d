// BF16 and FP8-block products of a few rows on the tensor cores (the arguments are gemv.h's): each
// warp computes a tile of 16 output columns over one slice of k with m16n8k16 MMAs, the weights
// (row-major, as stored; FP8 codes converted exactly to BF16 in registers) read straight from
// memory into B fragments and the FP32 activations split exactly into three BF16 terms in
// registers as A fragments. gemv_launch gives it the parts of a launch with BF16 weights and
// k % 32 == 0 or FP8-block ones (batch 1) and k % 64 == 0, at least kGemvMmaMinColumns columns
// (n * batch) and at least kGemvMmaMinRows rows (any number in a decode-like step,
// GemvArgs::row_invariant), on the vector path: measured on the H200 (docs/gpu-history.md, Runs
// 17-18), one row and small matrices (K/V projections, routers) are faster on the CUDA-core GEMV,
// 4 and 8 rows of the large ones here. Deterministic, and batch-invariant among the row counts it
// takes (gemv_mma.cu says why: rows go in passes of 16, each row's sums independent of the
// others); a row's bits differ between the two kernels.
#pragma once

#include "kernels/cuda/gemv.h"

namespace moet::cuda {

constexpr int64_t kGemvMmaMinRows = 4, kGemvMmaMinColumns = 2048;

// Whether gemv_launch gives this part of these arguments (on the vector path) to the tensor cores.
bool gemv_mma_takes(const GemvArgs& a, const GemvPart& part);
void gemv_mma_launch(const GemvArgs& a, cudaStream_t stream);

}  // namespace moet::cuda
