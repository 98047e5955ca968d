// Dense and per-head products (see gemv.h; the inner loop and the FP8-block decode are
// gemv_core.cuh's): a block of 8 warps; each group of S warps computes two
// output columns, warp s of the group over the s-th of S equal slices of k (split K), the S
// partial sums added in slice order through shared memory. S depends only on a part's own shape
// (n, k, batch), never on the rows or the other parts of its launch, so results stay
// batch-invariant and bit-identical run to run; small matrices (K/V projections, routers) get S up
// to 8, so enough warps stream them at once, and large ones (an LM head) keep S = 1. The rows per
// pass (R) and the loads in flight per lane (F) are pure speed choices: each row's sums, and a
// lane's chunk order, are the same whatever they are, so every R and F give the same bits. A
// launch of several parts gives each part a contiguous range of blocks, the smaller parts first
// (they finish early instead of forming the launch's tail). Launched as a programmatic dependent
// launch (launch.cuh): until the previous kernel has finished, a warp only asks L2 for the first
// weights of its rows.
#include "kernels/cuda/gemv.h"

#include "kernels/cuda/gemv_core.cuh"
#include "kernels/cuda/gemv_mma.h"
#include "kernels/cuda/gemv_plan.h"
#include "kernels/cuda/launch.cuh"

#include <type_traits>

namespace moet::cuda {
namespace {

constexpr int kWarps = 8;
constexpr int kCols = 2;  // output columns per warp group
constexpr int64_t kSliceAlign = 256;  // k per slice: a multiple of one warp-wide vector load
// One-row launches of at most this many warps (about one wave on an H200: 132 SMs x 64) keep 2
// loads in flight per lane, larger ones 4: fewer bytes requested at once made one-wave products
// 5-7% faster, the LM head 6% slower (cuda_ops_bench, docs/gpu-history.md Run 10).
constexpr int64_t kOneWaveWarps = 8192;
// Blocks per SM the one-row kernels are compiled for on sm_90 (64 registers a thread, no spills):
// FP8-block codes took 80-96 registers, 3 blocks per SM, so DeepSeek-V3's o_proj (448 blocks)
// ran 396 blocks and then a second wave of 52; at 4 it is one wave and 65.8 -> 43.6 us, the other
// FP8 products 13-31% faster, BF16 unchanged (cuda_ops_bench, docs/gpu-history.md Run 18). Other
// architectures keep the compiler's choice: at 64 registers sm_80's FP8 decode (no e4m3x2
// conversion instruction) spills up to 1.4 KB, and sm_120 is not measured.
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ == 900
constexpr int kOneRowBlocksPerSm = 4;
#else
constexpr int kOneRowBlocksPerSm = 1;
#endif

// L2 prefetches of what warp_dot's vector path loads first from each of the warp's rows w[j] (its
// slices of k weights): the first F * 32 * kSize weights (every lane's first F loads; at most
// k), one prefetch per 16 bytes, lanes interleaved. (FP8 block scales are not prefetched: 1/512
// of the codes' bytes.)
template <typename W, int F>
__device__ __forceinline__ void prefetch_first_weights(const typename WeightChunk<W>::Row (&w)[kCols], int64_t k,
                                                       int lane) {
  using Chunk = WeightChunk<W>;
  constexpr int kBytes = F * 32 * Chunk::kSize * Chunk::kElementBytes;
  const int bytes = int(min(int64_t(F) * 32 * Chunk::kSize, k)) * Chunk::kElementBytes;
#pragma unroll
  for (int j = 0; j < kCols; ++j)
#pragma unroll
    for (int offset = 16 * lane; offset < kBytes; offset += 16 * 32)
      if (offset < bytes)
        asm volatile("prefetch.global.L2 [%0];" ::"l"(static_cast<const char*>(Chunk::address(w[j])) + offset));
}

// Row n of problem b of a part, from column k0 on (for FP8 a multiple of kFp8Block; FP8 parts
// have one problem).
template <typename W>
__device__ __forceinline__ typename WeightChunk<W>::Row weight_row(const GemvPart& part, int64_t b, int64_t n,
                                                                   int64_t k, int64_t k0) {
  if constexpr (std::is_same_v<W, Fp8Block>) {
    const int64_t blocks_per_row = (k + kFp8Block - 1) / kFp8Block;
    return {static_cast<const uint8_t*>(part.w) + n * k + k0, part.w_scales + n / kFp8Block * blocks_per_row + k0 / kFp8Block};
  } else {
    return static_cast<const W*>(part.w) + b * part.w_batch_stride + n * k + k0;
  }
}

// Block `block` of problem b of one part: S warps per column group (split K), R activation rows
// per pass over the weights (R * kCols <= 32: one lane writes each sum), F loads in flight per lane.
template <typename W, int S, int R, int F>
__device__ __forceinline__ void gemv_block(const GemvArgs& a, const GemvPart& part, int64_t b, int64_t block,
                                           bool vec, float (&partial)[kWarps][R][kCols]) {
  static_assert(R * kCols <= 32 && R <= kMaxRows, "one lane per output");
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, slice = warp % S;
  const int64_t n0 = (block * (kWarps / S) + warp / S) * kCols;
  const bool active = n0 < part.n;  // inactive warps still reach the block barriers
  const int64_t k0 = a.k * slice / S, k1 = a.k * (slice + 1) / S;
  float* y = part.y + b * part.y_batch_stride;
  typename WeightChunk<W>::Row w[kCols];
#pragma unroll
  for (int j = 0; j < kCols; ++j) w[j] = weight_row<W>(part, b, min(min(n0, part.n - 1) + j, part.n - 1), a.k, k0);
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
        if (lane == r * kCols + j && r < rows && n0 + j < part.n)
          y[(r0 + r) * part.y_row_stride + n0 + j] = acc[r][j] + (part.bias ? part.bias[n0 + j] : 0.0f);
  }
}

template <typename W, int R, int F>
__global__ void __launch_bounds__(kWarps * 32, R == 1 ? kOneRowBlocksPerSm : 1)
    gemv_kernel(GemvArgs a, GemvPlan plan, bool vec) {
  __shared__ float partial[kWarps][R][kCols];
  GemvPart part;
  int64_t b, block;
  int shift;
  gemv_block_of(a, plan, part, b, block, shift);
  switch (shift) {  // uniform in the block
    case 0: gemv_block<W, 1, R, F>(a, part, b, block, vec, partial); break;
    case 1: gemv_block<W, 2, R, F>(a, part, b, block, vec, partial); break;
    case 2: gemv_block<W, 4, R, F>(a, part, b, block, vec, partial); break;
    default: gemv_block<W, 8, R, F>(a, part, b, block, vec, partial); break;
  }
  // The next kernel is let in only as blocks finish: triggered at the start, its waiting blocks
  // made matrices of several waves 7-15% slower at batch 4 and 8 (cuda_ops_bench, H200).
  pdl_trigger();
}

bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15) == 0; }

