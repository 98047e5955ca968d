// Tensor-core GEMV (gemv_mma.h). A block holds 8 warps: 8 / S output tiles of 16 columns, each
// computed by S warps over S slices of k (split K; S from the part's shape only, gemv_plan.h).
// The weights are the MMAs' B operand (two column tiles of 8) and the activations their A operand:
// activation row r becomes A rows 3r, 3r + 1, 3r + 2, the terms hi, mid and lo of x = hi + mid +
// lo (each the top 16 bits of what is left: exact), up to 16 rows (three A tiles of 16) a pass.
// A warp walks its slice in steps: lane (g, c) loads 16 bytes of weight rows g and g + 8 of its
// tile (BF16: k 8c..8c+7 of a 32-k step; FP8: codes k 16c..16c+15 of a 64-k step, converted
// exactly to BF16 pairs), which are the B fragments of the step's m16n8k16 MMAs (2 or 4) once k is
// renumbered: MMA q's k slots 2c, 2c + 1, 2c + 8, 2c + 9 hold the lane's pairs 2q and 2q + 1; the
// A fragments use the same renumbering. kSteps steps of weights are in flight per lane (the first
// issued before the wait for the previous kernel: weights are constant); the activations of
// kStages steps are copied ahead into a shared-memory ring (cp.async) and split in registers.
// Products of BF16 by BF16 are exact and the MMAs accumulate in FP32; FP8-block weights sum each
// 128-k block apart and add it times the block's scale (every row of a 16-row tile shares it).
// The S slices' sums are added in slice order through shared memory, then each output is
// (hi + mid) + lo + bias.
// Bits: an MMA's output row depends only on its own A row, and a row's A rows, slices and order of
// additions depend only on (n, k, batch), never on the rows present or their order: the results
// are batch-invariant and bit-identical run to run.
#include "kernels/cuda/gemv_mma.h"

#include "kernels/cuda/cp_async.cuh"
#include "kernels/cuda/gemv_plan.h"
#include "kernels/cuda/launch.cuh"
#include "kernels/cuda/streaming_load.cuh"
#include "kernels/cuda/w2_mma.cuh"

#include <cuda_fp8.h>

#include <algorithm>
#include <climits>

