// Split-K decode attention (see splitk_attention.h), launched as programmatic dependent launches
// (launch.cuh) that wait for the previous kernel before touching memory.
//
// A block is 4 warps; its split of the row's keys is cut into tiles of 64 keys, warp w taking keys
// 16w..16w+15 of each tile. Each warp runs on its own (no block barrier until the end): a ring of
// kStages 16-key stages in shared memory, filled by cp.async (two lanes per key: half of its K row
// and half of its V row each, and for FP8 one of its two F32 scales; block-table entries fetched
// one stage ahead; keys past the split's end are zeroed, not read); FP8 codes are converted
// exactly into a BF16 copy of the stage by the lanes that copied them. Per 16 keys, as
// prefill_attention.cu does per query tile: S = Q K^T (Q's three pieces in registers, K fragments by
// ldmatrix; hi products apart from mid and lo ones), scaled (FP8: times the key's K scale), masked
// past the split; the online softmax (attention_mma.cuh); P (FP8: times the key's V scale) split
// into pieces; O = O * alpha + P V (V fragments by ldmatrix.trans, one fresh accumulator per 16
// keys). At the end each warp leaves (m, l, O) of its keys in its shared region; the block folds
// warps 0..3 in order per output float4 (attention_fold.cuh), then either writes O / l (a row of
// one split) or its partial, which splitk_fold.cu's kernel folds, splits 0.. in order.
// MMA rows past H (fewer than 16 heads per KV head) have a zero query and are never stored.
#include "kernels/cuda/splitk_attention.h"

#include "kernels/cuda/attention_fold.cuh"
#include "kernels/cuda/attention_mma.cuh"
#include "kernels/cuda/cp_async.cuh"
#include "kernels/cuda/launch.cuh"
#include "kernels/cuda/splitk_plan.cuh"

#include <cuda_bf16.h>

#include <algorithm>

namespace moet::cuda {
namespace {

constexpr int kWarps = 4, kThreads = 32 * kWarps;
constexpr int kWarpKeys = 16;                  // keys of one warp step: the k of P V, two n-tiles of S
constexpr int kTileKeys = kSplitTileKeys;      // keys of one block step
constexpr int kStages = 3;                     // a warp's cp.async ring
constexpr int kMaxHeads = 16;                  // query heads per block: the MMA rows
static_assert(kTileKeys == kWarps * kWarpKeys, "a tile is one step of every warp");

// The shared memory of one warp for head dim D and cache dtype T. A stage: K rows, V rows (FP8:
// then the 16 K scales and the 16 V scales); FP8 adds the BF16 operand rows the codes are
// converted into. BF16 rows (staged or converted) have a pitch of D + 8 values: the 8 rows of an
// ldmatrix phase fall on distinct banks. After the keys, the region holds the warp's state.
template <int D, KvDtype T>
struct Tile {
  static constexpr bool fp8 = T != KvDtype::bf16;
  static constexpr int row_bytes = fp8 ? D : 2 * D;          // a head's row in a slot
  static constexpr int pitch = D + 8;                        // BF16 values per operand row
  static constexpr int raw_pitch = fp8 ? D + 16 : 2 * pitch;  // bytes per staged row
  static constexpr int rows_bytes = kWarpKeys * raw_pitch;   // K (or V) rows of a stage
  static constexpr int stage_bytes = 2 * rows_bytes + (fp8 ? 2 * kWarpKeys * 4 : 0);
  static constexpr int operand_bytes = fp8 ? 2 * kWarpKeys * pitch * 2 : 0;
  static constexpr int state_floats = kMaxHeads * (D + 2);  // O [16][D], m [16], l [16]
  static constexpr int warp_bytes = std::max(kStages * stage_bytes + operand_bytes, 4 * state_floats);
  static constexpr int bytes = kWarps * warp_bytes;
  static constexpr int lane_copies = row_bytes / 32;  // 16-byte copies per lane and row (two lanes a key)
  static constexpr int k_steps = D / 16;
  static_assert(stage_bytes % 16 == 0 && warp_bytes % 16 == 0 && raw_pitch % 16 == 0, "16-byte aligned rows");
};

// Head dim 64 is not dispatched: at 32 heads per KV head and 16390 keys its outputs missed the
// CPU tolerance (2.7e-5 against 2e-5) on an H100, where head dim 128 met it.
constexpr int kHeadDim = 128;

size_t tile_bytes(KvDtype dtype) {
  return dtype == KvDtype::bf16 ? Tile<kHeadDim, KvDtype::bf16>::bytes : Tile<kHeadDim, KvDtype::fp8_e4m3>::bytes;
}

SplitPlan plan_for(const AttentionArgs& a) {
  return split_plan(a, int(std::min<int64_t>(a.q_heads / a.cache.kv_heads, kMaxHeads)));
}

// One warp's keys: stages them through its ring and runs the online softmax over them.
template <int D, KvDtype T>
struct WarpKeys {
  using L = Tile<D, T>;
  const uint8_t* k;  // slot 0 of the K (V) cache, plus the KV head's row
  const uint8_t* v;
  const int32_t* table;
  int64_t slot_bytes;
  int scale_offset;      // of the KV head's scale, from a slot's start
  int block_size;
  int first, end;        // this warp's first key of tile 0; the split's end
  uint8_t* region;       // this warp's shared memory

