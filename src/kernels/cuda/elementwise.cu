// Embedding, RMSNorm, SiLU-and-mul, add and rope (see elementwise.h).
#include "kernels/cuda/elementwise.h"

#include "kernels/cuda/block_reduce.cuh"

namespace moet::cuda {
namespace {

__global__ void embedding_kernel(const int32_t* ids, const void* table, bool bf16, int64_t dim, float* out) {
  const int64_t t = blockIdx.x, row = ids[t];
  for (int64_t i = threadIdx.x; i < dim; i += blockDim.x)
    out[t * dim + i] = bf16 ? __uint_as_float(uint32_t(static_cast<const uint16_t*>(table)[row * dim + i]) << 16)
                            : static_cast<const float*>(table)[row * dim + i];
}

__global__ void rmsnorm_kernel(const float* x, int64_t dim, const float* weight, float eps, float* out) {
  __shared__ double scratch[32];
  const float* in = x + int64_t(blockIdx.x) * dim;
  float* o = out + int64_t(blockIdx.x) * dim;
  double sum = 0.0;
  for (int64_t i = threadIdx.x; i < dim; i += blockDim.x) sum += double(in[i]) * double(in[i]);
  sum = block_reduce(sum, SumOp(), 0.0, scratch);
  const float inv = 1.0f / sqrtf(float(sum / double(dim)) + eps);
  for (int64_t i = threadIdx.x; i < dim; i += blockDim.x) o[i] = weight[i] * (in[i] * inv);
}

__global__ void silu_mul_kernel(const float* gate_up, int64_t rows, int64_t inner, float* out) {
  const int64_t n = rows * inner;
  for (int64_t idx = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; idx < n; idx += int64_t(gridDim.x) * blockDim.x) {
    const int64_t t = idx / inner, i = idx % inner;
    const float g = gate_up[t * 2 * inner + i];
    out[idx] = g / (1.0f + expf(-g)) * gate_up[t * 2 * inner + inner + i];
  }
}

__global__ void add_kernel(float* y, const float* x, int64_t n) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) y[i] += x[i];
}

// One block per (row, head), one thread per rotated pair; all reads happen before any write,
// which the interleaved layout (outputs land on other threads' inputs) needs.
__global__ void rope_kernel(RopeArgs table, float* x, int64_t heads, int64_t row_stride, int64_t head_stride,
                            int64_t offset, const int32_t* positions) {
  const int64_t t = blockIdx.x / heads, h = blockIdx.x % heads;
  const int i = threadIdx.x, pairs = table.pairs;
  float* v = x + t * row_stride + h * head_stride + offset;
  const float angle = float(positions[t]) * table.inv_freq[i];
  const float c = cosf(angle) * table.scale, s = sinf(angle) * table.scale;
  const float a = table.interleaved ? v[2 * i] : v[i];
  const float b = table.interleaved ? v[2 * i + 1] : v[i + pairs];
  __syncthreads();
  v[i] = a * c - b * s;
  v[i + pairs] = b * c + a * s;
}

unsigned grid_for(int64_t n, int threads) {
  const int64_t blocks = (n + threads - 1) / threads;
  return unsigned(blocks < 65536 ? (blocks > 0 ? blocks : 1) : 65536);
}

}  // namespace

void embedding_launch(const int32_t* ids, int64_t rows, const void* table, bool table_bf16, int64_t dim,
                      float* out, cudaStream_t stream) {
  embedding_kernel<<<unsigned(rows), 256, 0, stream>>>(ids, table, table_bf16, dim, out);
}

void rmsnorm_launch(const float* x, int64_t groups, int64_t dim, const float* weight, float eps, float* out,
                    cudaStream_t stream) {
  const int threads = dim >= 1024 ? 256 : dim >= 256 ? 128 : 32;
  rmsnorm_kernel<<<unsigned(groups), threads, 0, stream>>>(x, dim, weight, eps, out);
}

void silu_mul_launch(const float* gate_up, int64_t rows, int64_t inner, float* out, cudaStream_t stream) {
  silu_mul_kernel<<<grid_for(rows * inner, 256), 256, 0, stream>>>(gate_up, rows, inner, out);
}

void add_launch(float* y, const float* x, int64_t n, cudaStream_t stream) {
  add_kernel<<<grid_for(n, 256), 256, 0, stream>>>(y, x, n);
}

void rope_launch(const RopeArgs& table, float* x, int64_t rows, int64_t heads, int64_t row_stride,
                 int64_t head_stride, int64_t offset, const int32_t* positions, cudaStream_t stream) {
  rope_kernel<<<unsigned(rows * heads), unsigned(table.pairs), 0, stream>>>(table, x, heads, row_stride, head_stride,
                                                                           offset, positions);
}

}  // namespace moet::cuda
