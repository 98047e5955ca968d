// The k largest logits of each row and their token ids, best first: the candidates a row is
// sampled from when the whole row need not leave the device (docs/design.md, "Sampling"). One
// total order serves this kernel, the CUDA kernel (kernels/cuda/top_logits.h) and the Sampler's
// sort (engine/sampler.cpp): a larger value first, equal values by the lower id, -0 equal to +0,
// and a NaN below every number (-inf included), NaNs among themselves by id. With that order a
// row's first candidate is argmax() of engine/sampler.h (NaNs skipped; an all-NaN row gives id 0).
#pragma once

#include <cstdint>
#include <cstring>
#include <vector>

namespace moet {

// The value's place in the order as an unsigned integer (larger = better): -0 as +0, NaN 0.
// Branch-free: the sign bit selects between setting the top bit and flipping every bit.
inline uint32_t logit_order_key(float v) {
  const float unsigned_zero = v + 0.0f;  // -0 + 0 = +0; anything else unchanged
  uint32_t bits;
  std::memcpy(&bits, &unsigned_zero, sizeof bits);
  const uint32_t key = bits ^ (uint32_t(int32_t(bits) >> 31) | 0x80000000u);  // -inf: 0x007fffff > 0
  return v == v ? key : 0u;
}

// The value whose key logit_order_key() gives (+0 for the key of +-0; key 0, a NaN's, gives -inf's
// neighbour below, which callers do not ask for).
inline float logit_of_order_key(uint32_t key) {
  const uint32_t bits = (key & 0x80000000u) ? (key & 0x7fffffffu) : ~key;
  float v;
  std::memcpy(&v, &bits, sizeof v);
  return v;
}

// Value and id in one integer, distinct for distinct ids: the larger key is the better candidate.
inline uint64_t logit_rank_key(float v, int32_t id) {
  return (uint64_t(logit_order_key(v)) << 32) | uint32_t(~uint32_t(id));
}

// Appends to `keys`, best first, the rank keys (ids = indices) of values[0, n) that are at least
// the k-th largest key of all n and below `below`; returns that k-th largest key (0 when k >= n).
// Called with growing k and `below` = the previous return, it extends one sorted prefix of the
// order. Only entries above a threshold estimated from every 64th value are selected among
// (about 2k + 600 of them), so a k much smaller than n costs one pass over the values. Throws
// moet::Error unless k >= 1.
uint64_t append_best_keys(const float* values, int64_t n, int64_t k, uint64_t below, std::vector<uint64_t>& keys);

// values[r, :k] / ids[r, :k] = the k best of logits[r, :vocab] in the order above (values bit for
// bit as in the row). Throws moet::Error unless 1 <= k <= vocab.
void top_logits(const float* logits, int64_t rows, int64_t vocab, int64_t k, float* values, int32_t* ids);

}  // namespace moet
