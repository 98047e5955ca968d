// Routed experts (see moe.h). Every kernel here is a programmatic dependent launch (launch.cuh)
// that waits for the previous kernel before touching memory; the W2 path's kernels are in moe_w2.cu.
#include "kernels/cuda/moe.h"

#include "kernels/cuda/gemv_core.cuh"
#include "kernels/cuda/launch.cuh"
#include "kernels/cuda/moe_group.cuh"
#include "kernels/cuda/moe_w2.h"
#include "kernels/cuda/pass_size.h"
#include "kernels/cuda/quant_core.cuh"

namespace moet::cuda {
namespace {

constexpr int kWarps = 8;
constexpr int kGroupThreads = 256;

__global__ void moe_group_kernel(MoeArgs a) {
  extern __shared__ int32_t count[];  // moe_group_shared_ints()
  pdl_trigger();
  pdl_wait();  // the expert ids come from the router
  moe_group_block(a, count);
}

// Warp w of block (x, a) computes act column j = blockIdx.x * kWarps + w of active expert a.
template <typename W>
__global__ void __launch_bounds__(kWarps * 32) moe_gate_up_kernel(MoeArgs a, bool vec) {
  pdl_trigger();
  pdl_wait();  // the grouping comes from moe_group_kernel
  const int slot = blockIdx.y;
  if (slot >= *a.active_count) return;
  const int lane = threadIdx.x & 31;
  const int64_t j = int64_t(blockIdx.x) * kWarps + (threadIdx.x >> 5);
  if (j >= a.inner) return;
  const W* gate_up = static_cast<const W*>(a.table[a.active[slot]].gate_up);
  const W* w[2] = {gate_up + j * a.hidden, gate_up + (a.inner + j) * a.hidden};
  const int begin = a.ranges[slot], end = a.ranges[slot + 1];
  for (int p0 = begin; p0 < end; p0 += kMaxRows) {
    const int rows = min(kMaxRows, end - p0);
    const float* x[kMaxRows];
#pragma unroll
    for (int r = 0; r < kMaxRows; ++r) x[r] = a.x + (a.order[p0 + min(r, rows - 1)] / a.top_k) * a.hidden;
    float acc[kMaxRows][2];
    warp_dot<W, 2>(x, rows, w, int(a.hidden), vec, acc);
#pragma unroll
    for (int r = 0; r < kMaxRows; ++r)
      if (lane == r && r < rows) {
        a.act[(p0 + r) * a.inner + j] = moe_swiglu(acc[r][0], acc[r][1], a.swiglu_limit);
      }
  }
}

// Warp w of block (x, a) computes output columns 2 * (blockIdx.x * kWarps + w) + {0, 1}.
template <typename W>
__global__ void __launch_bounds__(kWarps * 32) moe_down_kernel(MoeArgs a, bool vec) {
  pdl_trigger();
  pdl_wait();  // act comes from the gate_up kernel
  const int slot = blockIdx.y;
  if (slot >= *a.active_count) return;
  const int lane = threadIdx.x & 31;
  const int64_t n0 = (int64_t(blockIdx.x) * kWarps + (threadIdx.x >> 5)) * 2;
  if (n0 >= a.hidden) return;
  const W* down = static_cast<const W*>(a.table[a.active[slot]].down);
  const W* w[2] = {down + n0 * a.inner, down + min(n0 + 1, a.hidden - 1) * a.inner};
  const int begin = a.ranges[slot], end = a.ranges[slot + 1];
  for (int p0 = begin; p0 < end; p0 += kMaxRows) {
    const int rows = min(kMaxRows, end - p0);
    const float* x[kMaxRows];
#pragma unroll
    for (int r = 0; r < kMaxRows; ++r) x[r] = a.act + int64_t(p0 + min(r, rows - 1)) * a.inner;
    float acc[kMaxRows][2];
    warp_dot<W, 2>(x, rows, w, int(a.inner), vec, acc);
#pragma unroll
    for (int r = 0; r < kMaxRows; ++r)
#pragma unroll
      for (int c = 0; c < 2; ++c)
        if (lane == r * 2 + c && r < rows && n0 + c < a.hidden)
          a.item_out[int64_t(a.order[p0 + r]) * a.hidden + n0 + c] = acc[r][c];
  }
}

// out[row] = sum over the row's items in ascending expert order of weight * y_item (an expert
// named twice in a row counts once, its first slot; an invalid, absent or elsewhere served one not at all), or
// out[row] += it (accumulate); y_item of a host entry is host_results[item], where host_valid says
// the host computed it. Blocks of column 0 record the row's experts in the tracking bits. Warp 0
// ranks the row's slots (a counted slot's rank: the counted slots with smaller experts) into
// `order` (a host item as -1 - item);
// then every thread requests its column of all the items at once and adds them in rank order.
// Shared memory: 3 * top_k ints.
__global__ void moe_combine_kernel(MoeArgs a) {
  extern __shared__ int32_t combine_shared[];
  __shared__ int32_t counted;
  pdl_trigger();
  pdl_wait();  // the item outputs come from the down kernel
  const int64_t row = blockIdx.y;
  const int top_k = int(a.top_k);
  int32_t* ids = combine_shared;            // the row's experts
  int32_t* counts = ids + top_k;            // 1: valid and the first slot naming its expert
  int32_t* order = counts + top_k;          // items in ascending expert order
  if (threadIdx.x < 32) {
    const int lane = threadIdx.x;
    for (int s = lane; s < top_k; s += 32) ids[s] = a.expert_ids[row * top_k + s];
    __syncwarp();
    for (int s = lane; s < top_k; s += 32) {
      const int e = ids[s];
      bool first = e >= 0 && e < a.experts;
      for (int t = 0; t < s && first; ++t) first = ids[t] != e;
      const int32_t presence = first ? a.table[e].present : kAbsent;
      const bool host = presence == kHostComputed && a.host_valid && a.host_valid[row * top_k + s];
      const bool present = first && (presence == kPresent || host);
      if (first && blockIdx.x == 0 && a.used_bits) {
        const uint32_t bit = 1u << (e % 32);
        if (presence != kAbsent) {
          atomicOr(a.used_bits + e / 32, bit);
        } else if (!(atomicOr(a.absent_bits + e / 32, bit) & bit)) {
          atomicAdd(a.miss_count, 1);
        }
        const int which = presence == kPresent ? 0 : presence == kServedElsewhere ? 2 : 1;
        atomicAdd(a.routed_items + which, 1);
      }
      counts[s] = present ? (host ? 2 : 1) : 0;
    }
    __syncwarp();
    int n = 0;
    for (int s = lane; s < top_k; s += 32) {
      if (!counts[s]) continue;
      int rank = 0;
      for (int t = 0; t < top_k; ++t) rank += counts[t] && ids[t] < ids[s];
      const int32_t item = int32_t(row * top_k + s);
      order[rank] = counts[s] == 2 ? -1 - item : item;
      ++n;
    }
    n = int(__reduce_add_sync(0xffffffffu, unsigned(n)));
    if (lane == 0) counted = n;
  }
  __syncthreads();
  const int64_t d = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (d >= a.hidden) return;
  constexpr int kBatch = 8;  // item values requested together
  float sum = a.accumulate ? a.out[row * a.hidden + d] : 0.0f;
  for (int first = 0; first < counted; first += kBatch) {
    float y[kBatch];
#pragma unroll
    for (int i = 0; i < kBatch; ++i) {
      if (first + i >= counted) continue;
      const int32_t item = order[first + i];
      y[i] = item >= 0 ? a.item_out[int64_t(item) * a.hidden + d] : a.host_results[int64_t(-1 - item) * a.hidden + d];
    }
#pragma unroll
    for (int i = 0; i < kBatch; ++i) {
      if (first + i >= counted) continue;
      const int32_t item = order[first + i];
      sum += a.weights[item >= 0 ? item : -1 - item] * y[i];
    }
  }
  a.out[row * a.hidden + d] = sum;
}

bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15) == 0; }

