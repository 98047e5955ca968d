// Top-k logits per row (see top_logits.h). One kernel, launched once per pass:
//  - Each thread holds kItems entries of its block's chunk, strided by the block size (coalesced
//    loads), as rank keys: the value's order key (NaN 0, -0 as +0) above the complemented token
//    id, so keys are distinct and larger is better; key 0 marks no entry (never a real key).
//  - The block finds the smallest key among its chunk's `want` best: for want 1 a max reduction;
//    otherwise a radix select over the key's bytes from the top: a 256-bin histogram of the
//    entries that share the digits chosen so far (one shared atomic per group of equal digits in a
//    warp), a suffix sum over the bins picks the bin holding the want-th best, and it ends as soon
//    as all of that bin is wanted (distinct keys: by the last byte at the latest).
//  - Entries at or above it are written in (thread, item) order at positions from a block scan:
//    an intermediate pass writes its chunk's best to chunk * k of the row's workspace (only a
//    row's last chunk can hold fewer than k, so a row's survivors are contiguous); the final pass
//    (one chunk per row) puts them in shared memory and each thread writes one at its rank, the
//    count of the chosen keys above its own.
// Every __syncthreads is reached by all threads; shared data is written and read on opposite sides
// of a barrier.
#include "kernels/cuda/top_logits.h"

#include "kernels/cuda/block_reduce.cuh"
#include "kernels/cuda/launch.cuh"

#include <cub/block/block_scan.cuh>

#include <algorithm>

