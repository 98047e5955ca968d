// Split-K (flash-decoding) decode attention on the tensor cores over MLA latent caches
// (DeepSeek-V3, Kimi-K2, GLM: every query head attends over one shared latent row per token, its
// 576 values the key, its first 512 the value) in BF16, FP8 (e4m3, e5m2) or NVFP4, with the
// semantics of kernels/cpu/attention.h: query row t, head h sees keys 0..positions[t] of its
// sequence through the block table. Serves a latent of 576 / 512 and a multiple of 16 query heads
// (splitk_mla_attention_supports, declared in splitk_attention.h); F32 caches and other shapes
// stay on attention_launch (attention.h), which gives a row different last bits.
//
// A block serves one row, 32 query heads (two m16 tiles of the MMAs; with 16 heads one) and one
// split of the row's keys: each key's latent is staged once for those heads, and the blocks of a
// row's other head groups read the same keys at the same time (from L2). Splits as the GQA
// kernel's (splitk_plan.cuh): functions of the row's own key count, folded in order by the last
// block to finish, so a row's bits depend neither on the other rows of the step, nor on the batch
// size, nor on the launch the rows are cut into; nothing is sized by a host-side key count beyond
// max_keys (captured graphs stay valid as contexts grow).
//
// Numerics: every cache value is exact in BF16 (a BF16 value; an FP8 code, whose F32 scale per
// token and group multiplies the partial score of its group and, for the latent, P; an e2m1
// nibble times its e4m3 scale; an e4m3 rope value), so only the query and the softmax weights P
// are split into three BF16 pieces (FP32-level products, as the GQA kernel). Differs from the CPU
// by summation order only. Launched as programmatic dependent launches (launch.cuh) that wait for
// the previous kernel before touching memory.
//
// A block is 8 warps: warps 0-3 serve the block's first 16 heads (m-tile 0), warps 4-7 the next
// 16 (m-tile 1; idle past the row's heads). Its split of the row's keys is cut into tiles of 64
// keys, staged by all threads with cp.async in a ring of two (the next tile loads while this one is
// computed; keys past the split are zeroed, not read); FP8 / NVFP4 slots are then converted
// exactly into one BF16 copy of the tile (BF16 slots are the MMA operands as they land). Warp j of
// an m-tile holds Q's three BF16 pieces for 144 of the 576 key columns (latent columns
// 128j..128j+127 and rope columns 512+16j..512+16j+15) and owns output columns 128j..128j+127:
//   1. per 16 keys it computes its columns' share of S = Q K^T (hi products apart from mid and lo;
//      FP8: latent and rope shares times their keys' scales), and leaves it in shared memory;
//   2. after a block barrier it adds the 4 shares of its m-tile in warp order (every warp of the
//      m-tile gets the same S), scales, masks past the split, runs the online softmax
//      (attention_mma.cuh; the 4 warps compute the same m, l and P), multiplies P by the key's
//      latent scale (FP8), and adds P V for its 128 output columns.
// At the end the warps of an m-tile hold the same (m, l) and disjoint columns of O: a row of one
// split stores O / l, else each block writes its partial and splitk_fold.cu's kernel, launched
// after this one, folds the row's splits in order.
#include "kernels/cuda/splitk_attention.h"

#include "formats/kv_codec.h"
#include "kernels/cuda/attention_fold.cuh"
#include "kernels/cuda/attention_mma.cuh"
#include "kernels/cuda/cp_async.cuh"
#include "kernels/cuda/launch.cuh"
#include "kernels/cuda/splitk_plan.cuh"

#include <cuda_bf16.h>

