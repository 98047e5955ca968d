// How a backend holds routed experts: one expert's weights, a layer's set of them with the table
// the MoE op reads at run time, and the slots of a tiered pool. An entry of a set may be absent
// (its expert is not in backend memory): the MoE op then leaves that expert's items out of every
// sum, exactly as if the router had not chosen it, and records it (ExpertTracking) so that the
// residency manager (experts/) can fetch it and run the step again. The work the op does for
// the other experts does not change with what is absent, so what it computes for them is
// bit-identical to a fully resident run (on CUDA absent entries point at a stand-in expert and
// carry a flag the combine reads; the CPU computes each expert on its own).
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
// An absent expert (not in this backend's memory: tiered residency) has no tensors.
struct ExpertWeights {
  Tensor gate_up;
  Tensor down;
  ExpertFormat format = ExpertFormat::dense;
  Tensor gate_up_scales, down_scales;  // block formats only

  int64_t inner() const { return gate_up.dim(0) / 2; }
  bool present() const { return !gate_up.empty(); }
};

// The format and shapes every present expert of one MoE layer shares.
struct ExpertLayout {
  ExpertFormat format = ExpertFormat::dense;
  int64_t hidden = 0;
  int64_t inner = 0;
};

// Where the MoE op records what it met (backend memory; all null: not recorded). Bit e of a
// layer's words: expert e was routed and absent / routed and present in this forward. miss_count
// (one for every layer) counts the absent bits the forward set; routed_items[0] / [1] count the
// routings (row, expert) that found their expert present / absent. The caller zeroes them first.
struct ExpertTracking {
  uint32_t* absent_bits = nullptr;  // [ceil(experts / 32)]
  uint32_t* used_bits = nullptr;    // [ceil(experts / 32)]
  int32_t* miss_count = nullptr;
  int32_t* routed_items = nullptr;  // [2]
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
};

// Checks that every present expert has `layout`'s format and shapes (dense: BF16 or F32, one
// dtype for all; block formats: U8 code and scale planes, hidden and inner multiples of 32);
// returns the dense dtype (F32 when none is present or the layout is a block format).
DType expert_set_check(const ExpertLayout& layout, const std::vector<ExpertWeights>& experts);
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

}  // namespace moet