namespace moet::cuda {
namespace {

constexpr int kThreads = 256;  // also the histogram's bins and the final sort's one-key-per-thread
constexpr int kItems = 16;
constexpr int kChunk = kThreads * kItems;
static_assert(kTopLogitsMaxK <= kThreads && kTopLogitsMaxK <= kChunk, "a chunk keeps at most k entries");

using BlockScan = cub::BlockScan<int, kThreads>;

struct TopShared {
  typename BlockScan::TempStorage scan;
  uint32_t hist[256];
  uint64_t reduce[32];  // block_reduce's scratch
  uint64_t chosen[kTopLogitsMaxK];  // final pass: the row's best, unsorted
  float chosen_values[kTopLogitsMaxK];
  uint32_t digit;
  int need, exact;
};

// One pass: chunks of kChunk entries of each row's input to their best min(k, len).
struct TopPass {
  const float* in_values;
  const int32_t* in_ids;  // null: entry i is token i (the logits themselves)
  int64_t in_stride;
  int n, k;  // entries per row, entries kept per chunk
  float* out_values;
  int32_t* out_ids;
  int64_t out_stride;
};

__device__ __forceinline__ uint64_t rank_key(float v, int32_t id) {
  uint32_t key = 0;  // NaN
  if (v == v) {
    const uint32_t bits = __float_as_uint(v == 0.0f ? 0.0f : v);
    key = (bits & 0x80000000u) ? ~bits : (bits | 0x80000000u);
  }
  return (uint64_t(key) << 32) | uint32_t(~uint32_t(id));
}

struct MaxKeyOp {
  __device__ __forceinline__ uint64_t operator()(uint64_t a, uint64_t b) const { return a > b ? a : b; }
};

// The smallest of the `want` largest keys (1 <= want <= the entries held); every thread gets it.
__device__ uint64_t want_threshold(const uint64_t (&keys)[kItems], int want, TopShared& s) {
  if (want == 1) {
    uint64_t best = 0;
#pragma unroll
    for (int j = 0; j < kItems; ++j) best = keys[j] > best ? keys[j] : best;
    return block_reduce(best, MaxKeyOp(), uint64_t(0), s.reduce);
  }
  const int lane = threadIdx.x & 31;
  uint64_t prefix = 0, mask = 0;
  int need = want;
  for (int shift = 56; shift >= 0; shift -= 8) {
    s.hist[threadIdx.x] = 0;
    __syncthreads();
#pragma unroll
    for (int j = 0; j < kItems; ++j) {
      const bool in = keys[j] != 0 && (keys[j] & mask) == prefix;
      if (__ballot_sync(0xffffffffu, in) == 0) continue;
      const uint32_t digit = in ? uint32_t(keys[j] >> shift) & 255u : 256u;
      const uint32_t peers = __match_any_sync(0xffffffffu, digit);
      if (in && lane == __ffs(peers) - 1) atomicAdd(&s.hist[digit], uint32_t(__popc(peers)));
    }
    __syncthreads();
    const uint32_t digit = 255u - threadIdx.x;
    const int count = int(s.hist[digit]);
    int above;  // entries with a larger digit
    BlockScan(s.scan).ExclusiveSum(count, above);
    if (above < need && above + count >= need) {
      s.digit = digit;
      s.need = need - above;
      s.exact = above + count == need;
    }
    __syncthreads();
    prefix |= uint64_t(s.digit) << shift;
    mask |= uint64_t(255) << shift;
    need = s.need;
    if (s.exact) break;  // every entry of the bin is wanted: the threshold is the bin's smallest key
  }
  return prefix;
}

template <bool kFinal>
__global__ void __launch_bounds__(kThreads) top_logits_kernel(TopPass p) {
  __shared__ TopShared s;
  pdl_trigger();
  pdl_wait();  // the input comes from the previous kernel
  const int row = blockIdx.y, chunk = blockIdx.x, start = chunk * kChunk;
  const int len = min(kChunk, p.n - start), want = min(p.k, len);
  const float* in_values = p.in_values + row * p.in_stride + start;
  const int32_t* in_ids = p.in_ids ? p.in_ids + row * p.in_stride + start : nullptr;
  uint64_t keys[kItems];
  float values[kItems];
#pragma unroll
  for (int j = 0; j < kItems; ++j) {
    const int i = j * kThreads + int(threadIdx.x);
    values[j] = i < len ? in_values[i] : 0.0f;
    keys[j] = i < len ? rank_key(values[j], in_ids ? in_ids[i] : start + i) : 0;
  }
  const uint64_t threshold = want == len ? 1 : want_threshold(keys, want, s);
  int mine = 0;
#pragma unroll
  for (int j = 0; j < kItems; ++j) mine += keys[j] >= threshold;
  int at;
  __syncthreads();  // the select's scan storage is free again
  BlockScan(s.scan).ExclusiveSum(mine, at);
  if constexpr (!kFinal) {
    float* out_values = p.out_values + row * p.out_stride + int64_t(chunk) * p.k;
    int32_t* out_ids = p.out_ids + row * p.out_stride + int64_t(chunk) * p.k;
#pragma unroll
    for (int j = 0; j < kItems; ++j) {
      if (keys[j] < threshold) continue;
      out_values[at] = values[j];
      out_ids[at++] = int32_t(~uint32_t(keys[j]));
    }
  } else {
#pragma unroll
    for (int j = 0; j < kItems; ++j) {
      if (keys[j] < threshold) continue;
      s.chosen[at] = keys[j];
      s.chosen_values[at++] = values[j];
    }
    __syncthreads();
    if (int(threadIdx.x) >= want) return;
    const uint64_t key = s.chosen[threadIdx.x];
    int rank = 0;
    for (int i = 0; i < want; ++i) rank += s.chosen[i] > key;
    p.out_values[row * p.out_stride + rank] = s.chosen_values[threadIdx.x];
    p.out_ids[row * p.out_stride + rank] = int32_t(~uint32_t(key));
  }
}

int64_t chunks_of(int64_t n) { return (n + kChunk - 1) / kChunk; }

// Entries per row after a pass over n: k from each full chunk, min(k, len) from the last.
int64_t kept_of(int64_t n, int64_t k) {
  const int64_t full = chunks_of(n) - 1;
  return full * k + std::min(k, n - full * kChunk);
}

}  // namespace

size_t top_logits_workspace_bytes(int64_t rows, int64_t vocab, int64_t k) {
  if (chunks_of(vocab) <= 1) return 0;
  // Two buffers of the first pass's output (the largest), passes alternating between them.
  return size_t(2 * rows * kept_of(vocab, k)) * (sizeof(float) + sizeof(int32_t));
}

void top_logits_launch(const float* logits, int64_t rows, int64_t vocab, int64_t k, void* workspace, float* values,
                       int32_t* ids, cudaStream_t stream) {
  if (rows == 0) return;
  const int64_t stride = chunks_of(vocab) > 1 ? kept_of(vocab, k) : 0;
  float* buffer_values = static_cast<float*>(workspace);
  int32_t* buffer_ids = reinterpret_cast<int32_t*>(buffer_values + 2 * rows * stride);
  TopPass p{logits, nullptr, vocab, int(vocab), int(k), nullptr, nullptr, stride};
  for (int buffer = 0; chunks_of(p.n) > 1; buffer ^= 1) {
    p.out_values = buffer_values + buffer * rows * stride;
    p.out_ids = buffer_ids + buffer * rows * stride;
    launch_dependent_kernel<top_logits_kernel<false>>(dim3(unsigned(chunks_of(p.n)), unsigned(rows)), dim3(kThreads),
                                                      0, 1, stream, p);
    p = TopPass{p.out_values, p.out_ids, stride, int(kept_of(p.n, k)), int(k), nullptr, nullptr, stride};
  }
  p.out_values = values;
  p.out_ids = ids;
  p.out_stride = k;
  launch_dependent_kernel<top_logits_kernel<true>>(dim3(1, unsigned(rows)), dim3(kThreads), 0, 1, stream, p);
}

}  // namespace moet::cuda
