// Routed experts stored as W2 on tensor cores (moe.h; layout in w2_tiles.h, building blocks in
// w2_mma.cuh). Three launches chained by programmatic dependent launch, then moe.cu's combine:
//   prepare: block 0 groups the items by expert (moe_group.cuh); the other blocks split each x
//            row into three BF16 terms in the B-fragment layout;
//   gate_up: one block of four warps per (active expert, 16-row tile = 8 gate + 8 up rows), each
//            warp a quarter of K (split K); each lane streams its 16 code bytes per 128-column
//            chunk through a private cp.async ring of 4 chunks in shared memory, decoded in
//            registers into eight A fragments, two MMAs per scale block and activation-row pair,
//            the block's partial sums scaled into FP32 accumulators; the quarters are added in
//            shared memory, SiLU-and-mul in registers, the result written already split for down;
//   down:    the same over the hidden rows, its first codes requested before waiting for gate_up;
//            outputs per item for the fixed-order combine.
// Every sum has a fixed order (chunks ascending within a quarter, quarters in order, then
// (hi + mid) + lo): bit-identical reruns.
#include "kernels/cuda/moe_w2.h"

#include "kernels/cuda/moe_group.cuh"
#include "kernels/cuda/w2_mma.cuh"
#include "kernels/cuda/w2_tiles.h"

namespace moet::cuda {
namespace {

constexpr int kWarps = 4;         // per block of the product kernels: the K quarters of one tile
constexpr int kStages = 4;        // chunks in flight per warp (2 KB of codes)
constexpr size_t kRingBytes = size_t(kWarps) * kStages * 32 * (sizeof(uint4) + sizeof(uint2));
constexpr int kPrepareThreads = 256;

__global__ void w2_prepare_kernel(MoeArgs a) {
  pdl_trigger();
  if (blockIdx.x == 0) {
    extern __shared__ int32_t count[];
    moe_group_block(a, count);
    return;
  }
  const int64_t id = int64_t(blockIdx.x - 1) * blockDim.x + threadIdx.x;
  if (id >= a.rows * a.hidden_padded) return;
  const int64_t row = id / a.hidden_padded, k = id % a.hidden_padded;
  const float x = k < a.hidden ? a.x[row * a.hidden + k] : 0.0f;
  w2_split_store(x, a.x_split + row * 3 * a.hidden_padded, a.hidden_padded, k);
}

__device__ __forceinline__ float scale_of(uint32_t bytes, int q) {
  return __uint_as_float(((bytes >> (8 * q)) & 0xFFu) << 23);
}

__device__ __forceinline__ void cp_async16(void* shared, const void* global) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(uint32_t(__cvta_generic_to_shared(shared))),
               "l"(global));
}
__device__ __forceinline__ void cp_async4(void* shared, const void* global) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4;" ::"r"(uint32_t(__cvta_generic_to_shared(shared))),
               "l"(global));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;"); }
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory");
}

// Columns: lane c holds 2c and 2c + 1. Item pair (first, second) = columns (0, 1, 2) and
// (3, 4, 5), each (hi + mid) + lo; lane c = 0 ends with the first's rows g and g + 8, c = 1 with
// the second's. gate_up: SiLU(gate) * up, stored split for down; down: the item's output rows.
template <bool kGateUp, int P>
__device__ __forceinline__ void write_outputs(const MoeArgs& a, const float (&acc)[P][4], int64_t tile, int p0,
                                              int end, int g, int c) {
#pragma unroll
  for (int p = 0; p < P; ++p) {
    float out[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const float e0 = acc[p][2 * r], e1 = acc[p][2 * r + 1];
      const float n0 = __shfl_down_sync(0xffffffffu, e0, 1), n1 = __shfl_down_sync(0xffffffffu, e1, 1);
      out[r] = c == 0 ? (e0 + e1) + n0 : (e1 + n0) + n1;
    }
    const int pos = p0 + 2 * p + c;
    if (c >= 2 || pos >= end) continue;
    if (kGateUp) {
      const float gate = out[0], up = out[1];
      w2_split_store(gate / (1.0f + expf(-gate)) * up, a.act_split + int64_t(pos) * 3 * a.inner_padded,
                     a.inner_padded, tile * 8 + g);
    } else {
      float* y = a.item_out + int64_t(a.order[pos]) * a.hidden + tile * kW2TileRows + g;
      y[0] = out[0];
      y[8] = out[1];
    }
  }
}

