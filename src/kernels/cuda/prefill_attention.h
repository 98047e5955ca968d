// Paged causal attention for prefill runs on the tensor cores (flash-attention style), with the
// semantics of kernels/cpu/attention.h: query row t, head h sees keys 0..positions[t] of its
// sequence through the block table. Serves GQA with separate K and V caches and head dims of 64 or
// 128, and MLA's latent cache (DeepSeek-V3, absorbed form: one KV head of k_dim 576, V aliasing
// the first 512 floats of each K row, query heads a multiple of 16) where the GPU gives a block
// enough shared memory (prefill_attention_supports); everything else, and decode rows, run on
// attention_launch (attention.h).
//
// Work unit: a query tile, up to prefill_attention_tile_rows() consecutive rows of one sequence
// with consecutive positions, times H query heads of one KV head (prefill_attention_slots()
// (row, head) slots: 64 for GQA, 16 per warp; 32 for MLA, 16 per group of 4 warps that split the
// columns of Q K^T and of O). The host lists the tiles (PrefillTile, in any order: each tile's
// result does not depend on the others) and the kernel streams the tile's keys in ascending tiles
// of 32 (MLA: 16) through shared memory, converting them to BF16 pieces on the way in (MLA's V
// from K's pieces); online softmax in FP32. Fixed reduction
// order, no atomics: bit-identical run to run. By construction a row's bits depend only on its
// query, position and keys (key tiles start at key 0 for every tile, keys past a row's position
// leave its state unchanged bit for bit, an MMA's output row depends only on its A row), not on
// its tile or the other rows (not tested yet); they differ in the last bits from
// attention_launch's for the same row.
#pragma once

#include "kernels/cuda/attention.h"

#include <cuda_runtime_api.h>

#include <cstdint>

namespace moet::cuda {

constexpr int64_t kPrefillSlots = 64;  // (row, head) slots of one GQA query tile (MLA: 32)

// One query tile: rows first_row .. first_row + rows - 1 of the step, of sequence `seq`, at
// positions first_position, first_position + 1, ...
struct PrefillTile {
  int32_t seq, first_row, rows, first_position;
};

// Whether the kernel serves this cache and query layout (GQA, separate K and V, k_dim == v_dim in
// {64, 128}, 16-byte aligned cache rows).
bool prefill_attention_supports(const PagedKvArgs& cache, int64_t q_heads);
// (row, head) slots of one query tile: kPrefillSlots for GQA, 32 for MLA.
int64_t prefill_attention_slots(const PagedKvArgs& cache);
// Query heads one tile serves (the largest power of two dividing the GQA group, at most the
// slots) and the rows it takes: slots / heads.
int64_t prefill_attention_heads(const PagedKvArgs& cache, int64_t q_heads);
inline int64_t prefill_attention_tile_rows(const PagedKvArgs& cache, int64_t q_heads) {
  return prefill_attention_slots(cache) / prefill_attention_heads(cache, q_heads);
}

// Attention of the rows of `tile_count` tiles (device array); a.positions, a.row_seq, a.rows,
// a.partials, a.counters and a.max_keys are not used (the tiles give the rows and positions).
void prefill_attention_launch(const AttentionArgs& a, const PrefillTile* tiles, int64_t tile_count,
                              cudaStream_t stream);

}  // namespace moet::cuda