  __device__ int lane() const { return int(threadIdx.x) & 31; }
  __device__ int key_of(int tile) const { return first + kTileKeys * tile + (lane() >> 1); }
  __device__ int32_t block_of(int tile) const {
    const int key = key_of(tile);
    return key < end ? table[key / block_size] : 0;
  }
  __device__ uint8_t* stage(int tile) const { return region + (tile % kStages) * L::stage_bytes; }

  // Copies this lane's half of key (lane / 2)'s K and V rows of `tile` (and one scale), or zeroes
  // them past the split; one commit group either way.
  __device__ void issue(int tile, int32_t block) const {
    const int key = key_of(tile), row = lane() >> 1, half = lane() & 1;
    uint8_t* const k_dst = stage(tile) + row * L::raw_pitch + half * (L::row_bytes / 2);
    uint8_t* const v_dst = k_dst + L::rows_bytes;
    float* const scales = reinterpret_cast<float*>(stage(tile) + 2 * L::rows_bytes);
    if (key < end) {
      const int64_t slot = (int64_t(block) * block_size + key % block_size) * slot_bytes;
      const uint8_t* k_src = k + slot + half * (L::row_bytes / 2);
      const uint8_t* v_src = v + slot + half * (L::row_bytes / 2);
#pragma unroll
      for (int f = 0; f < L::lane_copies; ++f) {
        cp_async16(k_dst + 16 * f, k_src + 16 * f);
        cp_async16(v_dst + 16 * f, v_src + 16 * f);
      }
      if constexpr (L::fp8) cp_async4(scales + half * kWarpKeys + row, (half ? v : k) + slot + scale_offset);
    } else {
#pragma unroll
      for (int f = 0; f < L::lane_copies; ++f) {
        *reinterpret_cast<uint4*>(k_dst + 16 * f) = make_uint4(0, 0, 0, 0);
        *reinterpret_cast<uint4*>(v_dst + 16 * f) = make_uint4(0, 0, 0, 0);
      }
      if constexpr (L::fp8) scales[half * kWarpKeys + row] = 0.0f;
    }
    cp_async_commit();
  }

