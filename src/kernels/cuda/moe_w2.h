// The W2 tensor-core path of moe_launch (moe_w2.cu): prepare (grouping + activation split),
// gate_up and down, chained with programmatic dependent launch on sm_90. Expert pointers of
// MoeArgs::table point at tiled planes (w2_tiles.h); x_split / act_split are the scratch planes.
#pragma once

#include "kernels/cuda/moe.h"
#include "kernels/cuda/w2_tiles.h"

namespace moet::cuda {

// Item pairs per pass of the product kernels (1, 2 or 4; a pass covers one expert's weights once
// for up to 2 * pairs of its items), chosen by best_pass_items (pass_size.h): 1 for decode batches
// over many experts (most active experts get one item), 4 for large batches.
int w2_pairs_per_pass(int64_t rows, int64_t top_k, int64_t experts);

// Scratch sizes of the W2 fields of MoeArgs for a batch of `rows` (moe.h), and the product
// kernels' pass size: the prefill kernels' (moe_w2_prefill.h) when experts average enough items,
// except in a decode-like step (row_invariant: the decode kernels, whose bits for an item do not
// depend on the batch when MoeArgs::whole_tile_blocks is set).
struct W2Scratch {
  int64_t passes, tile_counters, partial_floats;
  int32_t pass_items;
};
W2Scratch moe_w2_scratch(int64_t rows, int64_t top_k, int64_t experts, int64_t hidden, int64_t inner,
                         bool row_invariant);

void moe_w2_launch(const MoeArgs& a, cudaStream_t stream);

// 16-row tiles and 128-column chunks of the gate_up (true) or down product of a (w2_tiles.h).
struct W2ProductShape {
  int64_t tiles, chunks;
};
__host__ __device__ inline W2ProductShape w2_product_shape(const MoeArgs& a, bool gate_up) {
  return gate_up ? W2ProductShape{a.inner / 8, a.hidden_padded / kW2ChunkCols}
                 : W2ProductShape{a.hidden / kW2TileRows, a.inner_padded / kW2ChunkCols};
}

}  // namespace moet::cuda