namespace moet::cuda {
namespace {

constexpr int kKDim = 576, kVDim = 512;   // latent + rope; latent (the value)
constexpr int kGroupWarps = 4;            // warps per m-tile: 4 shares of S, 4 column ranges of O
constexpr int kMTiles = 2;                // m16 tiles of heads per block
constexpr int kWarps = kGroupWarps * kMTiles, kThreads = 32 * kWarps;
constexpr int kHeads = 16 * kMTiles;      // query heads per block
constexpr int kTileKeys = kSplitTileKeys, kChunks = kTileKeys / 16;  // 16-key steps per tile
constexpr int kStages = 2;
constexpr int kPitch = kKDim + 8;         // BF16 values per operand row: ldmatrix phases on distinct banks
constexpr int kLatentSteps = kVDim / 16 / kGroupWarps;   // a warp's latent k-steps (8)
constexpr int kSteps = kLatentSteps + 1;                 // and one rope k-step
constexpr int kOutDims = kVDim / kGroupWarps;            // a warp's output columns (128)
constexpr int kUnits = kKDim / 16;                       // 16-value conversion units per key
static_assert((kKDim - kVDim) / 16 == kGroupWarps, "one rope k-step per warp");

// The shared memory for cache dtype T: kStages staged tiles (raw slots, or BF16 operand rows),
// the BF16 operand rows converted from a raw tile, and the S shares (one float per lane,
// accumulator element, 16-key chunk and warp).
template <KvDtype T>
struct Tile {
  static constexpr KvSlotLayout slot = kv_slot_layout(KvLayout{T, 1, kKDim, kVDim, true});
  static constexpr bool decoded = T != KvDtype::bf16;        // staged raw, converted to BF16 rows
  static constexpr bool scaled = decoded && T != KvDtype::nvfp4;  // FP8: F32 scales per key
  static constexpr int copies = int(slot.bytes) / 16;         // 16-byte copies per key
  static constexpr int raw_pitch = decoded ? int(slot.bytes) : 2 * kPitch;  // bytes per staged key
  static constexpr int stage_bytes = kTileKeys * raw_pitch;
  static constexpr int operand_bytes = decoded ? kTileKeys * 2 * kPitch : 0;
  static constexpr int share_floats = kWarps * kChunks * 8 * 32;
  static constexpr int bytes = kStages * stage_bytes + operand_bytes + 4 * share_floats;
  static_assert(slot.bytes % 16 == 0 && stage_bytes % 16 == 0 && operand_bytes % 16 == 0, "16-byte aligned rows");
};

size_t tile_bytes(KvDtype dtype) {
  switch (dtype) {
    case KvDtype::bf16: return Tile<KvDtype::bf16>::bytes;
    case KvDtype::fp8_e4m3:
    case KvDtype::fp8_e5m2: return Tile<KvDtype::fp8_e4m3>::bytes;
    default: return Tile<KvDtype::nvfp4>::bytes;
  }
}

// Sixteen latent values of an NVFP4 slot (8 bytes of nibbles, the even index low) times their
// e4m3 scale, as BF16 (exact: a 2-bit times a 4-bit significand).
__device__ __forceinline__ void nvfp4x16_to_bf16(const uint8_t* nibbles, uint8_t scale_code, __nv_bfloat16* values) {
  const uint2 w = *reinterpret_cast<const uint2*>(nibbles);
  const float scale = fp8_decode(scale_code, Fp8Kind::e4m3);
  uint32_t out[8];
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    const uint32_t byte = ((i < 4 ? w.x : w.y) >> (8 * (i & 3))) & 0xffu;
    out[i] = bits(__floats2bfloat162_rn(e2m1_decode(uint8_t(byte & 15u)) * scale,
                                        e2m1_decode(uint8_t(byte >> 4)) * scale));
  }
  reinterpret_cast<uint4*>(values)[0] = make_uint4(out[0], out[1], out[2], out[3]);
  reinterpret_cast<uint4*>(values)[1] = make_uint4(out[4], out[5], out[6], out[7]);
}

// The keys of one block: where they live and how a tile of them is staged.
template <KvDtype T>
struct BlockKeys {
  using L = Tile<T>;
  const uint8_t* cache;
  const int32_t* table;
  int64_t slot_bytes;
  int block_size;
  int first, end;  // the split's keys
  uint8_t* shared;

