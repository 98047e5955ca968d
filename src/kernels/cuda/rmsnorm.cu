// RMSNorm and residual add + RMSNorm (see rmsnorm.h): one kernel, one group per team of threads,
// launched as a programmatic dependent launch (launch.cuh) that waits for the previous kernel first.
#include "kernels/cuda/rmsnorm.h"

#include "kernels/cuda/launch.cuh"
#include "kernels/cuda/rms_span.cuh"

#include <cstdint>

namespace moet::cuda {
namespace {

constexpr int64_t kWarpGroupMaxDim = 256;  // groups up to this wide get one warp each
constexpr int64_t kGroupsPerBlock = 8;     // warps (groups) per block in that form

struct RmsNormArgs {
  const float* x;
  const float* delta;  // null: plain RMSNorm; else x + delta is normalised and written to `sum`
  float* sum;
  const float* weight;
  float eps;
  float* out;
  int64_t groups, dim;
};

// One group per team: a warp (kWarpTeam; the block holds several groups) or the whole block.
template <int W, int kChunks, bool kWarpTeam>
__global__ void __launch_bounds__(kWarpTeam ? 32 * kGroupsPerBlock : 1024) rmsnorm_kernel(RmsNormArgs a) {
  pdl_trigger();
  pdl_wait();  // x and delta come from the previous kernels
  const int team = kWarpTeam ? 32 : int(blockDim.x);
  const int rank = kWarpTeam ? int(threadIdx.x & 31) : int(threadIdx.x);
  const int64_t group = kWarpTeam ? int64_t(blockIdx.x) * (blockDim.x >> 5) + (threadIdx.x >> 5) : int64_t(blockIdx.x);
  if (kWarpTeam && group >= a.groups) return;  // whole warps leave; the warp form has no block barrier
  const int len = int(a.dim);
  const int64_t base = group * a.dim;
  RmsSpan<W, kChunks> x, weight;
  x.load(a.x + base, len, rank, team);
  weight.load(a.weight, len, rank, team);
  if (a.delta) {
    RmsSpan<W, kChunks> delta;
    delta.load(a.delta + base, len, rank, team);
    x.add(delta);
    x.store(a.sum + base, len, rank, team);
  }
  double sum = x.sum_squares();
  if constexpr (kWarpTeam) {
    sum = warp_reduce(sum, SumOp());
  } else {
    __shared__ double scratch[32];
    sum = block_reduce(sum, SumOp(), 0.0, scratch);
  }
  x.normalise(weight, rms_inverse(sum, len, a.eps));
  x.store(a.out + base, len, rank, team);
}

// The team layout depends on dim (and W) only, so a group's bits never depend on `groups`.
template <int W, int kChunks>
void launch(const RmsNormArgs& a, cudaStream_t stream) {
  static_assert(32 * W * kChunks == kWarpGroupMaxDim && 1024 * W * kChunks == kRmsNormMaxDim);
  if (a.dim <= kWarpGroupMaxDim) {
    const int64_t warps = a.groups < kGroupsPerBlock ? a.groups : kGroupsPerBlock;
    launch_dependent_kernel<rmsnorm_kernel<W, kChunks, true>>(unsigned((a.groups + warps - 1) / warps),
                                                              unsigned(32 * warps), 0, 1, stream, a);
  } else {
    const int64_t members = ((a.dim + W - 1) / W + kChunks - 1) / kChunks;
    launch_dependent_kernel<rmsnorm_kernel<W, kChunks, false>>(unsigned(a.groups), unsigned((members + 31) / 32 * 32),
                                                               0, 1, stream, a);
  }
}

bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

void dispatch(const RmsNormArgs& a, cudaStream_t stream) {
  if (a.groups == 0) return;
  const bool vector = a.dim % 4 == 0 && aligned16(a.x) && aligned16(a.delta) && aligned16(a.sum) &&
                      aligned16(a.weight) && aligned16(a.out);
  if (vector) {
    launch<4, 2>(a, stream);
  } else {
    launch<1, 8>(a, stream);
  }
}

}  // namespace

void rmsnorm_launch(const float* x, int64_t groups, int64_t dim, const float* weight, float eps, float* out,
                    cudaStream_t stream) {
  dispatch({x, nullptr, nullptr, weight, eps, out, groups, dim}, stream);
}

void add_rmsnorm_launch(float* residual, const float* delta, int64_t groups, int64_t dim, const float* weight,
                        float eps, float* out, cudaStream_t stream) {
  dispatch({residual, delta, residual, weight, eps, out, groups, dim}, stream);
}

}  // namespace moet::cuda