namespace moet::cuda {
namespace {

// Tuning (variants built with -D for measurement, docs/gpu.md "Variants").
#ifndef MOET_GEMV_MMA_STEPS
#define MOET_GEMV_MMA_STEPS 4
#endif
#ifndef MOET_GEMV_MMA_TARGET_WARPS
#define MOET_GEMV_MMA_TARGET_WARPS 4096
#endif
// Launches of more rows than this take the CUDA-core GEMV (-D...=0: every launch does).
#ifndef MOET_GEMV_MMA_MAX_ROWS
#define MOET_GEMV_MMA_MAX_ROWS INT_MAX
#endif

constexpr int kWarps = 8;
constexpr int kTile = 16;          // output columns per warp: two MMA column tiles
constexpr int kPassRows = 16;      // activation rows per pass: 48 A rows, three MMA row tiles
constexpr int kMinSliceK = 256;    // a split never cuts slices below 256 k
constexpr int kScaleBlock = 128;   // FP8-block weights: k (and rows) per scale

// What a lane's 16-byte weight load holds: BF16 (8 weights, 32 k a step) or FP8-block codes (16,
// 64 k a step), and their conversion into B-fragment pairs (BF16 as loaded; e4m3 through f16 and
// f32, exact: every e4m3 value is a BF16 value).
struct Bf16Weights {
  using Element = uint16_t;
  static constexpr int kStepK = 32, kPairs = 4;
  static constexpr bool kScaled = false;
  static __device__ __forceinline__ void pairs(const uint4& v, uint32_t (&out)[kPairs]) {
    out[0] = v.x, out[1] = v.y, out[2] = v.z, out[3] = v.w;
  }
};
struct Fp8Weights {
  using Element = uint8_t;
  static constexpr int kStepK = 64, kPairs = 8;
  static constexpr bool kScaled = true;
  static __device__ __forceinline__ void pairs(const uint4& v, uint32_t (&out)[kPairs]) {
    const uint32_t words[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
    for (int i = 0; i < kPairs; ++i) {
      const __half2_raw raw =
          __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(words[i / 2] >> (16 * (i % 2))), __NV_E4M3);
      const float2 f = __half22float2(__half2(raw));
      const __nv_bfloat162 pair = __floats2bfloat162_rn(f.x, f.y);
      out[i] = *reinterpret_cast<const uint32_t*>(&pair);
    }
  }
};

// One shape of the kernel: MT A tiles of 16 rows (3 per activation row), weights W. More A tiles
// and FP8's conversion hold more registers, so fewer steps of weights stay in flight (BF16 with
// one A tile spilled nothing at 4, with two spilled in the loop at 4).
template <int MT, typename W>
struct Shape {
  static constexpr int kRows = 16 * MT / 3;  // activation rows a pass: 5, 10 or 16
  static constexpr int kSteps = MT == 1 && !W::kScaled ? MOET_GEMV_MMA_STEPS : 2;  // weight steps in flight
  static constexpr int kRowFloats = W::kStepK + 4;  // a ring row, padded
  static constexpr int kStageFloats = kRows * kRowFloats;
  // Activation steps in flight: as many as weight steps with one BF16 A tile, else two, or one
  // where two would pass the 48 KB of static shared memory (16 rows of FP8 steps).
  static constexpr int kStages = MT == 1 && !W::kScaled ? kSteps : kWarps * 2 * kStageFloats * 4 <= 48 * 1024 ? 2 : 1;
  static constexpr int kRingFloats = kStages * kStageFloats;
  static constexpr int kAcc = MT * 2 * 4;             // a lane's accumulators
  static constexpr int kSumFloats = 16 * MT * kTile;  // a tile's sums, [A row][output column]
  static constexpr int kRegion = std::max({kRingFloats, kAcc * 32, kSumFloats});  // a warp's shared memory
  static_assert(kSteps % kStages == 0 && kSteps % 2 == 0, "a weight slot's stage and scale parity are fixed");
};

// The term of eight activations that `drop` selects (split_term), packed as BF16 pairs (low half
// first): drop0 and drop1 are the masks (0 or 0xffff0000) of what each stage removes (hi for
// term >= 1, mid for term 2); what is left's top 16 bits are the term.
__device__ __forceinline__ uint4 split_term(const float4& a, const float4& b, uint32_t drop0, uint32_t drop1) {
  float v[8] = {a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w};
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    v[i] -= __uint_as_float(__float_as_uint(v[i]) & drop0);
    v[i] -= __uint_as_float(__float_as_uint(v[i]) & drop1);
  }
  uint32_t words[4];
#pragma unroll
  for (int j = 0; j < 4; ++j) words[j] = __byte_perm(__float_as_uint(v[2 * j]), __float_as_uint(v[2 * j + 1]), 0x7632);
  return {words[0], words[1], words[2], words[3]};
}

// Where one of a lane's A rows takes its activations (`offset`: its ring row's floats in a stage,
// plus the lane's k) and the term masks.
struct ARow {
  int offset;
  uint32_t drop0, drop1;
};

// The lane's activation pairs of one A row for one step (words 2q, 2q + 1 feed MMA q).
template <typename W>
__device__ __forceinline__ void a_pairs(const float4 (&v)[W::kStepK / 16], const ARow& a, uint32_t (&out)[W::kPairs]) {
#pragma unroll
  for (int h = 0; h < W::kPairs / 4; ++h) {
    const uint4 words = split_term(v[2 * h], v[2 * h + 1], a.drop0, a.drop1);
    out[4 * h] = words.x, out[4 * h + 1] = words.y, out[4 * h + 2] = words.z, out[4 * h + 3] = words.w;
  }
}

// One warp's tile over its slice for one pass of rows. Steps count from the slice's first; the
// addresses are per-pass bases plus constant offsets.
template <int MT, typename W>
struct TileDot {
  using S = Shape<MT, W>;
  static constexpr int kStepK = W::kStepK, kChunks = kStepK / 4;  // 16-byte activation chunks per row and step
  static constexpr int kCopies = (S::kRows * kChunks + 31) / 32;  // activation copies per lane per step
  static constexpr int kSteps = S::kSteps;
  const typename W::Element *w_lo, *w_hi;  // the lane's weight rows g and g + 8 at the slice's first k, plus its k
  const float* scales;                    // FP8: the tile's scale of the slice's first block
  int steps;                              // in the slice
  uint4 lo[kSteps], hi[kSteps];

