// Dense and per-head products (see gemv.h): a block of 8 warps, each warp two output columns.
#include "kernels/cuda/gemv.h"

#include "kernels/cuda/gemv_core.cuh"

namespace moet::cuda {
namespace {

constexpr int kWarps = 8;
constexpr int kCols = 2;  // output columns per warp

template <typename W>
__global__ void __launch_bounds__(kWarps * 32) gemv_kernel(GemvArgs a, bool vec) {
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int64_t n0 = (int64_t(blockIdx.x) * kWarps + warp) * kCols;
  if (n0 >= a.n) return;
  const int64_t b = blockIdx.y;
  const W* wb = static_cast<const W*>(a.w) + b * a.w_batch_stride;
  const W* w[kCols];
#pragma unroll
  for (int j = 0; j < kCols; ++j) w[j] = wb + min(n0 + j, a.n - 1) * a.k;
  for (int64_t r0 = 0; r0 < a.rows; r0 += kMaxRows) {
    const int rows = int(a.rows - r0 < kMaxRows ? a.rows - r0 : kMaxRows);
    const float* x[kMaxRows];
#pragma unroll
    for (int r = 0; r < kMaxRows; ++r) x[r] = a.x + b * a.x_batch_stride + (r0 + min(r, rows - 1)) * a.x_row_stride;
    float acc[kMaxRows][kCols];
    warp_dot<W, kCols>(x, rows, w, int(a.k), vec, acc);
#pragma unroll
    for (int r = 0; r < kMaxRows; ++r)
#pragma unroll
      for (int j = 0; j < kCols; ++j)
        if (lane == r * kCols + j && r < rows && n0 + j < a.n)
          a.y[b * a.y_batch_stride + (r0 + r) * a.y_row_stride + n0 + j] = acc[r][j] + (a.bias ? a.bias[n0 + j] : 0.0f);
  }
}

bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15) == 0; }

}  // namespace

bool gemv_vector_ok(const GemvArgs& a) {
  return a.k % kChunk == 0 && a.x_row_stride % 4 == 0 && a.x_batch_stride % 4 == 0 &&
         a.w_batch_stride % kChunk == 0 && aligned16(a.x) && aligned16(a.w);
}

void gemv_launch(const GemvArgs& a, cudaStream_t stream) {
  const dim3 grid(unsigned((a.n + kWarps * kCols - 1) / (kWarps * kCols)), unsigned(a.batch));
  const bool vec = gemv_vector_ok(a);
  if (a.w_bf16) {
    gemv_kernel<uint16_t><<<grid, kWarps * 32, 0, stream>>>(a, vec);
  } else {
    gemv_kernel<float><<<grid, kWarps * 32, 0, stream>>>(a, vec);
  }
}

}  // namespace moet::cuda