template <typename W>
void moe_products(const MoeArgs& a, unsigned max_active, cudaStream_t stream) {
  // Expert pointers come from the device table, so alignment is checked where the table is built.
  const bool vec_up = a.hidden % kChunk == 0 && aligned16(a.x);
  const bool vec_down = a.inner % kChunk == 0;
  launch_dependent_kernel<moe_gate_up_kernel<W>>(dim3(unsigned((a.inner + kWarps - 1) / kWarps), max_active),
                                                 dim3(kWarps * 32), 0, 1, stream, a, vec_up);
  launch_dependent_kernel<moe_down_kernel<W>>(dim3(unsigned((a.hidden + 2 * kWarps - 1) / (2 * kWarps)), max_active),
                                              dim3(kWarps * 32), 0, 1, stream, a, vec_down);
}

// MXFP4 and W2K on CUDA cores (quant_core.cuh; Codes: Mxfp4Codes or W2kCodes). Warp w of block
// (x, a) computes act columns j0 = 2 * (blockIdx.x * kWarps + w) and j0 + 1 of active expert a
// from four weight rows (gate
// j0, gate j0 + 1, up j0, up j0 + 1), R rows of activations per pass; inner is even (a multiple
// of 32).
template <typename Codes, int R>
__global__ void __launch_bounds__(kWarps * 32) moe_quant_gate_up_kernel(MoeArgs a) {
  pdl_trigger();
  pdl_wait();  // the grouping comes from moe_group_kernel
  const int slot = blockIdx.y;
  if (slot >= *a.active_count) return;
  const int lane = threadIdx.x & 31;
  const int64_t j0 = (int64_t(blockIdx.x) * kWarps + (threadIdx.x >> 5)) * 2;
  if (j0 >= a.inner) return;
  const ExpertPointers e = a.table[a.active[slot]];
  const int64_t row_bytes = a.hidden * Codes::kBits / 8, row_scales = a.hidden / 32;
  const auto* codes = static_cast<const uint8_t*>(e.gate_up);
  const int64_t w_rows[4] = {j0, j0 + 1, a.inner + j0, a.inner + j0 + 1};
  const uint8_t* c[4];
  const uint8_t* s[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    c[i] = codes + w_rows[i] * row_bytes;
    s[i] = e.gate_up_scales + w_rows[i] * row_scales;
  }
  const int begin = a.ranges[slot], end = a.ranges[slot + 1];
  for (int p0 = begin; p0 < end; p0 += R) {
    const int rows = min(R, end - p0);
    const float* x[R];
#pragma unroll
    for (int r = 0; r < R; ++r) x[r] = a.x + (a.order[p0 + min(r, rows - 1)] / a.top_k) * a.hidden;
    float acc[R][4];
    quant_warp_dot<Codes, 4, R>(x, rows, c, s, int(a.hidden), acc);
#pragma unroll
    for (int r = 0; r < R; ++r)
#pragma unroll
      for (int h = 0; h < 2; ++h)
        if (lane == r * 2 + h && r < rows) {
          a.act[(p0 + r) * a.inner + j0 + h] = moe_swiglu(acc[r][h], acc[r][2 + h], a.swiglu_limit);
        }
  }
}

