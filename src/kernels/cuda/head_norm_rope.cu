// Per-head RMSNorm + rope (see head_norm_rope.h). One warp per (row, set, head), 8 per block:
// the warp loads its head span into registers (rms_span.cuh), normalises it, stages it in shared
// memory so each lane can read the rotation partners of its own outputs, and writes the span
// back. Each pair's cos/sin is computed once per warp, while the span's loads are in flight. All
// global reads of a head happen before any of its writes, so rotating in place is safe. Launched
// as a programmatic dependent launch (launch.cuh) that waits for the previous kernel first.
#include "kernels/cuda/head_norm_rope.h"

#include "kernels/cuda/launch.cuh"
#include "kernels/cuda/rms_span.cuh"

namespace moet::cuda {
namespace {

constexpr int kWarpsPerBlock = 8;
constexpr int kMaxSpan = int(kHeadNormRopeMaxSpan);

// Output r (< 2 * pairs) of the rotated slice starting at span[first], the CPU's expressions.
__device__ __forceinline__ float rotated(const float* span, int first, int r, int pairs, bool interleaved,
                                         const float* cos_of, const float* sin_of) {
  const int i = r < pairs ? r : r - pairs;
  const float a = interleaved ? span[first + 2 * i] : span[first + i];
  const float b = interleaved ? span[first + 2 * i + 1] : span[first + i + pairs];
  const float c = cos_of[i], s = sin_of[i];
  return r < pairs ? a * c - b * s : b * c + a * s;
}

template <int W, int kChunks>
__global__ void __launch_bounds__(32 * kWarpsPerBlock)
    head_norm_rope_kernel(const __grid_constant__ RopeArgs rope, HeadSet first, HeadSet second, int64_t rows,
                          float eps, const int32_t* positions) {
  static_assert(32 * W * kChunks >= kMaxSpan);
  __shared__ float staged[kWarpsPerBlock][kMaxSpan];
  __shared__ float cos_of[kWarpsPerBlock][kMaxRopePairs], sin_of[kWarpsPerBlock][kMaxRopePairs];
  pdl_trigger();
  pdl_wait();  // the heads and positions come from the previous kernels and copies
  const int warp = int(threadIdx.x >> 5), lane = int(threadIdx.x & 31);
  const int64_t heads = first.heads + second.heads, group = int64_t(blockIdx.x) * kWarpsPerBlock + warp;
  if (group >= rows * heads) return;  // whole warps leave; nothing below synchronises the block
  const int64_t t = group / heads, index = group % heads;
  const bool in_first = index < first.heads;
  const HeadSet set = in_first ? first : second;
  float* head = set.x + t * set.row_stride + (in_first ? index : index - first.heads) * set.head_stride;
  const bool norm = set.norm_weight != nullptr;
  const int start = norm ? 0 : int(set.rope_offset), len = norm ? int(set.norm_dim) : 2 * rope.pairs;
  RmsSpan<W, kChunks> v, weight;
  v.load(head + start, len, lane, 32);
  if (norm) weight.load(set.norm_weight, len, lane, 32);
  const float position = float(positions[t]);
  for (int i = lane; i < rope.pairs; i += 32) {
    float s, c;
    sincosf(position * rope.inv_freq[i], &s, &c);
    cos_of[warp][i] = c * rope.scale;
    sin_of[warp][i] = s * rope.scale;
  }
  if (norm) v.normalise(weight, rms_inverse(warp_reduce(v.sum_squares(), SumOp()), len, eps));
  v.store(staged[warp], len, lane, 32);
  __syncwarp();
  const int rotated_first = int(set.rope_offset) - start;  // the rotated slice's place in the span
#pragma unroll
  for (int j = 0; j < kChunks; ++j) {
    const int chunk = RmsSpan<W, kChunks>::chunk_start(j, len, lane, 32);
#pragma unroll
    for (int i = 0; i < W; ++i) {
      const int r = chunk + i - rotated_first;
      if (chunk >= 0 && r >= 0 && r < 2 * rope.pairs)
        v.v[j][i] = rotated(staged[warp], rotated_first, r, rope.pairs, rope.interleaved, cos_of[warp], sin_of[warp]);
    }
  }
  v.store(head + start, len, lane, 32);
}

// Whether float4 accesses reach every head span of the set.
bool vector_access(const HeadSet& s, int pairs) {
  if (s.heads == 0) return true;
  const bool norm = s.norm_weight != nullptr;
  const int64_t start = norm ? 0 : s.rope_offset, len = norm ? s.norm_dim : 2 * pairs;
  return reinterpret_cast<uintptr_t>(s.x) % 16 == 0 && reinterpret_cast<uintptr_t>(s.norm_weight) % 16 == 0 &&
         s.row_stride % 4 == 0 && s.head_stride % 4 == 0 && start % 4 == 0 && len % 4 == 0;
}

}  // namespace

void head_norm_rope_launch(const RopeArgs& rope, const HeadSet& first, const HeadSet& second, int64_t rows,
                           float eps, const int32_t* positions, cudaStream_t stream) {
  const int64_t groups = rows * (first.heads + second.heads);
  if (groups == 0) return;
  const unsigned blocks = unsigned((groups + kWarpsPerBlock - 1) / kWarpsPerBlock), threads = 32 * kWarpsPerBlock;
  if (vector_access(first, rope.pairs) && vector_access(second, rope.pairs)) {
    launch_dependent_kernel<head_norm_rope_kernel<4, 2>>(blocks, threads, 0, 1, stream, rope, first, second, rows, eps,
                                                         positions);
  } else {
    launch_dependent_kernel<head_norm_rope_kernel<1, 8>>(blocks, threads, 0, 1, stream, rope, first, second, rows, eps,
                                                         positions);
  }
}

}  // namespace moet::cuda