  __device__ __forceinline__ void load(int u, int i) {
    lo[u] = load_streaming(reinterpret_cast<const uint4*>(w_lo + i * kStepK));
    hi[u] = load_streaming(reinterpret_cast<const uint4*>(w_hi + i * kStepK));
  }
  __device__ __forceinline__ void start() {
#pragma unroll
    for (int u = 0; u < kSteps; ++u)
      if (u < steps) load(u, u);
  }
  // acc = this slice's sums: acc[m][j] is A tile m times column tile j (j = 0: weight rows g, 1:
  // rows g + 8). x, x_row_stride, rows: the pass's activations (row 0 at the slice's first k);
  // a[m][h]: this lane's A rows g (h = 0) and g + 8 (h = 1) of tile m.
  __device__ __forceinline__ void run(float* ring, const float* x, int64_t x_row_stride, int rows,
                                      const ARow (&a)[MT][2], int lane, float (&acc)[MT][2][4]) {
    // This lane's copies: 16-byte chunk j = lane + 32i of a step, ring row j / kChunks.
    const float* src[kCopies];
    uint32_t dst[kCopies];
    bool copies[kCopies];
#pragma unroll
    for (int i = 0; i < kCopies; ++i) {
      const int j = lane + 32 * i, r = min(j / kChunks, rows - 1), q = j % kChunks;
      copies[i] = j < rows * kChunks;
      src[i] = x + r * x_row_stride + 4 * q;
      dst[i] = shared_address(ring + r * S::kRowFloats + 4 * q);
    }
    const auto fetch = [&](int stage, int i) {  // step i into `stage`, one copy group (maybe empty)
      if (i < steps)
#pragma unroll
        for (int n = 0; n < kCopies; ++n)
          if (copies[n]) cp_async16(dst[n] + stage * S::kStageFloats * 4, src[n] + i * kStepK);
      cp_async_commit();
    };
    // FP8: the block's sums apart (sum), added times the block's scale when it ends.
    float sum[MT][2][4];
    auto& into = W::kScaled ? sum : acc;
#pragma unroll
    for (int m = 0; m < MT; ++m)
#pragma unroll
      for (int j = 0; j < 2; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) acc[m][j][e] = sum[m][j][e] = 0.0f;
#pragma unroll
    for (int i = 0; i < S::kStages; ++i) fetch(i, i);
    for (int base = 0; base < steps; base += kSteps) {
#pragma unroll
      for (int u = 0; u < kSteps; ++u) {
        const int i = base + u;
        if (i >= steps) break;
        const int stage = u % S::kStages;
        cp_async_wait_pending<S::kStages - 1>();
        __syncwarp();  // every lane's copies of this step have landed
        uint32_t w[2][W::kPairs];
        W::pairs(lo[u], w[0]);
        W::pairs(hi[u], w[1]);
        // BF16 reads every A tile's activations and refills the stage before its MMAs (measured
        // faster at 8 rows, docs/gpu-history.md Run 18); FP8, short of registers, one A tile at a time.
        constexpr bool kAllAhead = !W::kScaled;
        float4 xv[kAllAhead ? MT : 1][2][kStepK / 16];
        const auto read = [&](int m, float4 (&into)[2][kStepK / 16]) {
#pragma unroll
          for (int h = 0; h < 2; ++h) {
            const float4* at = reinterpret_cast<const float4*>(ring + a[m][h].offset + stage * S::kStageFloats);
#pragma unroll
            for (int v = 0; v < kStepK / 16; ++v) into[h][v] = at[v];
          }
        };
        if constexpr (kAllAhead) {
#pragma unroll
          for (int m = 0; m < MT; ++m) read(m, xv[m]);
          __syncwarp();  // the stage is read before it is refilled
          fetch(stage, i + S::kStages);
        }
#pragma unroll
        for (int m = 0; m < MT; ++m) {
          auto& x = xv[kAllAhead ? m : 0];
          if constexpr (!kAllAhead) read(m, x);
          uint32_t top[W::kPairs], bottom[W::kPairs];
          a_pairs<W>(x[0], a[m][0], top);
          a_pairs<W>(x[1], a[m][1], bottom);
#pragma unroll
          for (int j = 0; j < 2; ++j)
#pragma unroll
            for (int q = 0; q < W::kPairs / 2; ++q)
              mma_bf16_16816(into[m][j], top[2 * q], bottom[2 * q], top[2 * q + 1], bottom[2 * q + 1], w[j][2 * q],
                             w[j][2 * q + 1]);
        }
        if constexpr (!kAllAhead) {
          __syncwarp();  // the stage is read before it is refilled
          fetch(stage, i + S::kStages);
        }
        if (i + kSteps < steps) load(u, i + kSteps);  // after the conversion: the slot's registers are free
        // FP8: a block is two steps, the slice starting on one (u's parity is the step's).
        if (W::kScaled && (u % 2 == 1 || i + 1 == steps)) {
          const float scale = __ldg(scales + i / 2);
#pragma unroll
          for (int m = 0; m < MT; ++m)
#pragma unroll
            for (int j = 0; j < 2; ++j)
#pragma unroll
              for (int e = 0; e < 4; ++e) {
                acc[m][j][e] = fmaf(sum[m][j][e], scale, acc[m][j][e]);
                sum[m][j][e] = 0.0f;
              }
        }
      }
    }
    cp_async_wait_all();  // only empty groups are left; the ring is free for the sums
    __syncwarp();
  }
};

// Two blocks per SM up to two A tiles; three (11 to 16 rows) need more registers than that leaves.
template <int MT, typename W>
__global__ void __launch_bounds__(kWarps * 32, MT <= 2 ? 2 : 1) gemv_mma_kernel(GemvArgs args, GemvPlan plan) {
  using S = Shape<MT, W>;
  constexpr int kStepK = W::kStepK;
  __shared__ __align__(16) float shared[kWarps * S::kRegion];  // per warp: its ring, then its sums
  GemvPart part;
  int64_t b, block;
  int shift;
  gemv_block_of(args, plan, part, b, block, shift);
  const int slices = 1 << shift;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, c = lane & 3, slice = warp % slices;
  const int64_t n0 = (block * (kWarps / slices) + warp / slices) * kTile;
  const bool active = n0 < part.n;  // inactive warps still reach the block barriers
  // Slices of whole scale blocks (two steps) for FP8, of steps for BF16.
  constexpr int kUnit = W::kScaled ? kScaleBlock / kStepK : 1;
  const int64_t steps = args.k / kStepK, units = (steps + kUnit - 1) / kUnit;
  const int64_t s0 = units * slice / slices * kUnit,
                s1 = active ? min(units * (slice + 1) / slices * kUnit, steps) : s0;
  const auto* w = static_cast<const typename W::Element*>(part.w) + b * part.w_batch_stride + s0 * kStepK +
                  (kStepK / 4) * c;
  const float* scales = nullptr;
  if constexpr (W::kScaled)
    scales = part.w_scales + n0 / kScaleBlock * ((args.k + kScaleBlock - 1) / kScaleBlock) + s0 / kUnit;
  TileDot<MT, W> dot{w + min(n0 + g, part.n - 1) * args.k, w + min(n0 + g + 8, part.n - 1) * args.k, scales,
                     int(s1 - s0)};
  dot.start();
  pdl_wait();  // x comes from the previous kernels
  float* mine = shared + warp * S::kRegion;
  float* y = part.y + b * part.y_batch_stride;
  for (int64_t r0 = 0; r0 < args.rows; r0 += kPassRows) {
    if (r0 > 0) {
      __syncthreads();  // the previous pass's sums are read
      dot.start();
    }
    const int rows = int(min(args.rows - r0, int64_t(kPassRows)));
    ARow a[MT][2];
#pragma unroll
    for (int m = 0; m < MT; ++m)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int q = 16 * m + 8 * h + g, r = q / 3, term = q - 3 * r;
        a[m][h] = {min(r, rows - 1) * S::kRowFloats + (kStepK / 4) * c, term >= 1 ? 0xffff0000u : 0u,
                   term >= 2 ? 0xffff0000u : 0u};
      }
    float acc[MT][2][4];
    dot.run(mine, args.x + b * args.x_batch_stride + r0 * args.x_row_stride + s0 * kStepK, args.x_row_stride, rows, a,
            lane, acc);
    float* flat = &acc[0][0][0];
    if (slices > 1) {
      if (slice != 0)
#pragma unroll
        for (int e = 0; e < S::kAcc; ++e) mine[e * 32 + lane] = flat[e];
      __syncthreads();
      if (slice == 0)
        for (int s = 1; s < slices; ++s)
#pragma unroll
          for (int e = 0; e < S::kAcc; ++e) flat[e] += mine[s * S::kRegion + e * 32 + lane];
    }
    if (!active || slice != 0) continue;
    // The tile's sums as [A row][16 output columns] in the warp's own region (no other warp reads
    // it): acc[m][j] holds A rows 16m + g (elements 0, 1) and 16m + g + 8 (2, 3), output columns
    // 8j + 2c (0, 2) and 8j + 2c + 1 (1, 3). Then each output's three terms are added.
#pragma unroll
    for (int m = 0; m < MT; ++m)
#pragma unroll
      for (int j = 0; j < 2; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) mine[(16 * m + g + 8 * (e >> 1)) * kTile + 8 * j + 2 * c + (e & 1)] = acc[m][j][e];
    __syncwarp();
    for (int idx = lane; idx < kTile * rows; idx += 32) {
      const int col = idx & (kTile - 1), r = idx / kTile;
      if (n0 + col >= part.n) continue;
      const float* terms = mine + 3 * r * kTile + col;
      y[(r0 + r) * part.y_row_stride + n0 + col] =
          (terms[0] + terms[kTile]) + terms[2 * kTile] + (part.bias ? part.bias[n0 + col] : 0.0f);
    }
  }
  pdl_trigger();
}