  // The BF16 K rows of a landed stage (V rows follow at kWarpKeys * pitch): the stage itself, or
  // for FP8 the operand rows this lane's codes are converted into (the caller syncs the warp).
  __device__ const __nv_bfloat16* operands(int tile) const {
    const uint8_t* const src = stage(tile);
    if constexpr (!L::fp8) {
      return reinterpret_cast<const __nv_bfloat16*>(src);
    } else {
      auto* const dst = reinterpret_cast<__nv_bfloat16*>(region + kStages * L::stage_bytes);
      const int row = lane() >> 1, half = lane() & 1;
#pragma unroll
      for (int kv = 0; kv < 2; ++kv) {
        const uint8_t* codes = src + kv * L::rows_bytes + row * L::raw_pitch + half * (D / 2);
        __nv_bfloat16* values = dst + (kv * kWarpKeys + row) * L::pitch + half * (D / 2);
#pragma unroll
        for (int f = 0; f < D / 32; ++f) fp8x16_to_bf16<T>(codes + 16 * f, values + 16 * f);
      }
      return dst;
    }
  }
};

// S (scaled, masked) of 16 staged keys whose first is `key0` against Q's pieces.
template <int D, KvDtype T>
__device__ __forceinline__ void scores(const __nv_bfloat16* k_rows, const float* k_scales, int key0, int end,
                                       float scale, const uint32_t (&q)[D / 16][kPieces][4], float (&s)[2][4]) {
  const int c = int(threadIdx.x) & 3;
  float s_hi[2][4] = {}, s_small[2][4] = {};
  qk_16keys<0, D / 16>(k_rows, Tile<D, T>::pitch, q, s_hi, s_small);
#pragma unroll
  for (int n = 0; n < 2; ++n)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int key = 8 * n + 2 * c + (e & 1);
      float x = __fadd_rn(s_hi[n][e], s_small[n][e]);
      if constexpr (T != KvDtype::bf16) x = __fmul_rn(x, k_scales[key]);
      s[n][e] = key0 + key < end ? __fmul_rn(x, scale) : -INFINITY;
    }
}

// grid (q_heads / H, rows of this launch, splits): block (group, unit, z) serves heads
// group * H.. of row first_row + unit, split z of its keys.
template <int D, KvDtype T>
__global__ void __launch_bounds__(kThreads, 2) splitk_attention_kernel(AttentionArgs a, SplitPlan p) {
  using L = Tile<D, T>;
  extern __shared__ float4 shared4[];
  pdl_trigger();
  pdl_wait();  // q and the KV cache come from the previous kernels
  const int warp = int(threadIdx.x) >> 5, lane = int(threadIdx.x) & 31, g = lane >> 2, c = lane & 3;
  const int64_t unit = blockIdx.y, row = p.first_row + unit, t = a.row_ids ? a.row_ids[row] : row;
  const int z = int(blockIdx.z), keys = a.positions[t] + 1, chunk = int(chunk_keys(keys));
  const int used = int(ceil_div(keys, chunk));
  if (z >= used) return;  // this row has fewer splits than the grid
  const int end = min(keys, (z + 1) * chunk);
  const int64_t head0 = int64_t(blockIdx.x) * p.heads, kv_head = head0 / (a.q_heads / a.cache.kv_heads);
  uint8_t* const region = reinterpret_cast<uint8_t*>(shared4) + warp * L::warp_bytes;

  uint32_t q[L::k_steps][kPieces][4];  // Q's A fragments, rows g and g + 8 (zero past H)
  {
    const float* q_row[2];
#pragma unroll
    for (int i = 0; i < 2; ++i)
      q_row[i] = g + 8 * i < p.heads ? a.q + (t * a.q_heads + head0 + g + 8 * i) * a.q_stride : nullptr;
#pragma unroll
    for (int ks = 0; ks < L::k_steps; ++ks) q_pieces(q_row[0], q_row[1], 16 * ks, q[ks]);
  }

  const WarpKeys<D, T> w{a.cache.k + kv_head * L::row_bytes, a.cache.v + kv_head * L::row_bytes,
                         a.block_tables + int64_t(a.row_seq[t]) * a.table_stride, a.cache.slot_bytes,
                         p.scale_offset + 4 * int(kv_head) - int(kv_head) * L::row_bytes, int(a.cache.block_size),
                         z * chunk + kWarpKeys * warp, end, region};
  const int tiles = w.first < end ? int(ceil_div(end - w.first, kTileKeys)) : 0;
#pragma unroll
  for (int i = 0; i < kStages - 1; ++i) {
    if (i < tiles) {
      w.issue(i, w.block_of(i));
    } else {
      cp_async_commit();
    }
  }
  int32_t next_block = kStages - 1 < tiles ? w.block_of(kStages - 1) : 0;
  float o[D / 8][4] = {};
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};
  for (int i = 0; i < tiles; ++i) {
    cp_async_wait_pending<kStages - 2>();  // this lane's copies of tile i
    __syncwarp();                          // every lane's; every lane is done with tile i - 1
    if (i + kStages - 1 < tiles) {
      w.issue(i + kStages - 1, next_block);
      if (i + kStages < tiles) next_block = w.block_of(i + kStages);
    } else {
      cp_async_commit();
    }
    const __nv_bfloat16* k_rows = w.operands(i);
    const float* scales = reinterpret_cast<const float*>(w.stage(i) + 2 * L::rows_bytes);
    __syncwarp();  // FP8: every lane's converted rows
    float s[2][4], alpha[2];
    const int key0 = w.first + kTileKeys * i;
    scores<D, T>(k_rows, scales, key0, end, a.scale, q, s);
    online_softmax_step(s, m, l, alpha);  // finite m from tile 0: it has key w.first
    if constexpr (L::fp8) {
#pragma unroll
      for (int n = 0; n < 2; ++n)
#pragma unroll
        for (int e = 0; e < 4; ++e) s[n][e] = __fmul_rn(s[n][e], scales[kWarpKeys + 8 * n + 2 * c + (e & 1)]);
    }
    uint32_t pf[kPieces][4];
    p_pieces(s, pf);
    pv_16keys<D>(k_rows + kWarpKeys * L::pitch, L::pitch, pf, alpha, o);
  }
  cp_async_wait_all();
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    l[i] = __fadd_rn(l[i], __shfl_xor_sync(0xffffffffu, l[i], 1));
    l[i] = __fadd_rn(l[i], __shfl_xor_sync(0xffffffffu, l[i], 2));
  }
  __syncwarp();  // the ring is free: the warp's state goes there
  float* const state = reinterpret_cast<float*>(region);  // O [16][D], m [16], l [16]
