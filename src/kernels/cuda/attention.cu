// Paged attention and KV writes (see attention.h).
#include "kernels/cuda/attention.h"

#include "kernels/cuda/block_reduce.cuh"

namespace moet::cuda {
namespace {

constexpr int kThreads = 128;
constexpr int kChunk = kThreads;  // keys per chunk: one score per thread
constexpr int kVPer = int(kAttentionMaxVDim) / kThreads;  // value columns per thread
static_assert(kAttentionSegment % kChunk == 0, "a segment is whole chunks");

struct Shared {
  float q[kAttentionMaxKDim];
  float p[kChunk];      // the chunk's scores, then their exp(score - running max)
  int64_t row[kChunk];  // float offset of each key's cache row (slot * token_stride)
  float scratch[32];
};

// The state of an online softmax over some keys, for this thread's value columns
// d = threadIdx.x + i * kThreads: maximum score m, sum l of exp(score - m), o = sum of
// exp(score - m) * v[d].
struct Partial {
  float m, l;
  float o[kVPer];
};

__device__ __forceinline__ void partial_clear(Partial& s) {
  s.m = -INFINITY;
  s.l = 0.0f;
#pragma unroll
  for (int i = 0; i < kVPer; ++i) s.o[i] = 0.0f;
}

// acc <- acc (+) s, both rescaled to the larger maximum. Explicitly rounded operations, so every
// call site (the fused loop, the combine kernel) computes the same bits. From the cleared state
// the fold is exact (a = 0, b = 1): acc becomes s.
__device__ __forceinline__ void fold(Partial& acc, const Partial& s) {
  const float m = fmaxf(acc.m, s.m);
  const float a = expf(acc.m - m), b = expf(s.m - m);
  acc.l = __fadd_rn(__fmul_rn(acc.l, a), __fmul_rn(s.l, b));
#pragma unroll
  for (int i = 0; i < kVPer; ++i) acc.o[i] = __fadd_rn(__fmul_rn(acc.o[i], a), __fmul_rn(s.o[i], b));
  acc.m = m;
}

// Keys [begin, end) of the row whose block table is `table`, against the query in sh.q.
__device__ __forceinline__ void segment(const AttentionArgs& a, Shared& sh, const int32_t* table, int64_t kv_head,
                                        int64_t begin, int64_t end, Partial& out) {
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int64_t k_dim = a.cache.k_dim, v_dim = a.cache.v_dim, block_size = a.cache.block_size;
  partial_clear(out);
  for (int64_t c0 = begin; c0 < end; c0 += kChunk) {
    const int n = int(end - c0 < kChunk ? end - c0 : kChunk);
    // Scores: one warp per key, lanes over the head dimension, a fixed shuffle tree.
    for (int jj = warp; jj < n; jj += kThreads / 32) {
      const int64_t j = c0 + jj;
      const int64_t row = (int64_t(table[j / block_size]) * block_size + j % block_size) * a.cache.token_stride;
      const float* kj = a.cache.k + row + kv_head * k_dim;
      float dot = 0.0f;
      for (int64_t i = lane; i < k_dim; i += 32) dot = fmaf(sh.q[i], kj[i], dot);
      dot = __fmul_rn(warp_reduce(dot, SumOp()), a.scale);
      if (lane == 0) {
        sh.p[jj] = dot;
        sh.row[jj] = row;
      }
    }
    __syncthreads();
    const float s = threadIdx.x < n ? sh.p[threadIdx.x] : -INFINITY;
    const float m = fmaxf(out.m, block_reduce(s, MaxOp(), -INFINITY, sh.scratch));
    const float p = threadIdx.x < n ? expf(s - m) : 0.0f;
    if (threadIdx.x < n) sh.p[threadIdx.x] = p;
    const float sum = block_reduce(p, SumOp(), 0.0f, sh.scratch);  // its barriers publish p[]
    const float alpha = expf(out.m - m);                             // 0 on the first chunk
    out.l = __fadd_rn(__fmul_rn(out.l, alpha), sum);
#pragma unroll
    for (int i = 0; i < kVPer; ++i) {
      const int64_t d = threadIdx.x + int64_t(i) * kThreads;
      if (d < v_dim) {
        const float* v = a.cache.v + kv_head * v_dim + d;
        float acc = __fmul_rn(out.o[i], alpha);
#pragma unroll 4
        for (int jj = 0; jj < n; ++jj) acc = fmaf(sh.p[jj], v[sh.row[jj]], acc);  // key order
        out.o[i] = acc;
      }
    }
    out.m = m;
    __syncthreads();  // p[] and row[] are rewritten by the next chunk
  }
}

__device__ __forceinline__ void write_out(const AttentionArgs& a, int64_t t, int64_t h, const Partial& total) {
  float* out = a.out + (t * a.q_heads + h) * a.cache.v_dim;
#pragma unroll
  for (int i = 0; i < kVPer; ++i) {
    const int64_t d = threadIdx.x + int64_t(i) * kThreads;
    if (d < a.cache.v_dim) out[d] = __fdiv_rn(total.o[i], total.l);
  }
}

__device__ __forceinline__ int64_t row_segments(const AttentionArgs& a, int64_t t) {
  return (int64_t(a.positions[t]) + 1 + kAttentionSegment - 1) / kAttentionSegment;
}

// grid (q_heads, rows, splits). Fused (partials null, splits 1): the block folds every segment
// of its row and writes the output. Split: block z computes segment z and writes its partial.
__global__ void __launch_bounds__(kThreads) attention_kernel(AttentionArgs a) {
  __shared__ Shared sh;
  const int64_t h = blockIdx.x, t = blockIdx.y, z = blockIdx.z;
  const int64_t keys = int64_t(a.positions[t]) + 1, segments = row_segments(a, t);
  if (z >= segments) return;  // this row needs fewer segments than the grid has (whole block)
  const int64_t kv_head = h / (a.q_heads / a.cache.kv_heads);
  const int32_t* table = a.block_tables + int64_t(a.row_seq[t]) * a.table_stride;
  const float* q_src = a.q + (t * a.q_heads + h) * a.q_stride;
  for (int64_t i = threadIdx.x; i < a.cache.k_dim; i += kThreads) sh.q[i] = q_src[i];
  __syncthreads();
  Partial part;
  if (a.partials != nullptr) {
    const int64_t begin = z * kAttentionSegment, end = keys < begin + kAttentionSegment ? keys : begin + kAttentionSegment;
    segment(a, sh, table, kv_head, begin, end, part);
    float* dst = a.partials + ((t * a.q_heads + h) * a.splits + z) * (a.cache.v_dim + 2);
    if (threadIdx.x == 0) {
      dst[0] = part.m;
      dst[1] = part.l;
    }
#pragma unroll
    for (int i = 0; i < kVPer; ++i) {
      const int64_t d = threadIdx.x + int64_t(i) * kThreads;
      if (d < a.cache.v_dim) dst[2 + d] = part.o[i];
    }
    return;
  }
  Partial total;
  partial_clear(total);
  for (int64_t s = 0; s < segments; ++s) {
    const int64_t begin = s * kAttentionSegment, end = keys < begin + kAttentionSegment ? keys : begin + kAttentionSegment;
    segment(a, sh, table, kv_head, begin, end, part);
    fold(total, part);
  }
  write_out(a, t, h, total);
}

// Split mode, grid (q_heads, rows): folds the row's partials in segment order.
__global__ void __launch_bounds__(kThreads) attention_combine_kernel(AttentionArgs a) {
  const int64_t h = blockIdx.x, t = blockIdx.y, width = a.cache.v_dim + 2;
  const int64_t segments = row_segments(a, t);
  const float* src = a.partials + (t * a.q_heads + h) * a.splits * width;
  Partial total, part;
  partial_clear(total);
  for (int64_t s = 0; s < segments; ++s) {
    const float* p = src + s * width;
    part.m = p[0];
    part.l = p[1];
#pragma unroll
    for (int i = 0; i < kVPer; ++i) {
      const int64_t d = threadIdx.x + int64_t(i) * kThreads;
      part.o[i] = d < a.cache.v_dim ? p[2 + d] : 0.0f;
    }
    fold(total, part);
  }
  write_out(a, t, h, total);
}

__global__ void kv_write_kernel(PagedKvArgs cache, const float* k, const float* v, const int64_t* slots) {
  const int64_t t = blockIdx.x;
  const int64_t k_row = cache.kv_heads * cache.k_dim, v_row = cache.kv_heads * cache.v_dim;
  float* k_dst = cache.k + slots[t] * cache.token_stride;
  for (int64_t i = threadIdx.x; i < k_row; i += blockDim.x) k_dst[i] = k[t * k_row + i];
  if (v == nullptr) return;
  float* v_dst = cache.v + slots[t] * cache.token_stride;
  for (int64_t i = threadIdx.x; i < v_row; i += blockDim.x) v_dst[i] = v[t * v_row + i];
}

}  // namespace

void attention_launch(const AttentionArgs& a, cudaStream_t stream) {
  const unsigned heads = unsigned(a.q_heads), rows = unsigned(a.rows);
  if (a.partials == nullptr) {
    attention_kernel<<<dim3(heads, rows, 1), kThreads, 0, stream>>>(a);
    return;
  }
  attention_kernel<<<dim3(heads, rows, unsigned(a.splits)), kThreads, 0, stream>>>(a);
  attention_combine_kernel<<<dim3(heads, rows), kThreads, 0, stream>>>(a);
}

void kv_write_launch(const PagedKvArgs& cache, const float* k, const float* v, const int64_t* slots,
                     int64_t rows, cudaStream_t stream) {
  kv_write_kernel<<<unsigned(rows), 256, 0, stream>>>(cache, k, v, slots);
}

}  // namespace moet::cuda
