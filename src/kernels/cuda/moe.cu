// Routed experts (see moe.h).
#include "kernels/cuda/moe.h"

#include "kernels/cuda/gemv_core.cuh"

namespace moet::cuda {
namespace {

constexpr int kWarps = 8;
constexpr int kGroupThreads = 256;

// One block: counts per expert, the active list in expert order, then each expert's items in
// item order. Items naming no valid expert are dropped (they contribute nothing).
__global__ void moe_group_kernel(MoeArgs a) {
  extern __shared__ int32_t count[];  // [experts]
  const int items = int(a.rows * a.top_k), experts = int(a.experts);
  for (int e = threadIdx.x; e < experts; e += blockDim.x) {
    int c = 0;
    for (int i = 0; i < items; ++i) c += a.expert_ids[i] == e;
    count[e] = c;
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    int start = 0, active = 0;
    for (int e = 0; e < experts; ++e) {
      const int c = count[e];
      if (c > 0) {
        a.active[active] = e;
        a.ranges[active] = start;
        ++active;
      }
      count[e] = start;  // becomes the expert's first position
      start += c;
    }
    a.ranges[active] = start;
    *a.active_count = active;
  }
  __syncthreads();
  for (int e = threadIdx.x; e < experts; e += blockDim.x) {
    int pos = count[e];
    for (int i = 0; i < items; ++i)
      if (a.expert_ids[i] == e) a.order[pos++] = i;
  }
}

// Warp w of block (x, a) computes act column j = blockIdx.x * kWarps + w of active expert a.
template <typename W>
__global__ void __launch_bounds__(kWarps * 32) moe_gate_up_kernel(MoeArgs a, bool vec) {
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
        const float g = acc[r][0];
        a.act[(p0 + r) * a.inner + j] = g / (1.0f + expf(-g)) * acc[r][1];
      }
  }
}

// Warp w of block (x, a) computes output columns 2 * (blockIdx.x * kWarps + w) + {0, 1}.
template <typename W>
__global__ void __launch_bounds__(kWarps * 32) moe_down_kernel(MoeArgs a, bool vec) {
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

__global__ void moe_combine_kernel(MoeArgs a) {
  const int64_t row = blockIdx.y;
  const int64_t d = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (d >= a.hidden) return;
  const int32_t* ids = a.expert_ids + row * a.top_k;
  float sum = 0.0f;
  int previous = -1;  // experts of a row are distinct: visit them in ascending order
  for (int64_t n = 0; n < a.top_k; ++n) {
    int best = -1;
    for (int64_t s = 0; s < a.top_k; ++s)
      if (ids[s] > previous && ids[s] < a.experts && (best < 0 || ids[s] < ids[best])) best = int(s);
    if (best < 0) break;
    previous = ids[best];
    const int64_t item = row * a.top_k + best;
    sum += a.weights[item] * a.item_out[item * a.hidden + d];
  }
  a.out[row * a.hidden + d] = sum;
}

bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15) == 0; }

template <typename W>
void moe_products(const MoeArgs& a, unsigned max_active, cudaStream_t stream) {
  // Expert pointers come from the device table, so alignment is checked where the table is built.
  const bool vec_up = a.hidden % kChunk == 0 && aligned16(a.x);
  const bool vec_down = a.inner % kChunk == 0;
  moe_gate_up_kernel<W><<<dim3(unsigned((a.inner + kWarps - 1) / kWarps), max_active), kWarps * 32, 0, stream>>>(a, vec_up);
  moe_down_kernel<W><<<dim3(unsigned((a.hidden + 2 * kWarps - 1) / (2 * kWarps)), max_active), kWarps * 32, 0, stream>>>(a, vec_down);
}

}  // namespace

void moe_launch(const MoeArgs& a, cudaStream_t stream) {
  const int64_t items = a.rows * a.top_k;
  const unsigned max_active = unsigned(items < a.experts ? items : a.experts);
  moe_group_kernel<<<1, kGroupThreads, size_t(a.experts) * sizeof(int32_t), stream>>>(a);
  if (a.w_bf16) {
    moe_products<uint16_t>(a, max_active, stream);
  } else {
    moe_products<float>(a, max_active, stream);
  }
  moe_combine_kernel<<<dim3(unsigned((a.hidden + 127) / 128), unsigned(a.rows)), 128, 0, stream>>>(a);
}

}  // namespace moet::cuda
