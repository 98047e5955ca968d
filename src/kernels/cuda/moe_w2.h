// The W2 tensor-core path of moe_launch (moe_w2.cu): prepare (grouping + activation split),
// gate_up and down, chained with programmatic dependent launch on sm_90. Expert pointers of
// MoeArgs::table point at tiled planes (w2_tiles.h); x_split / act_split are the scratch planes.
#pragma once

#include "kernels/cuda/moe.h"

namespace moet::cuda {

// Item pairs per pass of the product kernels (1, 2 or 4; a pass covers one expert's weights once
// for up to 2 * pairs of its items): the count with the least expected time for a batch of `rows`
// when each row's items go to top_k of `experts` uniformly at random, so an expert's item count is
// Binomial(rows, top_k / experts) and it takes ceil(n / (2 * pairs)) passes. Decode batches get
// 1 (most active experts have one item), large batches 4.
int w2_pairs_per_pass(int64_t rows, int64_t top_k, int64_t experts);

// Scratch sizes of the W2 fields of MoeArgs for a batch of `rows` (moe.h).
struct W2Scratch {
  int64_t passes, tile_counters, partial_floats;
  int32_t pass_items;
};
W2Scratch moe_w2_scratch(int64_t rows, int64_t top_k, int64_t experts, int64_t hidden, int64_t inner);

void moe_w2_launch(const MoeArgs& a, cudaStream_t stream);

}  // namespace moet::cuda
