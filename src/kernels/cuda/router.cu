// Top-k routing (see router.h): one block per row, one thread per expert (the block rounded up to
// whole warps; threads past the experts join every barrier and shuffle but are never chosen). No
// step walks the experts or the k choices one at a time: a candidate's place is its rank, the
// count of candidates better than it, compared in parallel from shared memory.
//  - Scores: sigmoid per thread; softmax from the block's max, then every warp sums the
//    exponentials as the former one-warp kernel did (lane l adds experts l, l + 32, ... in order,
//    then the xor tree), so the scores keep that kernel's bits.
//  - Rank keys: the choice value's order-preserving integer key above the complemented expert
//    index, one 64-bit integer: keys are distinct and the larger key is the better choice (larger
//    value, ties to the lower index; -0 as +0; a NaN by its bits: a positive one above +inf, a
//    negative one below -inf). Threads past the experts hold value key 0, below every expert.
//  - Groups: a group's score is 0 + its best choice + its second best (the CPU's order), from 2^k
//    lanes per group that each scan a strided share of its members and merge their (best, second)
//    pairs by xor shuffles; a group is kept when fewer than top_groups groups rank above it, and
//    the other groups' experts take the choice -inf (ties among those to the lower index).
//  - Top-k in two rank passes: each thread's rank among its warp's 32 keys, the warp's best
//    min(top_k, 32) written in rank order to a candidate list; then each candidate's rank in the
//    whole list, one thread per candidate. The top k experts are all candidates and rank in the
//    list as among all experts; any other candidate ranks top_k or worse. Rank r fills choice r.
//  - The weights' total is summed in choice order (rank 0, 1, ...) as the CPU sums it.
// Every __syncthreads is reached by all threads of the block; each shared array is written and
// read on opposite sides of a barrier (a __syncwarp where only the writing warp reads).
#include "kernels/cuda/router.h"

#include "kernels/cuda/block_reduce.cuh"
#include "kernels/cuda/launch.cuh"