// A lane's private ring of kStages chunks in shared memory, filled by cp.async: its 16 code bytes
// and the scale words of rows g and g + 8, for chunks [first, end) of its tile. A lane reads back
// only what it copied itself, so the per-thread cp.async completion is all the synchronisation
// needed.
struct ChunkRing {
  uint4* codes;     // [kStages][32 lanes]
  uint2* scales;    // [kStages][32 lanes]
  const uint4* code_src;
  const uint8_t* scale_src;
  int64_t first, end;
  int lane, g;

  __device__ __forceinline__ int slot(int64_t chunk) const { return int((chunk - first) % kStages) * 32 + lane; }
  __device__ __forceinline__ void issue(int64_t chunk) {
    if (chunk < end) {
      const int at = slot(chunk);
      cp_async16(codes + at, code_src + chunk * 32);
      const uint8_t* s = scale_src + chunk * kW2ChunkScaleBytes;
      cp_async4(&scales[at].x, s + 4 * g);
      cp_async4(&scales[at].y, s + 4 * (g + 8));
    }
    cp_async_commit();  // an empty group past the end keeps the group count uniform
  }
  __device__ __forceinline__ void prologue() {
#pragma unroll
    for (int i = 0; i < kStages; ++i) issue(first + i);
  }
};

// One block: tile blockIdx.x of the active expert in slot blockIdx.y, all its items, P pairs of
// items per pass. Warp w streams the w-th quarter of the tile's chunks (split K: four times the
// warps in flight of one warp per tile); the four partial sums meet in shared memory and warp 0
// adds them in warp order (deterministic) and writes the outputs.
template <bool kGateUp, int P>
__global__ void __launch_bounds__(kWarps * 32) w2_product_kernel(MoeArgs a) {
  extern __shared__ uint4 ring_memory[];
  const int lane = threadIdx.x & 31, g = lane >> 2, c = lane & 3, warp = threadIdx.x >> 5;
  const int64_t tile = blockIdx.x;
  const int slot = blockIdx.y;
  if (kGateUp) pdl_wait();  // grouping and the split x come from prepare
  pdl_trigger();
  if (slot >= *a.active_count) return;  // whole blocks leave together (the reduction syncs)
  const int64_t k_padded = kGateUp ? a.hidden_padded : a.inner_padded, chunks = k_padded / kW2ChunkCols;
  const ExpertPointers e = a.table[a.active[slot]];
  uint4* warp_memory = ring_memory + warp * kStages * 32 * 3 / 2;
  ChunkRing ring{warp_memory, reinterpret_cast<uint2*>(warp_memory + kStages * 32),
                 static_cast<const uint4*>(kGateUp ? e.gate_up : e.down) + tile * chunks * 32 + lane,
                 (kGateUp ? e.gate_up_scales : e.down_scales) + tile * chunks * kW2ChunkScaleBytes,
                 chunks * warp / kWarps, chunks * (warp + 1) / kWarps, lane, g};
  const int begin = a.ranges[slot], end = a.ranges[slot + 1];
  ring.prologue();
  if (!kGateUp) pdl_wait();  // act comes from gate_up; the first chunks are already on their way
  const uint16_t* split = kGateUp ? a.x_split : a.act_split;
  float* partial = reinterpret_cast<float*>(ring_memory);  // [kWarps][P][4][32], after the rings drain
  for (int p0 = begin; p0 < end; p0 += 2 * P) {
    if (p0 != begin) ring.prologue();
    const uint4* xs[P];
#pragma unroll
    for (int p = 0; p < P; ++p) {
      const int first = min(p0 + 2 * p, end - 1), second = min(first + 1, end - 1);
      const int pos = g >= 3 && g < 6 ? second : first;
      const int64_t row = kGateUp ? a.order[pos] / a.top_k : pos;
      xs[p] = reinterpret_cast<const uint4*>(split + (row * 3 + g % 3) * k_padded) + c;
    }
    float acc[P][4];
#pragma unroll
    for (int p = 0; p < P; ++p)
#pragma unroll
      for (int i = 0; i < 4; ++i) acc[p][i] = 0.0f;
    for (int64_t chunk = ring.first; chunk < ring.end; ++chunk) {
      cp_async_wait<kStages - 1>();  // this chunk's group is complete
      const int at = ring.slot(chunk);
      const uint4 code = ring.codes[at];
      const uint2 scale = ring.scales[at];
      ring.issue(chunk + kStages);  // refill the slot just read
      const uint32_t words[4] = {code.x, code.y, code.z, code.w};
#pragma unroll
      for (int q = 0; q < 4; ++q) {
        uint32_t frag[8];
#pragma unroll
        for (int j = 0; j < 8; ++j) frag[j] = w2_decode(words[q], j);
        const float s_top = scale_of(scale.x, q), s_bottom = scale_of(scale.y, q);
#pragma unroll
        for (int p = 0; p < P; ++p) {
          const uint4 xv = __ldg(xs[p] + (chunk * 4 + q) * 4);
          float d[4] = {0.0f, 0.0f, 0.0f, 0.0f};
          mma_bf16_16816(d, frag[0], frag[1], frag[2], frag[3], xv.x, xv.y);
          mma_bf16_16816(d, frag[4], frag[5], frag[6], frag[7], xv.z, xv.w);
          acc[p][0] = fmaf(d[0], s_top, acc[p][0]);
          acc[p][1] = fmaf(d[1], s_top, acc[p][1]);
          acc[p][2] = fmaf(d[2], s_bottom, acc[p][2]);
          acc[p][3] = fmaf(d[3], s_bottom, acc[p][3]);
        }
      }
    }
    cp_async_wait<0>();
    __syncthreads();  // every ring drained and read: the memory now holds the partial sums
#pragma unroll
    for (int p = 0; p < P; ++p)
#pragma unroll
      for (int i = 0; i < 4; ++i) partial[((warp * P + p) * 4 + i) * 32 + lane] = acc[p][i];
    __syncthreads();
    if (warp == 0) {
#pragma unroll
      for (int p = 0; p < P; ++p)
#pragma unroll
        for (int i = 0; i < 4; ++i)
#pragma unroll
          for (int w = 1; w < kWarps; ++w) acc[p][i] += partial[((w * P + p) * 4 + i) * 32 + lane];
      write_outputs<kGateUp, P>(a, acc, tile, p0, end, g, c);
    }
    __syncthreads();  // the partial sums are read before the next pass refills the rings
  }
}