// log2 of the largest S in {1, 2, 4, 8}, at most the block's warps, that keeps at most ~4096
// warps in the part and slices of at least 512 weights, each a multiple of kSliceAlign (so every
// slice keeps the vector path and starts at an FP8 block boundary).
int split_shift_for(const GemvPart& part, int64_t k) {
  const int64_t groups = (part.n + kCols - 1) / kCols * part.batch;
  int shift = 0;
  for (int s = 1; s < 8 && s < kWarps && groups * s * 2 <= 4096 && k % (kSliceAlign * s * 2) == 0 && k / (s * 2) >= 512;
       s *= 2)
    ++shift;
  return shift;
}

template <typename W, int R, int F>
void launch(const GemvArgs& a, const GemvPlan& plan, int64_t blocks, bool vec, cudaStream_t stream) {
  launch_dependent_kernel<gemv_kernel<W, R, F>>(dim3(unsigned(blocks)), dim3(kWarps * 32), 0, 1, stream, a, plan, vec);
}

// One row (decode at batch 1) gets a kernel of one row per pass (R = 1): the 8-row kernel's
// registers (accumulators and row pointers for 8 rows; 104-128 when measured) left room for 2
// blocks per SM, so the q and o products of the model shapes (512 blocks) ran in two waves. One
// row keeps 2 loads in flight in launches of about one wave and 4 in larger ones (the LM head);
// more rows keep 2 at every size (with 8 rows, 4 in flight was no faster on the LM head and
// spills on sm_90). F32 weights (small test models) keep one shape; FP8 codes (16 a load, as many
// bytes as BF16's 8) take BF16's.
template <typename W>
void launch_shape(const GemvArgs& a, const GemvPlan& plan, int64_t blocks, int64_t warps, bool vec,
                  cudaStream_t stream) {
  if constexpr (std::is_same_v<W, float>) {
    launch<W, kMaxRows, 4>(a, plan, blocks, vec, stream);
  } else if (a.rows == 1) {
    warps <= kOneWaveWarps ? launch<W, 1, 2>(a, plan, blocks, vec, stream) : launch<W, 1, 4>(a, plan, blocks, vec, stream);
  } else {
    launch<W, kMaxRows, 2>(a, plan, blocks, vec, stream);
  }
}

}  // namespace

bool gemv_vector_ok(const GemvArgs& a) {
  const int chunk = a.weights == GemvWeights::fp8_block ? WeightChunk<Fp8Block>::kSize : kChunk;
  bool ok = a.k % chunk == 0 && a.x_row_stride % 4 == 0 && a.x_batch_stride % 4 == 0 && aligned16(a.x);
  for (int p = 0; p < a.part_count; ++p) ok = ok && a.parts[p].w_batch_stride % chunk == 0 && aligned16(a.parts[p].w);
  return ok;
}

// The parts the tensor cores take (gemv_mma.h) run in one launch, the others in a second: a
// part's bits depend only on its own shape and the row count either way.
void gemv_launch(const GemvArgs& args, cudaStream_t stream) {
  const bool vec = gemv_vector_ok(args);
  GemvArgs mma = args, core = args;
  mma.part_count = core.part_count = 0;
  for (int p = 0; p < args.part_count; ++p) {
    GemvArgs& into = vec && gemv_mma_takes(args, args.parts[p]) ? mma : core;
    into.parts[into.part_count++] = args.parts[p];
  }
  if (mma.part_count > 0) gemv_mma_launch(mma, stream);
  if (core.part_count == 0) return;
  GemvArgs& a = core;
  const GemvLayout layout =
      plan_gemv(a, kWarps, kCols, [&](const GemvPart& part) { return split_shift_for(part, a.k); });
  const GemvPlan& plan = layout.plan;
  const int64_t blocks = layout.blocks, warps = layout.warps;
  switch (a.weights) {
    case GemvWeights::bf16: launch_shape<uint16_t>(a, plan, blocks, warps, vec, stream); break;
    case GemvWeights::f32: launch_shape<float>(a, plan, blocks, warps, vec, stream); break;
    case GemvWeights::fp8_block: launch_shape<Fp8Block>(a, plan, blocks, warps, vec, stream); break;
  }
}

}  // namespace moet::cuda
