// How a backend holds routed experts: one expert's weights, a layer's set of them with the table
// the MoE op reads at run time, and the slots of a tiered pool. An entry of a set may be absent
// (its expert is not in backend memory): the MoE op then leaves that expert's items out of every
// sum, exactly as if the router had not chosen it, and records it (ExpertTracking) so that the
// residency manager (experts/) can fetch it and run the step again. The work the op does for
// the other experts does not change with what is absent, so what it computes for them is
// bit-identical to a fully resident run (on CUDA absent entries point at a stand-in expert and
// carry a flag the combine reads; the CPU computes each expert on its own).
// An absent entry may instead be marked `host` (tiered residency with --cpu-experts): its items are
// computed on the host from the expert's host row (experts/host_experts.h); the MoE op hands the
// host the layer's rows and routing (HostExpertLink) and adds the results it gets back where it
// would have added the expert's own, in the fixed expert order. A host entry is no miss.
// A layer may also hold entries of a second format beside its own: the FP4 recovery tier
// (experts/fp4_tier.h) over a W2 base. Each expert runs in its own format, and a row's sum takes
// the layer format's experts first, then the tier's (each in expert order): the CPU computes every
// expert on its own in that order; CUDA reads the tier's entries through a second table in a
// second pass of the MoE op that continues the first's sums (kernels/cuda/moe.h).
#pragma once

#include "backend/tensor.h"

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

namespace moet {

// How a routed expert's matrices are stored: dense (BF16/F32 tensors of the shapes below) or a
// block-of-32 format (formats/mx_block.h: W2 2-bit codes or MXFP4 nibbles with UE8M0 scales;
// formats/w2k.h: W2K E8 codewords, 2 bits a weight, with UE5M3 scales): U8 code planes
// [rows, cols * bits / 8] with scale planes [rows, cols / 32].
enum class ExpertFormat { dense, w2, fp4, w2k };
// Bits per weight of a block format's codes (W2, W2K: 2; MXFP4: 4).
inline int64_t expert_format_bits(ExpertFormat format) { return format == ExpertFormat::fp4 ? 4 : 2; }

// One routed expert's weights: gate and up stacked as gate_up [2*inner, hidden], down [hidden, inner].
// An absent expert (not in this backend's memory: tiered residency) has no tensors; `host` marks
// an absent one the host computes instead (see above).
struct ExpertWeights {
  Tensor gate_up;
  Tensor down;
  ExpertFormat format = ExpertFormat::dense;
  Tensor gate_up_scales, down_scales;  // block formats only
  bool host = false;                   // absent, computed on the host