template <int P>
void w2_products(const MoeArgs& a, unsigned max_active, cudaStream_t stream) {
  static_assert(kRingBytes >= sizeof(float) * kWarps * 4 * 4 * 32, "the partial sums reuse the rings");
  launch_dependent(w2_product_kernel<true, P>, dim3(unsigned(a.inner / 8), max_active), dim3(kWarps * 32), kRingBytes, a,
                   stream);
  launch_dependent(w2_product_kernel<false, P>, dim3(unsigned(a.hidden / kW2TileRows), max_active), dim3(kWarps * 32),
                   kRingBytes, a, stream);
}

bool pdl_supported() {
  static const bool supported = [] {
    int device = 0, major = 0;
    cudaGetDevice(&device);
    cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device);
    return major >= 9;
  }();
  return supported;
}

}  // namespace

void launch_dependent(void (*kernel)(MoeArgs), dim3 grid, dim3 block, size_t shared, const MoeArgs& a,
                      cudaStream_t stream) {
  cudaLaunchConfig_t config = {};
  config.gridDim = grid;
  config.blockDim = block;
  config.dynamicSmemBytes = shared;
  config.stream = stream;
  cudaLaunchAttribute attribute[1];
  attribute[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attribute[0].val.programmaticStreamSerializationAllowed = 1;
  config.attrs = attribute;
  config.numAttrs = pdl_supported() ? 1 : 0;
  cudaLaunchKernelEx(&config, kernel, a);
}

void moe_w2_launch(const MoeArgs& a, unsigned max_active, cudaStream_t stream) {
  if (a.inner % kW2ChunkCols != 0)  // padding columns of act must read as zero
    cudaMemsetAsync(a.act_split, 0, size_t(a.rows * a.top_k * 3 * a.inner_padded) * sizeof(uint16_t), stream);
  const int64_t split_threads = a.rows * a.hidden_padded;
  w2_prepare_kernel<<<unsigned(1 + (split_threads + kPrepareThreads - 1) / kPrepareThreads), kPrepareThreads,
                      size_t(a.experts) * sizeof(int32_t), stream>>>(a);
  if (a.rows <= 2) {
    w2_products<1>(a, max_active, stream);
  } else if (a.rows <= 4) {
    w2_products<2>(a, max_active, stream);
  } else {
    w2_products<4>(a, max_active, stream);
  }
}

}  // namespace moet::cuda
