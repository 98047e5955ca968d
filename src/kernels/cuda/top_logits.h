// The k best logits of each row on the GPU, bit-identical to kernels/cpu/top_logits.h (same
// order: larger value first, ties to the lower id, -0 as +0, NaN below -inf; values copied bit for
// bit). A row is cut into chunks of 4096 logits, one block each, which keep their best min(k, len)
// (a radix select on distinct 64-bit rank keys); the survivors of a row are cut again the same way
// until one chunk is left, whose block sorts its k best and writes them. Launch shapes depend only
// on (rows, vocab, k) and nothing synchronises with the host, so a forward ending in this op can be
// captured in a CUDA graph; the result does not depend on scheduling (distinct keys, and every
// output position is fixed by a block-wide scan).
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

namespace moet::cuda {

constexpr int64_t kTopLogitsMaxK = 256;
constexpr int64_t kTopLogitsMaxRows = 65535;  // one grid row per logit row

// Device bytes the launch needs as workspace for these shapes (0 for a vocabulary of one chunk).
size_t top_logits_workspace_bytes(int64_t rows, int64_t vocab, int64_t k);
// values / ids [rows, k] from logits [rows, vocab]; 1 <= k <= min(vocab, kTopLogitsMaxK) and
// rows <= kTopLogitsMaxRows (the caller checks); workspace 16-byte aligned.
void top_logits_launch(const float* logits, int64_t rows, int64_t vocab, int64_t k, void* workspace, float* values,
                       int32_t* ids, cudaStream_t stream);

}  // namespace moet::cuda
