// The softmax partial of the decode attention kernels (attention.cu, splitk_attention.cu,
// splitk_mla_attention.cu, splitk_fold.cu) and its fold: the state of a softmax over some keys for
// one float4 of one head's output, the rule that joins two such states, and the fold of a row's
// splits in order (splitk_fold.cu's). Explicitly rounded operations, so every call site computes
// the same bits whatever the compiler contracts around it.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace moet::cuda {

// Maximum score m, sum l of exp(score - m), o = sum of exp(score - m) * v.
struct Partial {
  float m, l;
  float4 o;
};

__device__ __forceinline__ Partial cleared() { return {-INFINITY, 0.0f, make_float4(0.0f, 0.0f, 0.0f, 0.0f)}; }

__device__ __forceinline__ float scaled_sum(float x, float a, float y, float b) {
  return __fadd_rn(__fmul_rn(x, a), __fmul_rn(y, b));
}

// acc <- acc (+) s, both rescaled to the larger maximum. From the cleared state the fold is exact
// (a = 0, b = 1): acc becomes s. s must be non-empty (finite m).
__device__ __forceinline__ void fold(Partial& acc, const Partial& s) {
  const float m = fmaxf(acc.m, s.m);
  const float a = expf(acc.m - m), b = expf(s.m - m);
  acc.l = scaled_sum(acc.l, a, s.l, b);
  acc.o = make_float4(scaled_sum(acc.o.x, a, s.o.x, b), scaled_sum(acc.o.y, a, s.o.y, b),
                      scaled_sum(acc.o.z, a, s.o.z, b), scaled_sum(acc.o.w, a, s.o.w, b));
  acc.m = m;
}

// The partial stored at src by another block of this launch (m, l, two unused floats, then the
// output's float4s), float4 d4 of its output; read through L2.
__device__ __forceinline__ Partial load_partial(const float* src, int d4) {
  return {__ldcg(src), __ldcg(src + 1), __ldcg(reinterpret_cast<const float4*>(src + 4) + d4)};
}

// Splits folded per batch by fold_splits: the loads of a batch are issued before its folds, so a
// thread waits on one L2 round trip per batch instead of one per split.
constexpr int kFoldBatch = 16;

// Splits 0..used-1 of one head's partials (`width` floats apart from `first`) folded in order,
// float4 d4 of the output. The order of the folds, hence every bit, does not depend on the batch.
__device__ __forceinline__ Partial fold_splits(const float* first, int64_t width, int used, int d4) {
  Partial total = cleared();
  for (int base = 0; base < used; base += kFoldBatch) {
    Partial batch[kFoldBatch];
#pragma unroll
    for (int i = 0; i < kFoldBatch; ++i)
      if (base + i < used) batch[i] = load_partial(first + (base + i) * width, d4);
#pragma unroll
    for (int i = 0; i < kFoldBatch; ++i)
      if (base + i < used) fold(total, batch[i]);
  }
  return total;
}

// out[0..n) <- o / l, n <= 4 (the last float4 of a row may be cut).
__device__ __forceinline__ void store_normalised(float* out, const Partial& p, int n) {
  const float o[4] = {p.o.x, p.o.y, p.o.z, p.o.w};
#pragma unroll
  for (int c = 0; c < 4; ++c)
    if (c < n) out[c] = __fdiv_rn(o[c], p.l);
}

}  // namespace moet::cuda