// Warp w of block (x, a) computes output columns 4 * (blockIdx.x * kWarps + w) + {0..3} (hidden
// is a multiple of 32).
template <typename Codes, int R>
__global__ void __launch_bounds__(kWarps * 32) moe_quant_down_kernel(MoeArgs a) {
  pdl_trigger();
  pdl_wait();  // act comes from the gate_up kernel
  const int slot = blockIdx.y;
  if (slot >= *a.active_count) return;
  const int lane = threadIdx.x & 31;
  const int64_t n0 = (int64_t(blockIdx.x) * kWarps + (threadIdx.x >> 5)) * 4;
  if (n0 >= a.hidden) return;
  const ExpertPointers e = a.table[a.active[slot]];
  const int64_t row_bytes = a.inner * Codes::kBits / 8, row_scales = a.inner / 32;
  const auto* codes = static_cast<const uint8_t*>(e.down);
  const uint8_t* c[4];
  const uint8_t* s[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    c[i] = codes + (n0 + i) * row_bytes;
    s[i] = e.down_scales + (n0 + i) * row_scales;
  }
  const int begin = a.ranges[slot], end = a.ranges[slot + 1];
  for (int p0 = begin; p0 < end; p0 += R) {
    const int rows = min(R, end - p0);
    const float* x[R];
#pragma unroll
    for (int r = 0; r < R; ++r) x[r] = a.act + int64_t(p0 + min(r, rows - 1)) * a.inner;
    float acc[R][4];
    quant_warp_dot<Codes, 4, R>(x, rows, c, s, int(a.inner), acc);
#pragma unroll
    for (int r = 0; r < R; ++r)
#pragma unroll
      for (int i = 0; i < 4; ++i)
        if (lane == r * 4 + i && r < rows) a.item_out[int64_t(a.order[p0 + r]) * a.hidden + n0 + i] = acc[r][i];
  }
}

