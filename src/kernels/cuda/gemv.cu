// Dense and per-head products (see gemv.h): a block of 8 warps; each group of S warps computes two
// output columns, warp s of the group over the s-th of S equal slices of k (split K), the S
// partial sums added in slice order through shared memory. S depends only on the problem shape
// (n, k, batch), never on the rows, so results stay batch-invariant and bit-identical run to run;
// small matrices (K/V projections, routers) get S up to 8, so enough warps stream them at once,
// and large ones (an LM head) keep S = 1. The rows per pass (R) and the loads in flight per lane
// (F) are pure speed choices: each row's sums, and a lane's chunk order, are the same whatever
// they are, so every R and F give the same bits. Launched as a programmatic dependent launch
// (launch.cuh): until the previous kernel has finished, a warp only asks L2 for the first
// weights of its rows.
#include "kernels/cuda/gemv.h"

#include "kernels/cuda/gemv_core.cuh"
#include "kernels/cuda/launch.cuh"

#include <type_traits>

namespace moet::cuda {
namespace {

constexpr int kWarps = 8;
constexpr int kCols = 2;  // output columns per warp group
constexpr int64_t kSliceAlign = 256;  // k per slice: a multiple of one warp-wide vector load
// One-row launches of at most this many warps (about one wave on an H200: 132 SMs x 64) keep 2
// loads in flight per lane, larger ones 4: fewer bytes requested at once made one-wave products
// 5-7% faster, the LM head 6% slower (cuda_ops_bench, docs/gpu.md Run 10).
constexpr int64_t kOneWaveWarps = 8192;

// L2 prefetches of what warp_dot's vector path loads first from each of the warp's rows w[j] (its
// slices of k weights): the first F * 32 * kChunk weights (every lane's first F loads; at most
// k), one prefetch per 16 bytes, lanes interleaved.
template <typename W, int F>
__device__ __forceinline__ void prefetch_first_weights(const W* const (&w)[kCols], int64_t k, int lane) {
  constexpr int kBytes = F * 32 * kChunk * int(sizeof(W));
  const int bytes = int(min(int64_t(F) * 32 * kChunk, k)) * int(sizeof(W));
#pragma unroll
  for (int j = 0; j < kCols; ++j)
#pragma unroll
    for (int offset = 16 * lane; offset < kBytes; offset += 16 * 32)
      if (offset < bytes) asm volatile("prefetch.global.L2 [%0];" ::"l"(reinterpret_cast<const char*>(w[j]) + offset));
}

// R activation rows per pass over the weights (R * kCols <= 32: one lane writes each sum), F loads
// in flight per lane.
template <typename W, int S, int R, int F>
__global__ void __launch_bounds__(kWarps * 32) gemv_kernel(GemvArgs a, bool vec) {
  static_assert(R * kCols <= 32 && R <= kMaxRows, "one lane per output");
  __shared__ float partial[kWarps][R][kCols];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, slice = warp % S;
  const int64_t n0 = (int64_t(blockIdx.x) * (kWarps / S) + warp / S) * kCols;
  const bool active = n0 < a.n;  // inactive warps still reach the block barriers
  const int64_t k0 = a.k * slice / S, k1 = a.k * (slice + 1) / S;
  const int64_t b = blockIdx.y;
  const bool second = b == 1 && a.w_second != nullptr;
  const W* wb = second ? static_cast<const W*>(a.w_second) : static_cast<const W*>(a.w) + b * a.w_batch_stride;
  const float* bias = second ? a.bias_second : a.bias;
  float* y = second ? a.y_second : a.y + b * a.y_batch_stride;
  const W* w[kCols];
#pragma unroll
  for (int j = 0; j < kCols; ++j) w[j] = wb + min(min(n0, a.n - 1) + j, a.n - 1) * a.k + k0;
  if (active && vec) prefetch_first_weights<W, F>(w, k1 - k0, lane);  // constant weights: legal before the wait
  pdl_wait();  // x comes from the previous kernels
  for (int64_t r0 = 0; r0 < a.rows; r0 += R) {
    const int rows = int(a.rows - r0 < R ? a.rows - r0 : R);
    const float* x[R];
#pragma unroll
    for (int r = 0; r < R; ++r)
      x[r] = a.x + b * a.x_batch_stride + (r0 + min(r, rows - 1)) * a.x_row_stride + k0;
    float acc[R][kCols];
    warp_dot<W, kCols, F, R>(x, rows, w, int(k1 - k0), vec, acc);
    if (S > 1) {
      if (lane == 0)
#pragma unroll
        for (int r = 0; r < R; ++r)
#pragma unroll
          for (int j = 0; j < kCols; ++j) partial[warp][r][j] = acc[r][j];
      __syncthreads();
      if (slice == 0)
#pragma unroll
        for (int r = 0; r < R; ++r)
#pragma unroll
          for (int j = 0; j < kCols; ++j)
#pragma unroll
            for (int s = 1; s < S; ++s) acc[r][j] += partial[warp + s][r][j];
      __syncthreads();  // partials read before the next pass overwrites them
    }
    if (!active || slice != 0) continue;
#pragma unroll
    for (int r = 0; r < R; ++r)
#pragma unroll
      for (int j = 0; j < kCols; ++j)
        if (lane == r * kCols + j && r < rows && n0 + j < a.n)
          y[(r0 + r) * a.y_row_stride + n0 + j] = acc[r][j] + (bias ? bias[n0 + j] : 0.0f);
  }
  // The next kernel is let in only as blocks finish: triggered at the start, its waiting blocks
  // made matrices of several waves 7-15% slower at batch 4 and 8 (cuda_ops_bench, H200).
  pdl_trigger();
}

bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15) == 0; }