  __device__ uint8_t* stage(int tile) const { return shared + (tile % kStages) * L::stage_bytes; }
  __device__ __nv_bfloat16* converted() const {
    return reinterpret_cast<__nv_bfloat16*>(shared + kStages * L::stage_bytes);
  }
  __device__ float* shares() const {
    return reinterpret_cast<float*>(shared + kStages * L::stage_bytes + L::operand_bytes);
  }

  // Copies the slots of `tile` (consecutive threads: consecutive 16 bytes of a slot), zeroing
  // keys past the split; one commit group.
  __device__ void issue(int tile) const {
    uint8_t* const dst = stage(tile);
    const int key0 = first + kTileKeys * tile;
#pragma unroll
    for (int r = 0; r < ceil_div(kTileKeys * L::copies, kThreads); ++r) {
      const int i = int(threadIdx.x) + r * kThreads, key = i / L::copies, f = i % L::copies;
      if (i >= kTileKeys * L::copies) break;
      uint8_t* const to = dst + key * L::raw_pitch + 16 * f;
      if (key0 + key < end) {
        const int k = key0 + key;
        cp_async16(to, cache + (int64_t(table[k / block_size]) * block_size + k % block_size) * slot_bytes + 16 * f);
      } else {
        *reinterpret_cast<uint4*>(to) = make_uint4(0, 0, 0, 0);
      }
    }
    cp_async_commit();
  }

  // The BF16 rows of a landed tile (the caller syncs the block after a conversion).
  __device__ const __nv_bfloat16* operands(int tile) const {
    const uint8_t* const raw = stage(tile);
    if constexpr (!L::decoded) {
      return reinterpret_cast<const __nv_bfloat16*>(raw);
    } else {
      __nv_bfloat16* const dst = converted();
#pragma unroll
      for (int r = 0; r < ceil_div(kTileKeys * kUnits, kThreads); ++r) {
        const int i = int(threadIdx.x) + r * kThreads, key = i / kUnits, u = i % kUnits;
        if (i >= kTileKeys * kUnits) break;
        const uint8_t* const slot = raw + key * L::raw_pitch;
        __nv_bfloat16* const values = dst + key * kPitch + 16 * u;
        if constexpr (L::scaled) {
          fp8x16_to_bf16<T>(slot + 16 * u, values);
        } else if (u < kVDim / 16) {
          nvfp4x16_to_bf16(slot + 8 * u, slot[L::slot.scale_offset + u], values);
        } else {
          fp8x16_to_bf16<KvDtype::fp8_e4m3>(slot + L::slot.rope_offset + 16 * (u - kVDim / 16), values);
        }
      }
      return dst;
    }
  }

