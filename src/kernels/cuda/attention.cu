// Paged attention and KV writes (see attention.h).
#include "kernels/cuda/attention.h"

#include "kernels/cuda/block_reduce.cuh"

namespace moet::cuda {
namespace {

constexpr int kThreads = 128;

__device__ __forceinline__ int64_t key_slot(const AttentionArgs& a, const int32_t* table, int64_t j) {
  return int64_t(table[j / a.cache.block_size]) * a.cache.block_size + j % a.cache.block_size;
}

__global__ void __launch_bounds__(kThreads) attention_kernel(AttentionArgs a) {
  extern __shared__ float shared[];
  __shared__ float scratch[32];
  const int64_t t = blockIdx.y, h = blockIdx.x;
  const int64_t k_dim = a.cache.k_dim, v_dim = a.cache.v_dim;
  const int64_t kv_head = h / (a.q_heads / a.cache.kv_heads);
  const int32_t* table = a.block_tables + int64_t(a.row_seq[t]) * a.table_stride;
  const int64_t keys = int64_t(a.positions[t]) + 1;
  float* q = shared;              // [k_dim]
  float* scores = shared + k_dim; // [keys]
  const float* q_src = a.q + (t * a.q_heads + h) * a.q_stride;
  for (int64_t i = threadIdx.x; i < k_dim; i += kThreads) q[i] = q_src[i];
  __syncthreads();

  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  float local_max = -INFINITY;
  for (int64_t j = warp; j < keys; j += kThreads / 32) {
    const float* kj = a.cache.k + key_slot(a, table, j) * a.cache.token_stride + kv_head * k_dim;
    float dot = 0.0f;
    for (int64_t i = lane; i < k_dim; i += 32) dot = fmaf(q[i], kj[i], dot);
    dot = warp_reduce(dot, SumOp()) * a.scale;
    if (lane == 0) scores[j] = dot;
    local_max = fmaxf(local_max, dot);
  }
  const float max_score = block_reduce(local_max, MaxOp(), -INFINITY, scratch);
  float local_sum = 0.0f;
  for (int64_t j = threadIdx.x; j < keys; j += kThreads) {
    const float p = expf(scores[j] - max_score);
    scores[j] = p;
    local_sum += p;
  }
  const float denom = block_reduce(local_sum, SumOp(), 0.0f, scratch);  // also orders the stores above

  float* out = a.out + (t * a.q_heads + h) * v_dim;
  for (int64_t d = threadIdx.x; d < v_dim; d += kThreads) {
    float acc = 0.0f;
    for (int64_t j = 0; j < keys; ++j) {
      const float* vj = a.cache.v + key_slot(a, table, j) * a.cache.token_stride + kv_head * v_dim;
      acc = fmaf(scores[j] / denom, vj[d], acc);
    }
    out[d] = acc;
  }
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

size_t attention_shared_bytes(const AttentionArgs& a) { return size_t(a.cache.k_dim + a.max_keys) * sizeof(float); }

size_t attention_max_shared_bytes() {
  int device = 0, bytes = 0;
  cudaGetDevice(&device);
  cudaDeviceGetAttribute(&bytes, cudaDevAttrMaxSharedMemoryPerBlockOptin, device);
  return size_t(bytes) - 32 * sizeof(float);
}

void attention_launch(const AttentionArgs& a, cudaStream_t stream) {
  const size_t shared = attention_shared_bytes(a);
  if (shared > 48 * 1024)
    cudaFuncSetAttribute(attention_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(shared));
  attention_kernel<<<dim3(unsigned(a.q_heads), unsigned(a.rows)), kThreads, shared, stream>>>(a);
}

void kv_write_launch(const PagedKvArgs& cache, const float* k, const float* v, const int64_t* slots,
                     int64_t rows, cudaStream_t stream) {
  kv_write_kernel<<<unsigned(rows), 256, 0, stream>>>(cache, k, v, slots);
}

}  // namespace moet::cuda
