// Embedding, SiLU-and-mul, add and the BF16 split (see elementwise.h), each launched as a programmatic dependent
// launch (launch.cuh) that waits for the previous kernel before touching any memory.
#include "kernels/cuda/elementwise.h"

#include "kernels/cuda/bf16_split.cuh"
#include "kernels/cuda/launch.cuh"

namespace moet::cuda {
namespace {

__global__ void embedding_kernel(const int32_t* ids, const void* table, bool bf16, int64_t first_row,
                                 int64_t table_rows, int64_t dim, float* out) {
  pdl_trigger();
  pdl_wait();
  const int64_t t = blockIdx.x, row = ids[t] - first_row;
  const bool inside = row >= 0 && row < table_rows;
  for (int64_t i = threadIdx.x; i < dim; i += blockDim.x)
    out[t * dim + i] = !inside ? 0.0f
                       : bf16  ? __uint_as_float(uint32_t(static_cast<const uint16_t*>(table)[row * dim + i]) << 16)
                               : static_cast<const float*>(table)[row * dim + i];
}

__global__ void silu_mul_kernel(const float* gate_up, int64_t rows, int64_t inner, float* out) {
  pdl_trigger();
  pdl_wait();
  const int64_t n = rows * inner;
  for (int64_t idx = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; idx < n; idx += int64_t(gridDim.x) * blockDim.x) {
    const int64_t t = idx / inner, i = idx % inner;
    const float g = gate_up[t * 2 * inner + i];
    out[idx] = g / (1.0f + expf(-g)) * gate_up[t * 2 * inner + inner + i];
  }
}

__global__ void add_kernel(float* y, const float* x, int64_t n) {
  pdl_trigger();
  pdl_wait();
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) y[i] += x[i];
}

__global__ void split_bf16_kernel(const float* x, int64_t n, uint16_t* hi, uint16_t* lo) {
  pdl_trigger();
  pdl_wait();
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    uint16_t h, l;
    split_bf16_value(x[i], h, l);
    hi[i] = h;
    lo[i] = l;
  }
}

}  // namespace

void embedding_launch(const int32_t* ids, int64_t rows, const void* table, bool table_bf16, int64_t first_row,
                      int64_t table_rows, int64_t dim, float* out, cudaStream_t stream) {
  launch_dependent_kernel<embedding_kernel>(dim3(unsigned(rows)), dim3(256), 0, 1, stream, ids, table, table_bf16,
                                            first_row, table_rows, dim, out);
}

void silu_mul_launch(const float* gate_up, int64_t rows, int64_t inner, float* out, cudaStream_t stream) {
  launch_dependent_kernel<silu_mul_kernel>(dim3(grid_for(rows * inner, 256)), dim3(256), 0, 1, stream, gate_up, rows,
                                           inner, out);
}

void add_launch(float* y, const float* x, int64_t n, cudaStream_t stream) {
  launch_dependent_kernel<add_kernel>(dim3(grid_for(n, 256)), dim3(256), 0, 1, stream, y, x, n);
}

void split_bf16_launch(const float* x, int64_t n, uint16_t* hi, uint16_t* lo, cudaStream_t stream) {
  launch_dependent_kernel<split_bf16_kernel>(dim3(grid_for(n, 256)), dim3(256), 0, 1, stream, x, n, hi, lo);
}

}  // namespace moet::cuda