  // FP8: the latent (group 0) and rope (group 1) scales of key `key` of a landed tile.
  __device__ float2 scales(int tile, int key) const {
    return *reinterpret_cast<const float2*>(stage(tile) + key * L::raw_pitch + L::slot.scale_offset);
  }
};

// grid (ceil(q_heads / 32), rows of this launch, splits): block (group, unit, z) serves heads
// group * 32.. of row first_row + unit, split z of its keys.
template <KvDtype T>
__global__ void __launch_bounds__(kThreads, 1) splitk_mla_attention_kernel(AttentionArgs a, SplitPlan p) {
  using L = Tile<T>;
  extern __shared__ float4 shared4[];
  pdl_trigger();
  pdl_wait();  // q and the KV cache come from the previous kernels
  const int warp = int(threadIdx.x) >> 5, lane = int(threadIdx.x) & 31, g = lane >> 2, c = lane & 3;
  const int j = warp % kGroupWarps, mtile = warp / kGroupWarps;
  const int64_t unit = blockIdx.y, row = p.first_row + unit, t = a.row_ids ? a.row_ids[row] : row;
  const int z = int(blockIdx.z), keys = a.positions[t] + 1, chunk = int(chunk_keys(keys));
  const int used = int(ceil_div(keys, chunk));
  if (z >= used) return;  // this row has fewer splits than the grid
  const int end = min(keys, (z + 1) * chunk);
  const int64_t head0 = int64_t(blockIdx.x) * kHeads + 16 * mtile;  // the warp's m-tile
  const bool active = head0 < a.q_heads;

  uint32_t q[kSteps][kPieces][4];  // Q's A fragments: latent k-steps, then the rope k-step
  if (active) {
    const float* q_g = a.q + (t * a.q_heads + head0 + g) * a.q_stride;
    const float* q_g8 = q_g + 8 * a.q_stride;
#pragma unroll
    for (int ks = 0; ks < kLatentSteps; ++ks) q_pieces(q_g, q_g8, kOutDims * j + 16 * ks, q[ks]);
    q_pieces(q_g, q_g8, kVDim + 16 * j, q[kLatentSteps]);
  }

  const BlockKeys<T> b{a.cache.k, a.block_tables + int64_t(a.row_seq[t]) * a.table_stride, a.cache.slot_bytes,
                       int(a.cache.block_size), z * chunk, end, reinterpret_cast<uint8_t*>(shared4)};
  float* const my_shares = b.shares() + warp * kChunks * 8 * 32 + lane;
  const float* const group_shares = b.shares() + mtile * kGroupWarps * kChunks * 8 * 32 + lane;
  const int tiles = int(ceil_div(end - b.first, kTileKeys));
  b.issue(0);
  float o[kOutDims / 8][4] = {};
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};
  for (int i = 0; i < tiles; ++i) {
    cp_async_wait_all();  // this thread's copies of tile i
    __syncthreads();      // everyone's; everyone is done with tile i - 1 (its stage, rows and shares)
    if (i + 1 < tiles) b.issue(i + 1);
    const __nv_bfloat16* rows = b.operands(i);
    if constexpr (L::decoded) __syncthreads();  // every thread's converted rows
    const int key0 = b.first + kTileKeys * i, chunks = min(kChunks, int(ceil_div(end - key0, 16)));
    if (active) {
      for (int ch = 0; ch < chunks; ++ch) {  // this warp's share of S
        const __nv_bfloat16* k_rows = rows + 16 * ch * kPitch;
        float lat_hi[2][4] = {}, lat_small[2][4] = {};
        qk_16keys<0, kLatentSteps>(k_rows + kOutDims * j, kPitch, q, lat_hi, lat_small);
        if constexpr (L::scaled) {
          float rope_hi[2][4] = {}, rope_small[2][4] = {};
          qk_16keys<kLatentSteps, kSteps>(k_rows + kVDim + 16 * j, kPitch, q, rope_hi, rope_small);
#pragma unroll
          for (int n = 0; n < 2; ++n)
#pragma unroll
            for (int e = 0; e < 4; ++e) {
              const float2 sc = b.scales(i, 16 * ch + 8 * n + 2 * c + (e & 1));
              my_shares[((ch * 8) + 4 * n + e) * 32] =
                  scaled_sum(__fadd_rn(lat_hi[n][e], lat_small[n][e]), sc.x, __fadd_rn(rope_hi[n][e], rope_small[n][e]),
                             sc.y);
            }
        } else {
          qk_16keys<kLatentSteps, kSteps>(k_rows + kVDim + 16 * j, kPitch, q, lat_hi, lat_small);
#pragma unroll
          for (int n = 0; n < 2; ++n)
#pragma unroll
            for (int e = 0; e < 4; ++e)
              my_shares[((ch * 8) + 4 * n + e) * 32] = __fadd_rn(lat_hi[n][e], lat_small[n][e]);
        }
      }
    }
    __syncthreads();  // every warp's shares
    if (!active) continue;
    for (int ch = 0; ch < chunks; ++ch) {
      float s[2][4], alpha[2];
#pragma unroll
      for (int n = 0; n < 2; ++n)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const float* share = group_shares + ((ch * 8) + 4 * n + e) * 32;
          float x = share[0];
#pragma unroll
          for (int from = 1; from < kGroupWarps; ++from) x = __fadd_rn(x, share[from * kChunks * 8 * 32]);
          s[n][e] = key0 + 16 * ch + 8 * n + 2 * c + (e & 1) < end ? __fmul_rn(x, a.scale) : -INFINITY;
        }
      online_softmax_step(s, m, l, alpha);  // finite m from chunk 0 of tile 0: it has key b.first
      if constexpr (L::scaled) {
#pragma unroll
        for (int n = 0; n < 2; ++n)
#pragma unroll
          for (int e = 0; e < 4; ++e) s[n][e] = __fmul_rn(s[n][e], b.scales(i, 16 * ch + 8 * n + 2 * c + (e & 1)).x);
      }
      uint32_t pf[kPieces][4];
      p_pieces(s, pf);
      pv_16keys<kOutDims>(rows + 16 * ch * kPitch + kOutDims * j, kPitch, pf, alpha, o);
    }
  }
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    l[r] = __fadd_rn(l[r], __shfl_xor_sync(0xffffffffu, l[r], 1));
    l[r] = __fadd_rn(l[r], __shfl_xor_sync(0xffffffffu, l[r], 2));
  }
  // Lane (g, c) holds heads head0 + g, + 8 (r = 0, 1), columns kOutDims j + 8n + 2c, + 1.
  if (used == 1) {
    if (!active) return;
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      float* const out = a.out + (t * a.q_heads + head0 + g + 8 * r) * kVDim + kOutDims * j + 2 * c;
#pragma unroll
      for (int n = 0; n < kOutDims / 8; ++n)
        *reinterpret_cast<float2*>(out + 8 * n) =
            make_float2(__fdiv_rn(o[n][2 * r], l[r]), __fdiv_rn(o[n][2 * r + 1], l[r]));
    }
    return;
  }
  const auto partial_at = [&](int64_t head, int split) {
    return a.partials + ((unit * a.q_heads + head) * p.splits + split) * p.width;
  };
  if (active) {
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      float* const dst = partial_at(head0 + g + 8 * r, z);
      if (j == 0 && c == 0) {
        dst[0] = m[r];
        dst[1] = l[r];
      }
#pragma unroll
      for (int n = 0; n < kOutDims / 8; ++n)
        *reinterpret_cast<float2*>(dst + 4 + kOutDims * j + 8 * n + 2 * c) = make_float2(o[n][2 * r], o[n][2 * r + 1]);
    }
  }
  // splitk_fold_launch folds the row
}

