// The W2 expert products for batches whose experts get many items each (prefill): a block
// decodes a tile of an expert's weights once and multiplies it with up to kW2PrefillPassItems
// items (moe_w2_prefill.cu). Chosen by moe_w2_scratch (moe_w2.h) through MoeArgs::pass_items;
// prepare and the combine are the decode path's.
#pragma once

#include "kernels/cuda/moe.h"

namespace moet::cuda {

constexpr int32_t kW2PrefillPassItems = 64;
// Average items per active expert from which the prefill kernels are used.
constexpr int64_t kW2PrefillMinItemsPerExpert = 32;

// Whether this GPU gives a block the kernels' shared memory (about 102 KiB: not sm_120's 99 KiB).
bool w2_prefill_fits();
// gate_up then down, as programmatic dependent launches after prepare.
void w2_prefill_products(const MoeArgs& a, cudaStream_t stream);

}  // namespace moet::cuda
