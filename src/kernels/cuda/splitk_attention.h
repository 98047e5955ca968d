// Split-K (flash-decoding) decode attention on the tensor cores over BF16 and FP8 (e4m3, e5m2)
// GQA caches, with the semantics of kernels/cpu/attention.h: query row t, head h sees keys
// 0..positions[t] of its sequence through the block table. Serves separate K and V caches with
// k_dim == v_dim of 128 and up to 16 query heads per KV head, or a multiple of 16
// (splitk_attention_supports); F32 caches and other shapes stay on attention_launch
// (attention.h), which gives a row different last bits. MLA latents (576 / 512) in BF16, FP8 or
// NVFP4 under a multiple of 16 query heads have their own split-K kernel with the same contracts
// (splitk_mla_attention_*, splitk_mla_attention.cu describes it).
//
// A block serves one row, the H <= 16 query heads of one KV head (the rows of its m16n8k16
// MMAs, so the cache is read once for all of them) and one split of the row's keys. Keys per
// split depend only on the row's own key count (splitk_plan.cuh: at least 128 keys, at most 64
// splits), so a row's bits depend neither on the other rows of the step, nor on the batch size,
// nor on the launch the rows are cut into; a second kernel (splitk_fold.cu) folds each row's
// splits in order. Nothing is sized by a host-side key count beyond
// max_keys (the table stride bucket), so captured graphs stay valid as contexts grow.
//
// Numerics: every cache value is exact in BF16 (a BF16 value; an FP8 code, whose F32 scale per
// token and head multiplies the score, and for V is folded into P), so only the query and the
// softmax weights P are split into three BF16 pieces (FP32-level products; two pieces miss the
// CPU tolerance, prefill_attention.cu explains). Differs from the CPU by summation order only.
#pragma once

#include "kernels/cuda/attention.h"

#include <cuda_runtime_api.h>

#include <cstdint>

namespace moet::cuda {

// Whether the split-K kernel serves this cache and query layout (and the device gives a block its
// shared memory).
bool splitk_attention_supports(const PagedKvArgs& cache, int64_t q_heads);
// Scratch floats `a.partials` must hold (0: no row of a.max_keys keys splits).
int64_t splitk_attention_partial_floats(const AttentionArgs& a);
// Attention of a.rows decode rows (a.row_ids as in attention_launch; a.counters unused). Several
// launches when the rows' partials exceed the cap.
void splitk_attention_launch(const AttentionArgs& a, cudaStream_t stream);

// The MLA kernel's, as the three above.
bool splitk_mla_attention_supports(const PagedKvArgs& cache, int64_t q_heads);
int64_t splitk_mla_attention_partial_floats(const AttentionArgs& a);
void splitk_mla_attention_launch(const AttentionArgs& a, cudaStream_t stream);

}  // namespace moet::cuda