  int64_t inner() const { return gate_up.dim(0) / 2; }
  bool present() const { return !gate_up.empty(); }
  static ExpertWeights on_host() {
    ExpertWeights w;
    w.host = true;
    return w;
  }
};

// The format and shapes every present expert of one MoE layer shares.
struct ExpertLayout {
  ExpertFormat format = ExpertFormat::dense;
  int64_t hidden = 0;
  int64_t inner = 0;
  // > 0: the SwiGLU clamp of DeepSeek-V4 (gate <= limit, up in [-limit, limit] before silu * up).
  float swiglu_limit = 0.0f;
};

// Where the MoE op records what it met (backend memory; all null: not recorded). Bit e of a
// layer's words: expert e was routed and absent / routed and present in this forward. miss_count
// (one for every layer) counts the absent bits the forward set; routed_items[0] / [1] / [2] count
// the routings (row, expert) that found their expert present in the layer's format / absent /
// present in the tier's format. The caller zeroes them first.
struct ExpertTracking {
  uint32_t* absent_bits = nullptr;  // [ceil(experts / 32)]
  uint32_t* used_bits = nullptr;    // [ceil(experts / 32)]
  int32_t* miss_count = nullptr;
  int32_t* routed_items = nullptr;  // [3]
};

// What serves a layer's host entries. serve() gets the layer's rows x [rows, hidden], its routing
// ids / weights [rows, top_k] and fills, for the items (row * top_k + slot) whose expert it
// computes, results[item] (that expert's output for the row, unweighted) and valid[item] = 1;
// valid[item] = 0 elsewhere (an item it leaves out: skipped, or left for a fetch and a replay).
class HostExpertServer {
 public:
  virtual ~HostExpertServer() = default;
  virtual void serve(int64_t layer, const float* x, const int32_t* ids, const float* weights, int64_t rows,
                     int64_t top_k, float* results, int32_t* valid) = 0;
};

// Where a backend whose MoE op runs away from the host (CUDA) meets the host: page-locked host
// memory the device reads and writes directly, one mailbox per MoE layer. The op writes x, ids,
// weights and rows, then sets *ready = 1; the host (a thread of experts/host_experts.h) clears
// ready, serves, writes results and valid, then sets *done = 1; the op waits for done == 1 before
// its combine, then clears it. Flags hold constant values so that captured graphs replay them.
struct HostMailbox {
  float* x = nullptr;          // [max_rows, hidden]
  int32_t* ids = nullptr;      // [max_rows * top_k]
  float* weights = nullptr;    // [max_rows * top_k]
  int32_t* rows = nullptr;     // [1]
  float* results = nullptr;    // [max_rows * top_k, hidden]
  int32_t* valid = nullptr;    // [max_rows * top_k]
  uint32_t* ready = nullptr;
  uint32_t* done = nullptr;
  int64_t max_rows = 0;
};

// A layer's link to the host: the CPU backend calls server->serve() inside its op; a backend with
// a mailbox (Backend::host_experts_by_mailbox()) goes through it. Unset (server null): the layer
// has no host entries.
struct HostExpertLink {
  HostExpertServer* server = nullptr;
  int64_t layer = -1;
  HostMailbox mailbox;
};

// A layer's routed experts as the backend reads them. `table` is backend memory mapping an
// expert index to its weights (on the GPU: device pointers read by the kernels at run time, so
// the residency manager can move experts without re-capturing graphs; empty on the CPU).
struct ExpertSet {
  ExpertLayout layout;
  DType dense_dtype = DType::f32;      // dense layouts: the experts' dtype (BF16 or F32)
  std::vector<ExpertWeights> experts;  // [experts], absent ones included
  Tensor table;
  ExpertTracking tracking;
  // Backend::expert_set_add_tier: entries may also be of this block format (layout.format: no
  // tier). CUDA reads those through tier_table (the same entries, the others marked as served
  // elsewhere).
  ExpertFormat tier_format = ExpertFormat::dense;
  Tensor tier_table;
  HostExpertLink host;  // experts served by the host (set before any step using the set is captured)

  bool has_tier() const { return tier_format != ExpertFormat::dense && tier_format != layout.format; }
};

// Checks that every present expert has `layout`'s format and shapes, or (tier: a block format)
// the tier's (dense: BF16 or F32, one dtype for all; block formats: U8 code and scale planes,
// hidden and inner multiples of 32); returns the dense dtype (F32 when none is present or the
// layout is a block format).
DType expert_set_check(const ExpertLayout& layout, const std::vector<ExpertWeights>& experts,
                       ExpertFormat tier = ExpertFormat::dense);
// set.experts[experts[i]] = weights[i], the indices checked (the part of expert_set_update every
// backend shares; the weights are already in the backend's layout).
void expert_set_assign(ExpertSet& set, std::span<const int64_t> experts, std::span<const ExpertWeights> weights);

// Where one expert's four planes sit in its host row (a pack slot, io/pack_format.h:
// [codes13 | scales13 | codes2 | scales2]), W2, W2K or MXFP4.
struct ExpertRowLayout {
  uint64_t codes13 = 0, scales13 = 0, codes2 = 0, scales2 = 0;
  uint64_t bytes = 0;  // the row's size (its planes end there)
};

// Backend memory for a pool of expert slots of one layout (the GPU as a cache of experts):
// weights[i] is slot i's expert as the MoE op reads it, valid once a row was loaded into it.
struct ExpertSlots {
  ExpertLayout layout;
  ExpertRowLayout row;
  std::vector<ExpertWeights> weights;
  std::shared_ptr<void> memory;  // every slot's storage (and the backend's load scratch)

  int64_t count() const { return int64_t(weights.size()); }
};

// A load of expert slots in flight (Backend::expert_slots_load_async); empty: already done.
struct ExpertLoadFence {
  std::shared_ptr<void> event;
};

}  // namespace moet