namespace moet::cuda {
namespace {

constexpr int kMaxExperts = 1024;  // also the most threads of a block
constexpr int kMaxTopK = 64;

struct RouterShared {
  union {
    float exps[kMaxExperts];          // softmax: the row's exponentials
    uint64_t group_keys[kMaxExperts];  // grouped: the groups' rank keys (after the exponentials)
  };
  uint64_t keys[kMaxExperts];        // the experts' rank keys: warp w's at 32 w .. 32 w + 31
  uint64_t candidates[kMaxExperts];  // warp w's best min(top_k, 32) keys at w min(top_k, 32) + warp rank
  float candidate_scores[kMaxExperts];
  int chosen[kMaxTopK];  // by rank
  float chosen_scores[kMaxTopK];
  float scratch[32];  // block_reduce's
};

// Order-preserving integer key of a value (-0 as +0) and back.
__device__ __forceinline__ uint32_t order_key(float v) {
  const uint32_t bits = __float_as_uint(v == 0.0f ? 0.0f : v);
  return (bits & 0x80000000u) ? ~bits : (bits | 0x80000000u);
}
__device__ __forceinline__ float key_value(uint32_t key) {
  return __uint_as_float((key & 0x80000000u) ? (key & 0x7fffffffu) : ~key);
}

__device__ __forceinline__ uint64_t rank_key(uint32_t value_key, int index) {
  return (uint64_t(value_key) << 32) | uint32_t(~index);
}

// How many of keys[0, count) exceed key; keys 16-byte aligned.
__device__ __forceinline__ int count_greater(const uint64_t* keys, int count, uint64_t key) {
  const ulonglong2* pairs = reinterpret_cast<const ulonglong2*>(keys);
  int even = 0, odd = 0;
#pragma unroll 4
  for (int i = 0; i < count / 2; ++i) {
    const ulonglong2 pair = pairs[i];
    even += pair.x > key;
    odd += pair.y > key;
  }
  if (count & 1) even += keys[count - 1] > key;
  return even + odd;
}

// The rank key of expert e (threadIdx.x), or of choice -inf where its group is not among the
// top_groups best. Reads the rank keys of all experts from s.keys; every thread of the block
// must call it.
__device__ uint64_t mask_groups(const RouterArgs& p, RouterShared& s, uint64_t key) {
  const int e = threadIdx.x, groups = int(p.groups), per_group = int(p.experts) / groups;
  // 2^shift lanes per group (up to 32; at least 4 members each where the group has 4): 2^shift <=
  // per_group, so groups * 2^shift <= experts <= threads and one pass covers every group; a
  // group's lanes are aligned within a warp, so the xor shuffles stay among them.
  const int shift = min(5, 31 - __clz(max(per_group / 4, 1))), lanes = 1 << shift;
  const int g = e >> shift;
  uint32_t best = 0, second = 0;  // value keys; 0 (below any choice but a NaN of all ones): none
  if (g < groups) {
    for (int i = e & (lanes - 1); i < per_group; i += lanes) {
      const uint32_t k = uint32_t(s.keys[g * per_group + i] >> 32);
      second = max(second, min(best, k));
      best = max(best, k);
    }
  }
  for (int offset = lanes / 2; offset > 0; offset /= 2) {
    const uint32_t other_best = __shfl_xor_sync(0xffffffffu, best, offset);
    const uint32_t other_second = __shfl_xor_sync(0xffffffffu, second, offset);
    second = max(max(second, other_second), min(best, other_best));
    best = max(best, other_best);
  }
  if (g < groups && (e & (lanes - 1)) == 0) {
    const float score = per_group > 1 ? 0.0f + key_value(best) + key_value(second) : 0.0f + key_value(best);
    s.group_keys[g] = rank_key(order_key(score), g);
  }
  __syncthreads();
  if (e >= p.experts) return key;
  const bool kept = count_greater(s.group_keys, groups, s.group_keys[e / per_group]) < p.top_groups;
  return kept ? key : rank_key(order_key(-INFINITY), e);
}

__global__ void __launch_bounds__(kMaxExperts) router_kernel(RouterArgs p, const float* logits, int32_t* ids,
                                                             float* weights) {
  __shared__ __align__(16) RouterShared s;
  pdl_trigger();
  pdl_wait();  // the logits come from the previous kernel
  const int n = int(p.experts), top_k = int(p.top_k), e = threadIdx.x, lane = e & 31, warp = e >> 5;
  const int64_t row = blockIdx.x;
  const bool expert = e < n;
  const float x = expert ? logits[row * n + e] : -INFINITY;
  const float bias = expert && p.correction_bias ? p.correction_bias[e] : 0.0f;
  float score;
  if (p.sqrtsoftplus) {
    score = sqrtf(x > 20.0f ? x : log1pf(expf(x)));
  } else if (p.sigmoid) {
    score = 1.0f / (1.0f + expf(-x));
  } else {
    const float m = block_reduce(x, MaxOp(), -INFINITY, s.scratch);
    const float ex = expf(x - m);
    if (expert) s.exps[e] = ex;
    __syncthreads();
    float sum = 0.0f;
    for (int i = lane; i < n; i += 32) sum = __fadd_rn(sum, s.exps[i]);
    sum = warp_reduce(sum, SumOp());
    score = __fdiv_rn(ex, sum);
  }
  uint64_t key = rank_key(expert ? order_key(score + bias) : 0u, e);
  if (p.groups > 1) {
    s.keys[e] = key;
    __syncthreads();  // also: the exponentials are read, group_keys may reuse them
    key = mask_groups(p, s, key);  // its barrier orders the scan's reads before the writes below
  }
  s.keys[e] = key;
  __syncwarp();
  const int warp_rank = count_greater(s.keys + 32 * warp, 32, key);
  const int per_warp = min(top_k, 32);
  if (warp_rank < per_warp) {
    s.candidates[warp * per_warp + warp_rank] = key;
    s.candidate_scores[warp * per_warp + warp_rank] = score;
  }
  __syncthreads();
  const int candidates = int(blockDim.x / 32) * per_warp;
  if (e < candidates) {
    const uint64_t candidate = s.candidates[e];
    const int rank = count_greater(s.candidates, candidates, candidate);
    if (rank < top_k) {
      s.chosen[rank] = int(~uint32_t(candidate));
      s.chosen_scores[rank] = s.candidate_scores[e];
    }
  }
  __syncthreads();
  if (e < top_k) {
    float total = 0.0f;
    for (int r = 0; r < top_k; ++r) total += s.chosen_scores[r];  // in choice order, as the CPU sums
    const float denom = p.sigmoid || p.sqrtsoftplus ? total + 1e-20f : total, w = s.chosen_scores[e];
    ids[row * top_k + e] = s.chosen[e];
    weights[row * top_k + e] = (p.normalize ? w / denom : w) * p.scaling;
  }
}

}  // namespace

void router_launch(const RouterArgs& p, const float* logits, int64_t rows, int32_t* expert_ids, float* weights,
                   cudaStream_t stream) {
  launch_dependent_kernel<router_kernel>(dim3(unsigned(rows)), dim3(unsigned((p.experts + 31) / 32 * 32)), 0, 1,
                                         stream, p, logits, expert_ids, weights);
}

}  // namespace moet::cuda
