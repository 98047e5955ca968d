// The routed-expert part of an MoE layer on the GPU, with no host synchronisation:
//   1. moe_group: items (row * top_k + slot) are grouped by expert, experts in index order and
//      items in item order inside each (a stable counting sort), giving the active experts and
//      their item ranges;
//   2. gate_up: per active expert, act = silu(x @ gate^T) * (x @ up^T) for its gathered rows
//      (SiLU-and-mul fused into the product's epilogue);
//   3. down: per active expert, y_item = act @ down^T, written at the item's own position;
//   4. combine: out[row] = sum over the row's items in ascending expert order of weight * y_item
//      (a fixed order: deterministic, and the CPU's order).
// Expert weights are found through `table` (device memory, expert -> {gate_up, down} pointers),
// read at run time, so a residency manager may rewrite it between steps and captured graphs stay
// valid. Weights are BF16 or F32 (all experts of a layer alike); activations FP32.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace moet::cuda {

struct ExpertPointers {
  const void* gate_up;  // [2 * inner, hidden]
  const void* down;     // [hidden, inner]
};

struct MoeArgs {
  const float* x;               // [rows, hidden]
  const int32_t* expert_ids;    // [rows, top_k]
  const float* weights;         // [rows, top_k]
  const ExpertPointers* table;  // [experts]
  bool w_bf16;
  int64_t rows, top_k, experts, hidden, inner;
  // Scratch (device): order [rows*top_k], active [experts], ranges [experts + 1], count [1],
  // act [rows*top_k, inner], item_out [rows*top_k, hidden].
  int32_t* order;
  int32_t* active;
  int32_t* ranges;
  int32_t* active_count;
  float* act;
  float* item_out;
  float* out;                   // [rows, hidden]
};

void moe_launch(const MoeArgs& a, cudaStream_t stream);

}  // namespace moet::cuda
