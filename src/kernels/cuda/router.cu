// Top-k routing (see router.h): one warp per row, no block barriers. Lane l holds experts
// e = l + 32 i in registers; each of the top_k rounds takes every lane's best untaken expert and
// the warp's argmax of those (value, then lower index) in two reduction instructions. Group scores (sum of a group's two best
// choices, the CPU's order) are scanned by one lane per group from the warp's shared-memory copy
// of the choices, and the kept groups found by the same argmax rounds.
#include "kernels/cuda/router.h"

#include "kernels/cuda/block_reduce.cuh"
#include "kernels/cuda/launch.cuh"

namespace moet::cuda {
namespace {

constexpr int kWarps = 4;          // rows per block
constexpr int kMaxExperts = 1024;
constexpr int kMaxPerLane = kMaxExperts / 32;
constexpr int kMaxTopK = 64;

// An expert (or group) candidate: the better one has the larger value, ties the lower index.
struct Candidate {
  float value;
  int index;
};

__device__ __forceinline__ Candidate better(Candidate a, Candidate b) {
  return (a.value > b.value || (a.value == b.value && a.index < b.index)) ? a : b;
}

// The warp's best candidate, in every lane: the largest value, found as the largest
// order-preserving integer key (one warp reduction instruction, sm_80+), then the lowest index
// among the lanes holding it; -0 ranks as +0 (they compare equal). Indices are distinct, so the
// result is the one better() would pick.
__device__ __forceinline__ Candidate warp_best(Candidate c) {
  const uint32_t bits = __float_as_uint(c.value == 0.0f ? 0.0f : c.value);
  const uint32_t key = (bits & 0x80000000u) ? ~bits : (bits | 0x80000000u);
  const uint32_t best_key = __reduce_max_sync(0xffffffffu, key);
  const uint32_t index = __reduce_min_sync(0xffffffffu, key == best_key ? uint32_t(c.index) : 0xffffffffu);
  return {__uint_as_float((best_key & 0x80000000u) ? (best_key & 0x7fffffffu) : ~best_key), int(index)};
}

// The best of values[i] (index lane + 32 i, i < count) whose bit in `taken` is clear, over the warp;
// the winner's bit is set in its lane's `taken`.
__device__ __forceinline__ Candidate take_best(const float (&values)[kMaxPerLane], int count, int limit,
                                               uint32_t& taken) {
  const int lane = threadIdx.x & 31;
  Candidate best{-INFINITY, limit};
#pragma unroll
  for (int i = 0; i < kMaxPerLane; ++i) {
    if (i >= count) break;
    if (lane + 32 * i < limit && !((taken >> i) & 1u)) best = better(best, {values[i], lane + 32 * i});
  }
  best = warp_best(best);
  if (best.index % 32 == lane) taken |= 1u << (best.index / 32);
  return best;
}

__device__ __forceinline__ float pick(const float (&values)[kMaxPerLane], int i) {
  float v = 0.0f;
#pragma unroll
  for (int j = 0; j < kMaxPerLane; ++j)
    if (j == i) v = values[j];
  return v;
}

// choice[e] <- -inf for the experts outside the top_groups best groups (group score: 0 + the
// group's best choice + its second best, as the CPU sums them).
__device__ void mask_groups(const RouterArgs& p, int per_lane, float (&choice)[kMaxPerLane], float* shared,
                            unsigned char* kept) {
  const int lane = threadIdx.x & 31, n = int(p.experts), groups = int(p.groups), per_group = n / groups;
  auto at = [](int e) { return e + e / 32; };  // one pad per 32: a lane per group scans without conflicts
#pragma unroll
  for (int i = 0; i < kMaxPerLane; ++i) {
    if (i >= per_lane) break;
    if (lane + 32 * i < n) shared[at(lane + 32 * i)] = choice[i];
  }
  __syncwarp();
  float group_score[kMaxPerLane];
  const int groups_per_lane = (groups + 31) / 32;
#pragma unroll
  for (int j = 0; j < kMaxPerLane; ++j) {
    if (j >= groups_per_lane) break;
    const int g = lane + 32 * j;
    group_score[j] = -INFINITY;
    if (g >= groups) continue;
    const float* members = shared;
    const int base = g * per_group;
    int first = 0;
    for (int i = 1; i < per_group; ++i)
      if (members[at(base + i)] > members[at(base + first)]) first = i;
    float total = 0.0f + members[at(base + first)];
    if (per_group > 1) {
      int second = first == 0 ? 1 : 0;
      for (int i = 0; i < per_group; ++i)
        if (i != first && members[at(base + i)] > members[at(base + second)]) second = i;
      total += members[at(base + second)];
    }
    group_score[j] = total;
  }
  uint32_t kept_groups = 0;
  for (int r = 0; r < p.top_groups; ++r) take_best(group_score, groups_per_lane, groups, kept_groups);
#pragma unroll
  for (int j = 0; j < kMaxPerLane; ++j) {
    if (j >= groups_per_lane) break;
    if (lane + 32 * j < groups) kept[lane + 32 * j] = (kept_groups >> j) & 1u;
  }
  __syncwarp();
#pragma unroll
  for (int i = 0; i < kMaxPerLane; ++i) {
    if (i >= per_lane) break;
    const int e = lane + 32 * i;
    if (e < n && !kept[e / per_group]) choice[i] = -INFINITY;
  }
}

__global__ void __launch_bounds__(kWarps * 32) router_kernel(RouterArgs p, const float* logits, int64_t rows,
                                                             int32_t* ids, float* weights) {
  __shared__ float shared_choice[kWarps][kMaxExperts + kMaxExperts / 32];
  __shared__ unsigned char shared_kept[kWarps][kMaxExperts];
  pdl_trigger();
  pdl_wait();  // the logits come from the previous kernel
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int64_t row = int64_t(blockIdx.x) * kWarps + warp;
  if (row >= rows) return;
  const int n = int(p.experts), per_lane = (n + 31) / 32;
  const float* x = logits + row * n;
  float score[kMaxPerLane], choice[kMaxPerLane];
#pragma unroll
  for (int i = 0; i < kMaxPerLane; ++i) {
    if (i >= per_lane) break;
    score[i] = lane + 32 * i < n ? x[lane + 32 * i] : -INFINITY;
  }
  if (p.sigmoid) {
#pragma unroll
    for (int i = 0; i < kMaxPerLane; ++i) {
      if (i >= per_lane) break;
      score[i] = 1.0f / (1.0f + expf(-score[i]));
    }
  } else {
    float m = -INFINITY;
#pragma unroll
    for (int i = 0; i < kMaxPerLane; ++i) {
      if (i >= per_lane) break;
      m = fmaxf(m, score[i]);
    }
    m = warp_reduce(m, MaxOp());
    float sum = 0.0f;
#pragma unroll
    for (int i = 0; i < kMaxPerLane; ++i) {
      if (i >= per_lane) break;
      score[i] = expf(score[i] - m);  // 0 past the experts
      sum = __fadd_rn(sum, score[i]);
    }
    sum = warp_reduce(sum, SumOp());
#pragma unroll
    for (int i = 0; i < kMaxPerLane; ++i) {
      if (i >= per_lane) break;
      score[i] = __fdiv_rn(score[i], sum);
    }
  }
#pragma unroll
  for (int i = 0; i < kMaxPerLane; ++i) {
    if (i >= per_lane) break;
    const int e = lane + 32 * i;
    choice[i] = e < n ? score[i] + (p.correction_bias ? p.correction_bias[e] : 0.0f) : -INFINITY;
  }
  if (p.groups > 1) mask_groups(p, per_lane, choice, shared_choice[warp], shared_kept[warp]);
  uint32_t taken = 0;
  float total = 0.0f, chosen_score[kMaxTopK / 32] = {};
  int chosen[kMaxTopK / 32] = {};
  for (int r = 0; r < p.top_k; ++r) {
    const Candidate best = take_best(choice, per_lane, n, taken);
    const float s = __shfl_sync(0xffffffffu, pick(score, best.index / 32), best.index % 32);
    total += s;  // in choice order, as the CPU sums
#pragma unroll
    for (int c = 0; c < kMaxTopK / 32; ++c)
      if (r == lane + 32 * c) {  // lane l keeps choices l and l + 32 (static register indices)
        chosen[c] = best.index;
        chosen_score[c] = s;
      }
  }
  const float denom = p.sigmoid ? total + 1e-20f : total;
#pragma unroll
  for (int c = 0; c < kMaxTopK / 32; ++c) {
    const int r = lane + 32 * c;
    if (r >= p.top_k) break;
    ids[row * p.top_k + r] = chosen[c];
    weights[row * p.top_k + r] = (p.normalize ? chosen_score[c] / denom : chosen_score[c]) * p.scaling;
  }
}

}  // namespace

void router_launch(const RouterArgs& p, const float* logits, int64_t rows, int32_t* expert_ids, float* weights,
                   cudaStream_t stream) {
  launch_dependent_kernel<router_kernel>(dim3(unsigned((rows + kWarps - 1) / kWarps)), dim3(kWarps * 32), 0, 1, stream,
                                         p, logits, rows, expert_ids, weights);
}

}  // namespace moet::cuda
