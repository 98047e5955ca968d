// Per-head RMSNorm + rope (see head_norm_rope.h). One warp per (row, set, head), 8 per block:
// the warp loads its head span into registers (rms_span.cuh), normalises it, stages it in shared
// memory so each lane can read the rotation partners of its own outputs, and writes the span
// back. Each pair's cos/sin is computed once per warp, while the span's loads are in flight. With
// a KV store, a k warp first writes its head to the row's cache slot (the final span from its
// registers, the floats outside the span copied from the head), and the v heads are a third set
// of warps that only copy their head into the slot. All global reads of a head happen before any
// of its writes, so rotating in place is safe; the slots, like everything else, are read after
// the wait. Launched as a programmatic dependent launch (launch.cuh) that waits for the previous
// kernel first.
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

// dst[i] = src[i] for i in [begin, end), the warp's lanes W floats apart (W = 4: both 16-byte
// aligned at begin, begin and end multiples of 4). Not unrolled: unrolled copies made ptxas spill
// registers in the float4 kernel.
template <int W>
__device__ __forceinline__ void copy_floats(float* dst, const float* src, int begin, int end, int lane) {
#pragma unroll 1
  for (int i = begin + lane * W; i < end; i += 32 * W) {
    float chunk[W];
    load_chunk(src + i, chunk);
    store_chunk(dst + i, chunk);
  }
}

// Slot `slot` of an F32 cache (the store is used with F32 caches only).
__device__ __forceinline__ float* f32_slot(uint8_t* cache, int64_t slot, int64_t slot_bytes) {
  return reinterpret_cast<float*>(cache + slot * slot_bytes);
}

// Head h of row t of the KV store's v into the row's cache slot.
template <int W>
__device__ __forceinline__ void copy_v_head(const KvStore& kv, int64_t t, int64_t h, int lane) {
  const PagedKvArgs& c = kv.cache;
  copy_floats<W>(f32_slot(c.v, kv.slots[t], c.slot_bytes) + h * c.v_dim, kv.v + (t * c.kv_heads + h) * c.v_dim, 0,
                 int(c.v_dim), lane);
}

// K head h of row t into the row's cache slot: its final span [start, start + len) from the
// registers, its other floats from the head itself (which the launch leaves unchanged outside
// the span).
template <int W, int kChunks>
__device__ __forceinline__ void store_k_head(const KvStore& kv, int64_t t, int64_t h, const RmsSpan<W, kChunks>& span,
                                             const float* head, int start, int len, int lane) {
  float* cached = f32_slot(kv.cache.k, kv.slots[t], kv.cache.slot_bytes) + h * kv.cache.k_dim;
  span.store(cached + start, len, lane, 32);
  copy_floats<W>(cached, head, 0, start, lane);
  copy_floats<W>(cached, head, start + len, int(kv.cache.k_dim), lane);
}

// kKv: the launch has a KV store (`kv` is unused otherwise; an instantiation of its own, so the
// kernels of rope and qk_norm_rope keep their register budget).
template <int W, int kChunks, bool kKv>
__global__ void __launch_bounds__(32 * kWarpsPerBlock)
    head_norm_rope_kernel(const __grid_constant__ RopeArgs rope, HeadSet first, HeadSet second,
                          const __grid_constant__ KvStore kv, int64_t rows, float eps, const int32_t* positions) {
  static_assert(32 * W * kChunks >= kMaxSpan);
  __shared__ float staged[kWarpsPerBlock][kMaxSpan];
  __shared__ float cos_of[kWarpsPerBlock][kMaxRopePairs], sin_of[kWarpsPerBlock][kMaxRopePairs];
  pdl_trigger();
  pdl_wait();  // the heads, positions and slots come from the previous kernels and copies
  const int warp = int(threadIdx.x >> 5), lane = int(threadIdx.x & 31);
  const int64_t rotated_heads = first.heads + second.heads;
  const int64_t heads = rotated_heads + (kKv ? kv.cache.kv_heads : 0);
  const int64_t group = int64_t(blockIdx.x) * kWarpsPerBlock + warp;
  if (group >= rows * heads) return;  // whole warps leave; nothing below synchronises the block
  const int64_t t = group / heads, index = group % heads;
  if (kKv && index >= rotated_heads) {
    copy_v_head<W>(kv, t, index - rotated_heads, lane);
    return;
  }
  const bool in_first = index < first.heads;
  const HeadSet set = in_first ? first : second;
  const int64_t h = in_first ? index : index - first.heads;
  float* head = set.x + t * set.row_stride + h * set.head_stride;
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
  if (kKv && !in_first) store_k_head(kv, t, h, v, head, start, len, lane);
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

// Whether float4 accesses reach every cache head and v head of the store.
bool vector_access(const KvStore& kv) {
  const auto aligned = [](const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; };
  return aligned(kv.cache.k) && aligned(kv.cache.v) && aligned(kv.v) && kv.cache.slot_bytes % 16 == 0 &&
         kv.cache.k_dim % 4 == 0 && kv.cache.v_dim % 4 == 0;
}

template <bool kKv>
void launch(const RopeArgs& rope, const HeadSet& first, const HeadSet& second, const KvStore& kv, int64_t rows,
            float eps, const int32_t* positions, cudaStream_t stream) {
  const int64_t groups = rows * (first.heads + second.heads + (kKv ? kv.cache.kv_heads : 0));
  if (groups == 0) return;
  const unsigned blocks = unsigned((groups + kWarpsPerBlock - 1) / kWarpsPerBlock), threads = 32 * kWarpsPerBlock;
  if (vector_access(first, rope.pairs) && vector_access(second, rope.pairs) && (!kKv || vector_access(kv))) {
    launch_dependent_kernel<head_norm_rope_kernel<4, 2, kKv>>(blocks, threads, 0, 1, stream, rope, first, second, kv,
                                                              rows, eps, positions);
  } else {
    launch_dependent_kernel<head_norm_rope_kernel<1, 8, kKv>>(blocks, threads, 0, 1, stream, rope, first, second, kv,
                                                              rows, eps, positions);
  }
}

}  // namespace

void head_norm_rope_launch(const RopeArgs& rope, const HeadSet& first, const HeadSet& second, int64_t rows,
                           float eps, const int32_t* positions, cudaStream_t stream) {
  launch<false>(rope, first, second, KvStore{}, rows, eps, positions, stream);
}

void head_norm_rope_kv_launch(const RopeArgs& rope, const HeadSet& q, const HeadSet& k, const KvStore& kv,
                              int64_t rows, float eps, const int32_t* positions, cudaStream_t stream) {
  launch<true>(rope, q, k, kv, rows, eps, positions, stream);
}

}  // namespace moet::cuda
