// The k largest logits of each row and their token ids, best first: the candidates a row is
// sampled from when the whole row need not leave the device (docs/design.md, "Sampling"). One
// total order serves this kernel, the CUDA kernel (kernels/cuda/top_logits.h) and the Sampler's
// sort (engine/sampler.cpp): a larger value first, equal values by the lower id, -0 equal to +0,
// and a NaN below every number (-inf included), NaNs among themselves by id. With that order a
// row's first candidate is argmax() of engine/sampler.h (NaNs skipped; an all-NaN row gives id 0).
#pragma once

#include <cstdint>
#include <cstring>

namespace moet {

// The value's place in the order as an unsigned integer (larger = better): -0 as +0, NaN 0.
inline uint32_t logit_order_key(float v) {
  if (v != v) return 0;
  if (v == 0.0f) v = 0.0f;
  uint32_t bits;
  std::memcpy(&bits, &v, sizeof bits);
  return (bits & 0x80000000u) ? ~bits : (bits | 0x80000000u);  // -inf: 0x007fffff > 0
}

// Value and id in one integer, distinct for distinct ids: the larger key is the better candidate.
inline uint64_t logit_rank_key(float v, int32_t id) {
  return (uint64_t(logit_order_key(v)) << 32) | uint32_t(~uint32_t(id));
}

// values[r, :k] / ids[r, :k] = the k best of logits[r, :vocab] in the order above (values bit for
// bit as in the row). Throws moet::Error unless 1 <= k <= vocab.
void top_logits(const float* logits, int64_t rows, int64_t vocab, int64_t k, float* values, int32_t* ids);

}  // namespace moet
