// The W2 tensor-core path of moe_launch (moe_w2.cu): prepare (grouping + activation split),
// gate_up and down, chained with programmatic dependent launch on sm_90. Expert pointers of
// MoeArgs::table point at tiled planes (w2_tiles.h); x_split / act_split are the scratch planes.
#pragma once

#include "kernels/cuda/moe.h"

namespace moet::cuda {

// Scratch sizes of the W2 fields of MoeArgs for a batch of `rows` (moe.h).
struct W2Scratch {
  int64_t passes, tile_counters, partial_floats;
  int32_t pass_items;
};
W2Scratch moe_w2_scratch(int64_t rows, int64_t top_k, int64_t experts, int64_t hidden, int64_t inner);

// Launches the W2 products; true when they also wrote `out` (batch 1 runs fused: grouping,
// gate_up, down and combine in one launch), false when moe.cu's combine must follow.
bool moe_w2_launch(const MoeArgs& a, cudaStream_t stream);

// Whether batch 1 may take the fused launch (default true); the multi-launch path computes the
// same bits, which the tests check by switching this off.
void moe_w2_set_fused_decode(bool enabled);

}  // namespace moet::cuda
