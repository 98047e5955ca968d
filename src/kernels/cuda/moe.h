// The routed-expert part of an MoE layer on the GPU, with no host synchronisation:
//   1. moe_group: items (row * top_k + slot) are grouped by expert, experts in index order and
//      items in item order inside each (a stable counting sort), giving the active experts and
//      their item ranges;
//   2. gate_up: per active expert, act = silu(x @ gate^T) * (x @ up^T) for its gathered rows
//      (SiLU-and-mul fused into the product's epilogue);
//   3. down: per active expert, y_item = act @ down^T, written at the item's own position;
//   4. combine: out[row] = sum over the row's items in ascending expert order of weight * y_item
//      (a fixed order: deterministic, and the CPU's order).
// W2 experts run on tensor cores instead (moe_w2.h: the same steps, grouping fused with the
// activation split, act never leaving its split form).
// Expert weights are found through `table` (device memory, expert -> {gate_up, down} pointers
// and, for the block formats, their scale planes), read at run time, so a residency manager may
// rewrite it between steps and captured graphs stay valid. An absent expert (not resident: an
// entry whose `present` is 0) points at a stand-in expert of the same layout: its items are
// grouped and computed like any other's, so the work of the present experts, and their bits, do
// not depend on what is absent, and the combine leaves them out, setting the expert's bit in
// absent_bits (and counting it) where a present one sets used_bits, and counting the routings.
// An entry served by the other table of a layer with an FP4 tier (`present` kServedElsewhere: the
// backend runs the op once per table, the second accumulating) is dropped from the grouping, so it
// costs nothing here; the first table's pass records it as used (routed_items[2]).
// An entry the host computes (`present` kHostComputed: tiered residency with --cpu-experts) is
// dropped from the grouping too; the combine adds its items' results from `host_results` (page-
// locked host memory the device reads directly, written by the host before the op's wait on its
// mailbox: host_mailbox.h) where `host_valid` says the host computed them, in the expert's place
// of the fixed order, and records the expert as used (its routings as not found on the device).
// moe_launch() runs the whole op; a layer with host entries runs moe_launch_products(), waits for
// the host, then moe_launch_combine() (per mailbox-sized range of rows: the pointers shifted).
// Weights are BF16, F32, W2, W2K or MXFP4 (all experts of one table alike; docs/formats.md: U8
// code planes [rows, cols * bits / 8], scale planes [rows, cols / 32]: UE8M0, W2K UE5M3);
// activations FP32, accumulation FP32. MXFP4 and W2K are decoded in registers (MXFP4: byte-permute
// lookup tables; W2K: its E8 grid, formats/w2k.h) and summed per block of 32 before the one
// multiply by the block's scale, as the CPU kernels do (kernels/cpu/w2_matmul.h); the W2
// tensor-core path puts the scale into the decoded weights' exponent instead (w2_mma.cuh).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace moet::cuda {

// Weight formats of MoeArgs::format (the values of moet::ExpertFormat).
enum MoeFormat : int32_t { kMoeDense = 0, kMoeW2 = 1, kMoeFp4 = 2, kMoeW2k = 3 };

// ExpertPointers::present: kAbsent (the pointers are a stand-in's), kPresent, kServedElsewhere
// (by the layer's other table; the pointers are a stand-in's) or kHostComputed (by the host).
enum ExpertPresence : int32_t { kAbsent = 0, kPresent = 1, kServedElsewhere = 2, kHostComputed = 3 };

struct ExpertPointers {
  const void* gate_up;            // [2 * inner, hidden] (dense) or codes [2 * inner, hidden * bits / 8]
  const void* down;               // [hidden, inner] (dense) or codes [hidden, inner * bits / 8]
  const uint8_t* gate_up_scales;  // block formats: [2 * inner, hidden / 32] scale bytes; else null
  const uint8_t* down_scales;     // block formats: [hidden, inner / 32] scale bytes; else null
  int32_t present;                // ExpertPresence
  int32_t reserved;
};

// One pass of a W2 product (moe_w2.h): its expert's planes and the item positions [first, end)
// of that expert, of which the pass takes the first 2P.
struct W2Pass {
  ExpertPointers expert;
  int32_t first, end;
};

struct MoeArgs {
  const float* x;               // [rows, hidden]
  const int32_t* expert_ids;    // [rows, top_k]
  const float* weights;         // [rows, top_k]
  const ExpertPointers* table;  // [experts]
  bool w_bf16;                  // dense weights: BF16 (else F32)
  int32_t format;               // MoeFormat; block formats need hidden % 32 == inner % 32 == 0
  int64_t rows, top_k, experts, hidden, inner;
  // Scratch (device): order [rows*top_k], active [experts], ranges [experts + 1], count [1],
  // act [rows*top_k, inner], item_out [rows*top_k, hidden].
  int32_t* order;
  int32_t* active;
  int32_t* ranges;
  int32_t* active_count;
  float* act;
  float* item_out;
  float* out;                   // [rows, hidden]; accumulate: out += the sum (else out = it)
  bool accumulate;
  // Tracking (all null: none): bit e set when expert e was routed and absent / present; the
  // count of absent bits this op set is added to *miss_count.
  uint32_t* absent_bits;
  uint32_t* used_bits;
  int32_t* miss_count;
  int32_t* routed_items;        // [3]: routings whose expert was present / absent / served elsewhere
  // W2 only (moe_w2.h): table entries point at tiled planes (w2_tiles.h); x and act split into
  // three BF16 terms, [rows, 3, hidden_padded] and [rows*top_k, 3, inner_padded] (padded to 128);
  // sizes of the rest from moe_w2_scratch(): passes [passes] (their count in active_count[1], so
  // active_count holds 2 ints), tile_done [tile_counters] (cleared by the kernels themselves),
  // partial [partial_floats]; pass_items = items per pass.
  uint16_t* x_split;
  uint16_t* act_split;
  int64_t hidden_padded, inner_padded;
  W2Pass* passes;
  uint32_t* tile_done;
  float* partial;
  int64_t tile_counters;
  int32_t pass_items;
  // Host entries (null: none): results [rows*top_k, hidden] and valid [rows*top_k], device pointers
  // of page-locked host memory.
  const float* host_results;
  const int32_t* host_valid;
  float swiglu_limit = 0.0f;  // > 0: DeepSeek-V4's SwiGLU clamp in the gate_up epilogue
  // W2: each tile block of a pass is summed by one warp, whatever the batch (a decode-like step,
  // StepInputs::row_invariant: an item's bits then depend only on its own row; moe_w2.cu).
  bool whole_tile_blocks = false;
};

void moe_launch(const MoeArgs& a, cudaStream_t stream);
void moe_launch_products(const MoeArgs& a, cudaStream_t stream);
void moe_launch_combine(const MoeArgs& a, cudaStream_t stream);

// Activation rows per pass of the MXFP4 expert kernels (CUDA cores): 1, 2, 4 or 8, chosen by
// best_pass_items (pass_size.h); 1 for decode batches over many experts.
int moe_quant_rows_per_pass(int64_t rows, int64_t top_k, int64_t experts);

}  // namespace moet::cuda