#pragma unroll
  for (int n = 0; n < D / 8; ++n)
#pragma unroll
    for (int i = 0; i < 2; ++i)
      *reinterpret_cast<float2*>(state + (g + 8 * i) * D + 8 * n + 2 * c) = make_float2(o[n][2 * i], o[n][2 * i + 1]);
  if (c == 0) {
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      state[kMaxHeads * D + g + 8 * i] = m[i];
      state[kMaxHeads * D + kMaxHeads + g + 8 * i] = l[i];
    }
  }
  __syncthreads();

  // Output float4 slots threadIdx.x + r * kThreads: head slot / (D / 4), float4 slot % (D / 4).
  constexpr int kSlots = kMaxHeads * D / 4 / kThreads;
  const int slots = p.heads * D / 4;
  Partial total[kSlots];
#pragma unroll
  for (int r = 0; r < kSlots; ++r) {
    const int slot = int(threadIdx.x) + r * kThreads, h = slot / (D / 4), d4 = slot % (D / 4);
    total[r] = cleared();
    if (slot >= slots) continue;
#pragma unroll
    for (int from = 0; from < kWarps; ++from) {  // warps in order; a warp without keys left m = -inf
      const auto* st = reinterpret_cast<const float*>(reinterpret_cast<const uint8_t*>(shared4) + from * L::warp_bytes);
      const float wm = st[kMaxHeads * D + h];
      if (wm != -INFINITY)
        fold(total[r], {wm, st[kMaxHeads * D + kMaxHeads + h], reinterpret_cast<const float4*>(st + h * D)[d4]});
    }
  }
  const auto out_at = [&](int h, int d4) { return a.out + (t * a.q_heads + head0 + h) * D + 4 * d4; };
  if (used > 1) {
    const auto partial_at = [&](int h, int split) {
      return a.partials + ((unit * a.q_heads + head0 + h) * p.splits + split) * p.width;
    };
#pragma unroll
    for (int r = 0; r < kSlots; ++r) {
      const int slot = int(threadIdx.x) + r * kThreads, h = slot / (D / 4), d4 = slot % (D / 4);
      if (slot >= slots) continue;
      float* dst = partial_at(h, z);
      if (d4 == 0) {
        dst[0] = total[r].m;
        dst[1] = total[r].l;
      }
      reinterpret_cast<float4*>(dst + 4)[d4] = total[r].o;
    }
    return;  // splitk_fold_launch folds the row
  }
#pragma unroll
  for (int r = 0; r < kSlots; ++r) {
    const int slot = int(threadIdx.x) + r * kThreads;
    if (slot < slots) store_normalised(out_at(slot / (D / 4), slot % (D / 4)), total[r], 4);
  }
}

template <int D, KvDtype T>
void launch(const AttentionArgs& a, const SplitPlan& p, cudaStream_t stream) {
  launch_split<splitk_attention_kernel<D, T>>(a, p, kThreads, Tile<D, T>::bytes, stream);
}

void launch_dtype(const AttentionArgs& a, const SplitPlan& p, cudaStream_t stream) {
  switch (a.cache.dtype) {
    case KvDtype::bf16: return launch<kHeadDim, KvDtype::bf16>(a, p, stream);
    case KvDtype::fp8_e4m3: return launch<kHeadDim, KvDtype::fp8_e4m3>(a, p, stream);
    case KvDtype::fp8_e5m2: return launch<kHeadDim, KvDtype::fp8_e5m2>(a, p, stream);
    default: return;  // splitk_attention_supports
  }
}

}  // namespace

bool splitk_attention_supports(const PagedKvArgs& c, int64_t q_heads) {
  if (c.v == c.k || c.kv_heads <= 0 || q_heads % c.kv_heads != 0 || c.k_dim != c.v_dim ||
      c.k_dim != kHeadDim || c.slot_bytes % 16 != 0 || !aligned16(c.k) || !aligned16(c.v))
    return false;
  if (c.dtype != KvDtype::bf16 && c.dtype != KvDtype::fp8_e4m3 && c.dtype != KvDtype::fp8_e5m2) return false;
  const int64_t group = q_heads / c.kv_heads;
  if (group > kMaxHeads && group % kMaxHeads != 0) return false;
  return shared_memory_fits(tile_bytes(c.dtype));
}

int64_t splitk_attention_partial_floats(const AttentionArgs& a) { return split_partial_floats(a, plan_for(a)); }

void splitk_attention_launch(const AttentionArgs& a, cudaStream_t stream) {
  if (a.rows == 0) return;
  launch_dtype(a, plan_for(a), stream);
}

}  // namespace moet::cuda