// The largest S in {1, 2, 4, 8}, at most the block's warps, that keeps at most ~4096 warps in the
// launch (in each product of a pair) and slices of at least 512 weights, each a multiple of
// kSliceAlign (so every slice keeps the vector path).
int split_for(const GemvArgs& a) {
  const int64_t groups = (a.n + kCols - 1) / kCols * (a.w_second ? 1 : a.batch);  // a pair: as each alone
  int s = 1;
  while (s < 8 && s < kWarps && groups * s * 2 <= 4096 && a.k % (kSliceAlign * s * 2) == 0 && a.k / (s * 2) >= 512)
    s *= 2;
  return s;
}

template <typename W, int S, int R, int F>
void launch(const GemvArgs& a, bool vec, cudaStream_t stream) {
  const int64_t cols_per_block = kCols * (kWarps / S);
  const dim3 grid(unsigned((a.n + cols_per_block - 1) / cols_per_block), unsigned(a.batch));
  launch_dependent_kernel<gemv_kernel<W, S, R, F>>(grid, dim3(kWarps * 32), 0, 1, stream, a, vec);
}

// One row (decode at batch 1) gets a kernel of one row per pass (R = 1): the 8-row kernel's
// registers (accumulators and row pointers for 8 rows; 104-128 when measured) left room for 2
// blocks per SM, so the q and o products of the model shapes (512 blocks) ran in two waves. One row keeps 2 loads in
// flight in launches of about one wave and 4 in larger ones (the LM head); more rows keep 2 at
// every size (with 8 rows, 4 in flight was no faster on the LM head and spills on sm_90). F32
// weights (small test models) keep one shape.
template <typename W, int S>
void launch_shape(const GemvArgs& a, bool vec, cudaStream_t stream) {
  if constexpr (std::is_same_v<W, float>) {
    launch<W, S, kMaxRows, 4>(a, vec, stream);
  } else if (a.rows == 1) {
    const bool one_wave = (a.n + kCols - 1) / kCols * a.batch * S <= kOneWaveWarps;
    one_wave ? launch<W, S, 1, 2>(a, vec, stream) : launch<W, S, 1, 4>(a, vec, stream);
  } else {
    launch<W, S, kMaxRows, 2>(a, vec, stream);
  }
}

template <typename W>
void launch_split(const GemvArgs& a, bool vec, cudaStream_t stream) {
  switch (split_for(a)) {
    case 8: launch_shape<W, 8>(a, vec, stream); break;
    case 4: launch_shape<W, 4>(a, vec, stream); break;
    case 2: launch_shape<W, 2>(a, vec, stream); break;
    default: launch_shape<W, 1>(a, vec, stream); break;
  }
}

}  // namespace

bool gemv_vector_ok(const GemvArgs& a) {
  return a.k % kChunk == 0 && a.x_row_stride % 4 == 0 && a.x_batch_stride % 4 == 0 &&
         a.w_batch_stride % kChunk == 0 && aligned16(a.x) && aligned16(a.w) &&
         (a.w_second == nullptr || aligned16(a.w_second));
}

void gemv_launch(const GemvArgs& a, cudaStream_t stream) {
  const bool vec = gemv_vector_ok(a);
  if (a.w_bf16) {
    launch_split<uint16_t>(a, vec, stream);
  } else {
    launch_split<float>(a, vec, stream);
  }
}

void gemv_pair_launch(const GemvArgs& first, const void* w_second, const float* bias_second, float* y_second,
                      cudaStream_t stream) {
  GemvArgs a = first;
  a.batch = 2;
  a.x_batch_stride = 0;
  a.w_second = w_second;
  a.bias_second = bias_second;
  a.y_second = y_second;
  gemv_launch(a, stream);
}

}  // namespace moet::cuda
