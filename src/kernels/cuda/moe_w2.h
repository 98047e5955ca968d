// The W2 tensor-core path of moe_launch (moe_w2.cu): prepare (grouping + activation split),
// gate_up and down, chained with programmatic dependent launch on sm_90. Expert pointers of
// MoeArgs::table point at tiled planes (w2_tiles.h); x_split / act_split are the scratch planes.
#pragma once

#include "kernels/cuda/moe.h"

namespace moet::cuda {

void moe_w2_launch(const MoeArgs& a, unsigned max_active, cudaStream_t stream);

// Launches kernel(a) so that it may start while the stream's previous kernel finishes
// (programmatic dependent launch, sm_90+; a plain launch before): the kernel must call
// pdl_wait() (w2_mma.cuh) before reading what its predecessor wrote.
void launch_dependent(void (*kernel)(MoeArgs), dim3 grid, dim3 block, size_t shared, const MoeArgs& a,
                      cudaStream_t stream);

}  // namespace moet::cuda