// log2 of the largest S in {1, 2, 4, 8} that keeps at most MOET_GEMV_MMA_TARGET_WARPS warps in the
// part and slices of at least kMinSliceK k.
int mma_split_shift(const GemvPart& part, int64_t k) {
  const int64_t tiles = (part.n + kTile - 1) / kTile * part.batch;
  int shift = 0;
  for (int s = 1; s < kWarps && tiles * s * 2 <= MOET_GEMV_MMA_TARGET_WARPS && k / (s * 2) >= kMinSliceK; s *= 2)
    ++shift;
  return shift;
}

template <typename W>
void launch(const GemvArgs& a, const GemvLayout& layout, cudaStream_t stream) {
  const int64_t rows = a.rows < kPassRows ? a.rows : kPassRows;  // 3 A rows each, 16 per A tile
  const dim3 grid(layout.blocks), block(kWarps * 32);
  if (rows <= Shape<1, W>::kRows) {
    launch_dependent_kernel<gemv_mma_kernel<1, W>>(grid, block, 0, 1, stream, a, layout.plan);
  } else if (rows <= Shape<2, W>::kRows) {
    launch_dependent_kernel<gemv_mma_kernel<2, W>>(grid, block, 0, 1, stream, a, layout.plan);
  } else {
    launch_dependent_kernel<gemv_mma_kernel<3, W>>(grid, block, 0, 1, stream, a, layout.plan);
  }
}

}  // namespace

bool gemv_mma_takes(const GemvArgs& a, const GemvPart& part) {
  const bool shape = a.weights == GemvWeights::bf16 ? a.k % Bf16Weights::kStepK == 0
                     : a.weights == GemvWeights::fp8_block ? a.k % Fp8Weights::kStepK == 0 && part.batch == 1
                                                           : false;
  return shape && (a.rows >= kGemvMmaMinRows || a.row_invariant) && a.rows <= MOET_GEMV_MMA_MAX_ROWS &&
         part.n * part.batch >= kGemvMmaMinColumns;
}

void gemv_mma_launch(const GemvArgs& args, cudaStream_t stream) {
  GemvArgs a = args;
  const GemvLayout layout =
      plan_gemv(a, kWarps, kTile, [&](const GemvPart& part) { return mma_split_shift(part, a.k); });
  if (a.weights == GemvWeights::fp8_block) {
    launch<Fp8Weights>(a, layout, stream);
  } else {
    launch<Bf16Weights>(a, layout, stream);
  }
}

}  // namespace moet::cuda
