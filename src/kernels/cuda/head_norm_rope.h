// Per-head RMSNorm + rotary embedding on the GPU, in place, for up to two sets of heads in one
// launch: the q and k of an attention layer (the backend's qk_norm_rope), or one set without a
// norm (the backend's rope). Semantics of kernels/cpu/elementwise.h (rmsnorm) followed by
// kernels/cpu/rope.h (rope_apply): when a set has norm weights, each head's first norm_dim floats
// are RMS-normalised; then head[rope_offset : rope_offset + 2 * pairs] rotates by the angle of its
// row's position, as halves (x[i], x[i + pairs]) or as interleaved pairs de-interleaved on output.
// head_norm_rope_kv_launch also writes the step's K/V rows into a paged cache in the same launch
// (the backend's qk_norm_rope_kv_write): the k heads' final values and a copy of v, the result of
// kv_write_launch (attention.h) after the prologue.
#pragma once

#include "kernels/cuda/attention.h"

#include <cuda_runtime_api.h>

#include <cstdint>

namespace moet::cuda {

constexpr int kMaxRopePairs = 128;
struct RopeArgs {
  float inv_freq[kMaxRopePairs];
  int pairs;
  float scale;  // multiplies cos and sin
  bool interleaved;
};

// The widest span of a head one warp normalises or rotates.
constexpr int64_t kHeadNormRopeMaxSpan = 2 * kMaxRopePairs;

// One tensor's heads: head h of row t starts at x + t * row_stride + h * head_stride.
struct HeadSet {
  float* x = nullptr;
  int64_t heads = 0;  // 0: no set
  int64_t row_stride = 0, head_stride = 0;
  const float* norm_weight = nullptr;  // [norm_dim], or null: no norm
  int64_t norm_dim = 0;                // with a norm, the rotated slice lies inside [0, norm_dim)
  int64_t rope_offset = 0;
};

// Both sets' heads of rows [0, rows), row t at position positions[t] (device memory).
void head_norm_rope_launch(const RopeArgs& rope, const HeadSet& first, const HeadSet& second, int64_t rows,
                           float eps, const int32_t* positions, cudaStream_t stream);

// The KV write fused into the prologue, for F32 caches (other dtypes take kv_write_launch): row
// t's k heads (the second set, after norm and rope; the cache's kv_heads heads of k_dim floats)
// go to slot slots[t] of cache.k, and row t of v
// ([rows, kv_heads * v_dim], device memory) to the same slot of cache.v (not aliasing cache.k).
struct KvStore {
  PagedKvArgs cache{};
  const float* v = nullptr;
  const int64_t* slots = nullptr;  // [rows] (device memory)
};

// head_norm_rope_launch(rope, q, k, ...), then cache slot slots[t] <- row t of k and of v, in one
// launch; k.heads == kv.cache.kv_heads and each k head's rotated span lies inside its k_dim floats.
void head_norm_rope_kv_launch(const RopeArgs& rope, const HeadSet& q, const HeadSet& k, const KvStore& kv,
                              int64_t rows, float eps, const int32_t* positions, cudaStream_t stream);

}  // namespace moet::cuda