template <typename Codes, int R>
void moe_quant_products_rows(const MoeArgs& a, unsigned max_active, cudaStream_t stream) {
  launch_dependent_kernel<moe_quant_gate_up_kernel<Codes, R>>(
      dim3(unsigned((a.inner + 2 * kWarps - 1) / (2 * kWarps)), max_active), dim3(kWarps * 32), 0, 1, stream, a);
  launch_dependent_kernel<moe_quant_down_kernel<Codes, R>>(
      dim3(unsigned((a.hidden + 4 * kWarps - 1) / (4 * kWarps)), max_active), dim3(kWarps * 32), 0, 1, stream, a);
}

template <typename Codes>
void moe_quant_products(const MoeArgs& a, unsigned max_active, cudaStream_t stream) {
  switch (moe_quant_rows_per_pass(a.rows, a.top_k, a.experts)) {
    case 1: moe_quant_products_rows<Codes, 1>(a, max_active, stream); break;
    case 2: moe_quant_products_rows<Codes, 2>(a, max_active, stream); break;
    case 4: moe_quant_products_rows<Codes, 4>(a, max_active, stream); break;
    default: moe_quant_products_rows<Codes, kMaxRows>(a, max_active, stream); break;
  }
}

}  // namespace

int moe_quant_rows_per_pass(int64_t rows, int64_t top_k, int64_t experts) {
  // Relative time of one pass with 1, 2, 4 or 8 rows, measured at batch 1 on the H200 with the
  // count forced: DeepSeek-V3 experts 1 : 1.01 : 1.10 : 1.69, Qwen3-235B's 1 : 1.14 : 1.33 : 2.07
  // (bench/results/cuda_h200_session6_pairs.txt); the means here.
  static constexpr PassSize kOptions[] = {{1, 1.0}, {2, 1.07}, {4, 1.2}, {kMaxRows, 1.9}};
  return best_pass_items(rows, top_k, experts, kOptions);
}

void moe_launch(const MoeArgs& a, cudaStream_t stream) {
  moe_launch_products(a, stream);
  moe_launch_combine(a, stream);
}

void moe_launch_products(const MoeArgs& a, cudaStream_t stream) {
  const int64_t items = a.rows * a.top_k;
  const unsigned max_active = unsigned(items < a.experts ? items : a.experts);
  if (a.format == kMoeW2) {
    moe_w2_launch(a, stream);
  } else {
    launch_dependent_kernel<moe_group_kernel>(
        dim3(1), dim3(kGroupThreads), size_t(moe_group_shared_ints(a.experts, kGroupThreads)) * sizeof(int32_t), 1,
        stream, a);
    if (a.format == kMoeFp4) {
      moe_quant_products<Mxfp4Codes>(a, max_active, stream);
    } else if (a.format == kMoeW2k) {
      moe_quant_products<W2kCodes>(a, max_active, stream);
    } else if (a.w_bf16) {
      moe_products<uint16_t>(a, max_active, stream);
    } else {
      moe_products<float>(a, max_active, stream);
    }
  }
}

void moe_launch_combine(const MoeArgs& a, cudaStream_t stream) {
  launch_dependent_kernel<moe_combine_kernel>(dim3(unsigned((a.hidden + 127) / 128), unsigned(a.rows)), dim3(128),
                                              size_t(3 * a.top_k) * sizeof(int32_t), 1, stream, a);
}

}  // namespace moet::cuda