template <KvDtype T>
void launch(const AttentionArgs& a, const SplitPlan& p, cudaStream_t stream) {
  launch_split<splitk_mla_attention_kernel<T>>(a, p, kThreads, Tile<T>::bytes, stream);
}

}  // namespace

bool splitk_mla_attention_supports(const PagedKvArgs& c, int64_t q_heads) {
  if (c.v != c.k || c.kv_heads != 1 || c.k_dim != kKDim || c.v_dim != kVDim || q_heads <= 0 || q_heads % 16 != 0 ||
      !aligned16(c.k))
    return false;
  if (c.dtype == KvDtype::f32 || c.slot_bytes != kv_slot_layout(paged_kv_layout(c)).bytes) return false;
  return shared_memory_fits(tile_bytes(c.dtype));
}

int64_t splitk_mla_attention_partial_floats(const AttentionArgs& a) {
  return split_partial_floats(a, split_plan(a, kHeads));
}

void splitk_mla_attention_launch(const AttentionArgs& a, cudaStream_t stream) {
  if (a.rows == 0) return;
  const SplitPlan p = split_plan(a, kHeads);
  switch (a.cache.dtype) {
    case KvDtype::bf16: return launch<KvDtype::bf16>(a, p, stream);
    case KvDtype::fp8_e4m3: return launch<KvDtype::fp8_e4m3>(a, p, stream);
    case KvDtype::fp8_e5m2: return launch<KvDtype::fp8_e5m2>(a, p, stream);
    case KvDtype::nvfp4: return launch<KvDtype::nvfp4>(a, p, stream);
    default: return;  // splitk_mla_attention_supports
  }
}

}  // namespace moet::cuda
