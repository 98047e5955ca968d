// Prefill attention on the tensor cores (see prefill_attention.h), launched as a programmatic
// dependent launch (launch.cuh) that waits for the previous kernel before touching memory.
//
// One kernel template (Layout) for both layouts. GQA: a block (4 warps) serves one query tile of
// 64 (row, head) slots, slot s = row * H + head, warp w the 16 slots 16w..16w+15 as the rows of
// its m16n8k16 MMAs (all of a tile's heads share the KV head, so they share every key), key tiles
// of 32. MLA (latent cache: K rows of 576, V = their first 512 floats): a block (8 warps) serves
// 32 slots in two groups of 16; the 4 warps of a group split the columns: warp part p holds Q's
// pieces for k-steps 9p..9p+8 (Q K^T columns 144p..: 108 registers; all 36 would be 432) and O's
// columns 128p.. (64 registers; all 512 would be 256), key tiles of 16 (shared memory: 36 KiB of
// FP32 rows + 55 KiB of pieces + 16 KiB of partial scores). Per key tile, with two barriers:
//   1. the FP32 K (and V) rows (cp.async, issued one key tile ahead, each thread a share of one
//      key's row; block-table entries fetched one key tile before that) are split into BF16
//      pieces in shared memory, [K/V][piece][key][DK + 8] (16-byte rows, the 8 rows of an
//      ldmatrix phase on distinct banks; MLA stages K only, its V fragments come from K's pieces);
//      keys past the tile's last position are zero (V must be: 0 * NaN is NaN);
//   2. S = Q K^T (Q's pieces stay in registers; K fragments by ldmatrix); MLA: each warp's partial
//      scores (hi hi and small products apart) go to shared memory and, after a named barrier of
//      the group's 4 warps, every warp of the group adds the 4 in the order of their parts, so
//      all 4 hold the same S, m and l (the next writes come after the next key tile's
//      __syncthreads); S scaled and causally masked by position in FP32; online softmax: running
//      max m and sum l per row (the 4 lanes of a row: a fixed xor-shuffle tree), O rescaled by
//      exp(m_old - m_new); P = exp(S - m) in registers becomes the A operand of P V (the
//      accumulator layout of S is the A layout of P), V fragments of the warp's columns by
//      ldmatrix.trans; steps 2 run per 16 keys (attend_keys), whose P V is folded into O in FP32.
// O / l at the end. Fixed order everywhere: bit-identical run to run.
//
// Accuracy. An FP32 x is exactly hi + mid + lo (BF16 pieces: hi = bf16(x), mid = bf16(x - hi),
// lo = bf16(x - hi - mid); 24 bits in three 8-bit pieces). A product x y is taken as hi hi +
// (hi mid + mid hi + hi lo + lo hi + mid mid), dropping mid lo, lo mid, lo lo (each below 2^-24 of
// |x y|): FP32-level products, every BF16 product exact in the MMA's FP32 accumulator. Tensor-core
// FP32 accumulation truncates (about 2^-23 of the running sum per MMA), so the hi hi products,
// which carry the magnitude, accumulate apart from the rest (at most 2^-7 of them) and the two are
// added in FP32. P V of 16 keys is one k-step: its six MMAs share a fresh accumulator (five
// truncations of ~2^-23 of it), folded into O with rounded FP32 operations.
// Two pieces (hi + lo: 16 bits, 3 products) are not enough for the CPU tolerance (2e-5 relative
// to max(1, max |out|)): each operand is then off by up to 2^-16, a score by 3 * 2^-16 *
// scale * sum |q_i k_i| (about sqrt(head dim) for normalised heads: ~5e-4, a relative error of
// the weights exp(s - m) and so of the output), and P V by up to 3 * 2^-16 |v| ~ 4.6e-5 |v| for
// rows of few keys. So Q, K, P and V all take three pieces: 6 MMAs per product instead of 3.
#include "kernels/cuda/prefill_attention.h"

#include "formats/kv_codec.h"
#include "kernels/cuda/attention_mma.cuh"
#include "kernels/cuda/cp_async.cuh"
#include "kernels/cuda/launch.cuh"
#include "kernels/cuda/w2_mma.cuh"

#include <cuda_bf16.h>

namespace moet::cuda {
namespace {

constexpr int kSmall = 5;   // the products below hi hi (small_pieces)
constexpr int kMlaKDim = 576, kMlaVDim = 512;

// The two layouts served. GQA: Layout<D, D, false>, separate K and V rows of D floats, 4 warps of
// 16 slots, key tiles of 32. MLA: Layout<576, 512, true>, V the first 512 floats of each K row,
// 2 groups of 16 slots with 4 warps each (a warp: its group's 16 slots, a quarter of Q K^T's
// columns and a quarter of O's), key tiles of 16.
template <int DK_, int DV_, bool Aliased>
struct Layout {
  static constexpr int DK = DK_, DV = DV_;
  static constexpr bool aliased = Aliased;          // V = the first DV floats of each K row
  static constexpr int split = Aliased ? 4 : 1;     // warps sharing a slot group (Q K^T / P V columns)
  static constexpr int groups = Aliased ? 2 : 4;    // slot groups of 16 (MMA rows)
  static constexpr int slots = 16 * groups;         // (row, head) slots of a query tile
  static constexpr int warps = split * groups, threads = 32 * warps;
  static constexpr int keys = Aliased ? 16 : 32;    // keys per key tile
  static constexpr int k_steps = DK / 16 / split;   // k-steps of Q K^T per warp
  static constexpr int v_groups = DV / 16 / split;  // 16-column groups of P V per warp
  static constexpr int operands = Aliased ? 1 : 2;  // rows staged per key: K (and V)
  static constexpr int copy_lanes = threads / keys; // threads staging one key's rows
  static constexpr int pitch = DK + 8;              // BF16 per staged piece row
  static constexpr int stage_floats = operands * keys * DK;  // FP32 K rows (then V rows)
  static constexpr int piece_elems = keys * pitch;           // one piece of K or of V
  static constexpr int exchange_floats = split > 1 ? warps * 32 * 16 : 0;  // partial scores
  static constexpr size_t bytes = sizeof(float) * stage_floats + sizeof(__nv_bfloat16) * operands * kPieces * piece_elems +
                                  sizeof(float) * exchange_floats;
  static_assert(DK % (16 * split) == 0 && DV % (16 * split) == 0 && DV <= DK, "whole k-steps and column groups per warp");
  static_assert(Aliased || DK == DV, "separate K and V rows of one width");
  static_assert(threads % keys == 0 && (DK / 4) % copy_lanes == 0, "each thread stages whole float4s of one key");
  static_assert(stage_floats % (4 * threads) == 0, "the split into pieces takes whole float4s per thread");
  static_assert(split == 1 || keys == 16, "one exchange of partial scores per key tile");
  static_assert(keys % 16 == 0, "whole 16-key steps");
};
using Mla = Layout<kMlaKDim, kMlaVDim, true>;

bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15) == 0; }

// The `count` threads of named barrier `id` (not 0: __syncthreads' barrier).
__device__ __forceinline__ void named_barrier(int id, int count) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(count) : "memory");
}

// Product i of the small ones: its A piece (operand 0) or B piece (operand 1).
__device__ constexpr int small_piece(int i, int operand) {
  constexpr int pieces[kSmall][2] = {{0, 1}, {1, 0}, {0, 2}, {2, 0}, {1, 1}};
  return pieces[i][operand];
}

// hi[n] += A.hi B.hi and small[n] += the other products, for n-tiles n0 and n0 + 1 whose B
// fragments (per piece) are b[piece][2 * (n - n0) .. + 1]; A per piece.
__device__ __forceinline__ void mma_pieces(float (&hi)[4], float (&small)[4], const uint32_t (&a)[kPieces][4],
                                           const uint32_t (&b)[kPieces][4], int half) {
  mma_bf16_16816(hi, a[0][0], a[0][1], a[0][2], a[0][3], b[0][2 * half], b[0][2 * half + 1]);
#pragma unroll
  for (int i = 0; i < kSmall; ++i) {
    const int pa = small_piece(i, 0), pb = small_piece(i, 1);
    mma_bf16_16816(small, a[pa][0], a[pa][1], a[pa][2], a[pa][3], b[pb][2 * half], b[pb][2 * half + 1]);
  }
}

// Partial scores of the 16 staged keys sub.. over this warp's k-steps first_step.. of Q K^T (two
// n-tiles of 8 keys; one ldmatrix.x4 per piece and k-step): hi hi products in s_hi, the rest in
// s_small.
template <class L>
__device__ __forceinline__ void partial_scores(const __nv_bfloat16* k_pieces, int sub, int first_step,
                                               const uint32_t (&q)[L::k_steps][kPieces][4], float (&s_hi)[2][4],
                                               float (&s_small)[2][4]) {
  const int lane = int(threadIdx.x) & 31;
#pragma unroll
  for (int ks = 0; ks < L::k_steps; ++ks) {
    uint32_t kb[kPieces][4];
    const int key = sub + (lane & 7) + 8 * (lane >> 4), d = 16 * (first_step + ks) + 8 * ((lane >> 3) & 1);
#pragma unroll
    for (int p = 0; p < kPieces; ++p) ldmatrix_x4<false>(kb[p], k_pieces + p * L::piece_elems + key * L::pitch + d);
#pragma unroll
    for (int half = 0; half < 2; ++half) mma_pieces(s_hi[half], s_small[half], q[ks], kb, half);
  }
}

// Online softmax over the 16 staged keys first_key.. (pieces rows `sub`..), this warp's share of
// the slot group's work: the scaled, causally masked scores S = Q K^T (the warps of a group add
// their partial scores through shared memory in a fixed order, so all of them hold the same S),
// the rows' new maxima m (the 4 lanes of a row: an xor-shuffle tree), this lane's share l of the
// sums, P = exp(S - m) as the A operand of P V (S's accumulator layout is P's A layout) and O = O *
// exp(m_old - m) + P V over this warp's output columns, 16 (two n-tiles, one ldmatrix.x4.trans per
// piece) at a time.
template <class L>
__device__ __forceinline__ void attend_keys(const __nv_bfloat16* k_pieces, const __nv_bfloat16* v_pieces,
                                            float4* exchange, int sub, int first_key, const int (&position)[2],
                                            float scale, const uint32_t (&q)[L::k_steps][kPieces][4],
                                            float (&o)[2 * L::v_groups][4], float (&m)[2], float (&l)[2]) {
  const int warp = int(threadIdx.x) >> 5, lane = int(threadIdx.x) & 31, c = lane & 3;
  const int part = warp % L::split, group = warp / L::split;
  float s_hi[2][4] = {}, s_small[2][4] = {};
  partial_scores<L>(k_pieces, sub, part * L::k_steps, q, s_hi, s_small);
  if constexpr (L::split > 1) {
    // Lane `lane`'s float4s of warp w at exchange[(4 w + j) * 32 + lane]: s_hi[0], s_hi[1],
    // s_small[0], s_small[1]. The group's warps sum them in the order of their parts.
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const float(&v)[4] = j < 2 ? s_hi[j & 1] : s_small[j & 1];
      exchange[(4 * warp + j) * 32 + lane] = make_float4(v[0], v[1], v[2], v[3]);
    }
    named_barrier(1 + group, 32 * L::split);
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      float(&v)[4] = j < 2 ? s_hi[j & 1] : s_small[j & 1];
#pragma unroll
      for (int p = 0; p < L::split; ++p) {
        const float4 x = exchange[(4 * (group * L::split + p) + j) * 32 + lane];
        if (p == 0) {
          v[0] = x.x, v[1] = x.y, v[2] = x.z, v[3] = x.w;
        } else {
          v[0] = __fadd_rn(v[0], x.x), v[1] = __fadd_rn(v[1], x.y), v[2] = __fadd_rn(v[2], x.z),
          v[3] = __fadd_rn(v[3], x.w);
        }
      }
    }
    // The next writes come after the next key tile's __syncthreads: every read is done by then.
  }

#pragma unroll
  for (int n = 0; n < 2; ++n)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const float s = __fmul_rn(__fadd_rn(s_hi[n][e], s_small[n][e]), scale);
      s_hi[n][e] = first_key + 8 * n + 2 * c + (e & 1) <= position[e >> 1] ? s : -INFINITY;
    }
  float alpha[2];
  online_softmax_step(s_hi, m, l, alpha);  // finite m: every row sees key 0
  uint32_t pf[kPieces][4];
  p_pieces(s_hi, pf);

#pragma unroll
  for (int vg = 0; vg < L::v_groups; ++vg) {
    float t[2][4] = {};  // one k-step: its 6 MMAs may share the accumulator
    uint32_t vb[kPieces][4];
    const int key = sub + (lane & 15), d = 16 * (part * L::v_groups + vg) + 8 * (lane >> 4);
#pragma unroll
    for (int p = 0; p < kPieces; ++p) ldmatrix_x4<true>(vb[p], v_pieces + p * L::piece_elems + key * L::pitch + d);
#pragma unroll
    for (int half = 0; half < 2; ++half) mma_pieces(t[half], t[half], pf, vb, half);
#pragma unroll
    for (int half = 0; half < 2; ++half) rescale_add(o[2 * vg + half], t[half], alpha);
  }
}

// D: the cache's dtype (its rows are decoded into the FP32 stage unless F32).
template <class L, KvDtype D>
__global__ void __launch_bounds__(L::threads, 1) prefill_attention_kernel(AttentionArgs a, const PrefillTile* tiles,
                                                                         int heads) {
  constexpr int DK = L::DK, DV = L::DV, kKeys = L::keys, kThreads = L::threads;
  extern __shared__ float4 shared4[];
  float* const stage = reinterpret_cast<float*>(shared4);
  __nv_bfloat16* const pieces = reinterpret_cast<__nv_bfloat16*>(stage + L::stage_floats);
  const __nv_bfloat16* const v_pieces = pieces + (L::aliased ? 0 : kPieces * L::piece_elems);
  float4* const exchange = reinterpret_cast<float4*>(pieces + L::operands * kPieces * L::piece_elems);
  pdl_trigger();
  pdl_wait();  // the tiles, q and the KV cache come from the previous copies and kernels
  const PrefillTile tile = tiles[blockIdx.x];
  const int warp = int(threadIdx.x) >> 5, lane = int(threadIdx.x) & 31, g = lane >> 2, c = lane & 3;
  const int part = warp % L::split, group = warp / L::split;  // slots 16 group.., columns share `part`
  const int64_t head0 = int64_t(blockIdx.y) * heads, kv_head = head0 / (a.q_heads / a.cache.kv_heads);

  // This lane's two slots (MMA rows g and g + 8): tile row, query head. Slots past the tile's
  // rows compute its last row again and store nothing.
  const auto tile_row = [&](int i) { return min((16 * group + g + 8 * i) / heads, tile.rows - 1); };
  const auto query_head = [&](int i) { return head0 + (16 * group + g + 8 * i) % heads; };
  const int position[2] = {tile.first_position + tile_row(0), tile.first_position + tile_row(1)};

  // Q's A fragments for each of this warp's k-steps, split into pieces.
  uint32_t q[L::k_steps][kPieces][4];
  {
    const float* q_row[2] = {a.q + ((tile.first_row + tile_row(0)) * a.q_heads + query_head(0)) * a.q_stride,
                             a.q + ((tile.first_row + tile_row(1)) * a.q_heads + query_head(1)) * a.q_stride};
#pragma unroll
    for (int ks = 0; ks < L::k_steps; ++ks)
#pragma unroll
      for (int reg = 0; reg < 4; ++reg) {  // a0: row g, a1: row g + 8, a2 / a3: columns + 8
        const float* src = q_row[reg & 1] + 16 * (part * L::k_steps + ks) + 8 * (reg >> 1) + 2 * c;
        uint32_t split[kPieces];
        split_pair(src[0], src[1], split);
#pragma unroll
        for (int p = 0; p < kPieces; ++p) q[ks][p][reg] = split[p];
      }
  }

  // Staging: this thread copies float4s copy_part, copy_part + copy_lanes, ... of key `stage_key`
  // of each key tile (of its K row, and of its V row).
  const int keys = tile.first_position + tile.rows, key_tiles = (keys + kKeys - 1) / kKeys;
  const int stage_key = int(threadIdx.x) / L::copy_lanes, copy_part = int(threadIdx.x) % L::copy_lanes;
  const int32_t* table = a.block_tables + int64_t(tile.seq) * a.table_stride;
  const int block_size = int(a.cache.block_size);
  const auto block_of = [&](int kt) {
    const int key = kt * kKeys + stage_key;
    return key < keys ? table[key / block_size] : 0;
  };
  KvLayout layout = paged_kv_layout(a.cache);
  layout.dtype = D;  // lets the compiler drop the other dtypes' decoders
  const auto issue = [&](int kt, int32_t block) {
    const int key = kt * kKeys + stage_key;
    float* k_dst = stage + stage_key * DK;
    if (key < keys) {
      const int64_t offset = (int64_t(block) * block_size + key % block_size) * a.cache.slot_bytes;
      if constexpr (D == KvDtype::f32) {
        const float* k_src = reinterpret_cast<const float*>(a.cache.k + offset) + kv_head * DK;
        const float* v_src = reinterpret_cast<const float*>(a.cache.v + offset) + kv_head * DK;
#pragma unroll
        for (int f = copy_part; f < DK / 4; f += L::copy_lanes) {
          cp_async16(k_dst + 4 * f, k_src + 4 * f);
          if constexpr (!L::aliased) cp_async16(k_dst + kKeys * DK + 4 * f, v_src + 4 * f);
        }
      } else {  // decoded into the same FP32 stage (plain stores, published by the barrier)
        const int first = int(kv_head * DK);
        const KvSlotLayout slot = kv_slot_layout(layout);
#pragma unroll 1
        for (int f = copy_part; f < DK / 4; f += L::copy_lanes) {
          kv_slot_value4(layout, slot, a.cache.k + offset, first + 4 * f, k_dst + 4 * f);
          if constexpr (!L::aliased)
            kv_slot_value4(layout, slot, a.cache.v + offset, first + 4 * f, k_dst + kKeys * DK + 4 * f);
        }
      }
    } else {
#pragma unroll
      for (int f = copy_part; f < DK / 4; f += L::copy_lanes) {
        reinterpret_cast<float4*>(k_dst)[f] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        if constexpr (!L::aliased) reinterpret_cast<float4*>(k_dst + kKeys * DK)[f] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
      }
    }
    cp_async_commit();
  };
  issue(0, block_of(0));
  int32_t next_block = key_tiles > 1 ? block_of(1) : 0;

  float o[2 * L::v_groups][4] = {};      // output n-tiles of 8 columns
  float m[2] = {-INFINITY, -INFINITY};    // running max of rows g, g + 8
  float l[2] = {0.0f, 0.0f};              // this lane's share of the running sums
  for (int kt = 0; kt < key_tiles; ++kt) {
    cp_async_wait_all();
    __syncthreads();  // key tile kt's rows have landed; every warp is done with the previous pieces
#pragma unroll
    for (int i = 0; i < L::stage_floats / 4 / kThreads; ++i) {  // split into pieces
      const int f = int(threadIdx.x) + i * kThreads, which = f / (kKeys * DK / 4), within = f % (kKeys * DK / 4);
      const int key = within / (DK / 4), d = 4 * (within % (DK / 4));
      const float4 x = shared4[f];
      uint32_t xy[kPieces], zw[kPieces];
      split_pair(x.x, x.y, xy);
      split_pair(x.z, x.w, zw);
#pragma unroll
      for (int p = 0; p < kPieces; ++p)
        *reinterpret_cast<uint2*>(pieces + (which * kPieces + p) * L::piece_elems + key * L::pitch + d) =
            make_uint2(xy[p], zw[p]);
    }
    __syncthreads();  // the pieces are ready, the stage is free
    if (kt + 1 < key_tiles) {
      issue(kt + 1, next_block);
      if (kt + 2 < key_tiles) next_block = block_of(kt + 2);
    }

#pragma unroll 1
    for (int sub = 0; sub < kKeys; sub += 16)
      attend_keys<L>(pieces, v_pieces, exchange, sub, kt * kKeys + sub, position, a.scale, q, o, m, l);
  }

#pragma unroll
  for (int i = 0; i < 2; ++i) {
    l[i] = __fadd_rn(l[i], __shfl_xor_sync(0xffffffffu, l[i], 1));
    l[i] = __fadd_rn(l[i], __shfl_xor_sync(0xffffffffu, l[i], 2));
  }
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    if ((16 * group + g + 8 * i) / heads >= tile.rows) continue;
    float* out = a.out + ((tile.first_row + tile_row(i)) * a.q_heads + query_head(i)) * DV +
                 16 * part * L::v_groups + 2 * c;
#pragma unroll
    for (int n = 0; n < 2 * L::v_groups; ++n)
      *reinterpret_cast<float2*>(out + 8 * n) =
          make_float2(__fdiv_rn(o[n][2 * i], l[i]), __fdiv_rn(o[n][2 * i + 1], l[i]));
  }
}

template <class L, KvDtype D>
void launch(const AttentionArgs& a, const PrefillTile* tiles, int64_t tile_count, int heads, cudaStream_t stream) {
  static_assert(L::aliased || L::slots == kPrefillSlots, "prefill_attention_slots");
  static const cudaError_t opt_in = cudaFuncSetAttribute(prefill_attention_kernel<L, D>,
                                                         cudaFuncAttributeMaxDynamicSharedMemorySize, int(L::bytes));
  (void)opt_in;
  launch_dependent_kernel<prefill_attention_kernel<L, D>>(dim3(unsigned(tile_count), unsigned(a.q_heads / heads)),
                                                         dim3(L::threads), L::bytes, 1, stream, a, tiles, heads);
}

// launch<L, the cache's dtype> (nvfp4 only for MLA: prefill_attention_supports).
template <class L>
void launch_dtype(const AttentionArgs& a, const PrefillTile* tiles, int64_t tile_count, int heads,
                  cudaStream_t stream) {
  switch (a.cache.dtype) {
    case KvDtype::f32: return launch<L, KvDtype::f32>(a, tiles, tile_count, heads, stream);
    case KvDtype::bf16: return launch<L, KvDtype::bf16>(a, tiles, tile_count, heads, stream);
    case KvDtype::fp8_e4m3: return launch<L, KvDtype::fp8_e4m3>(a, tiles, tile_count, heads, stream);
    case KvDtype::fp8_e5m2: return launch<L, KvDtype::fp8_e5m2>(a, tiles, tile_count, heads, stream);
    case KvDtype::nvfp4:
      if constexpr (L::aliased) return launch<L, KvDtype::nvfp4>(a, tiles, tile_count, heads, stream);
      return;
  }
}

bool is_mla(const PagedKvArgs& cache) { return cache.v == cache.k; }

}  // namespace

bool prefill_attention_supports(const PagedKvArgs& cache, int64_t q_heads) {
  if (cache.kv_heads <= 0 || q_heads % cache.kv_heads != 0 || cache.slot_bytes % 16 != 0 || !aligned16(cache.k) ||
      !aligned16(cache.v))
    return false;
  if (!is_mla(cache))
    return cache.dtype != KvDtype::nvfp4 && cache.k_dim == cache.v_dim && (cache.k_dim == 64 || cache.k_dim == 128);
  if (cache.k_dim != kMlaKDim || cache.v_dim != kMlaVDim || cache.kv_heads != 1 || q_heads % 16 != 0) return false;
  // Its shared memory (107 KiB) is more than some GPUs give a block (sm_120: 99 KiB).
  int device = 0, shared = 0;
  return cudaGetDevice(&device) == cudaSuccess &&
         cudaDeviceGetAttribute(&shared, cudaDevAttrMaxSharedMemoryPerBlockOptin, device) == cudaSuccess &&
         size_t(shared) >= Mla::bytes;
}

int64_t prefill_attention_slots(const PagedKvArgs& cache) { return is_mla(cache) ? Mla::slots : kPrefillSlots; }

int64_t prefill_attention_heads(const PagedKvArgs& cache, int64_t q_heads) {
  const int64_t group = q_heads / cache.kv_heads, slots = prefill_attention_slots(cache);
  int64_t heads = 1;
  while (heads < slots && group % (2 * heads) == 0) heads *= 2;
  return heads;
}

void prefill_attention_launch(const AttentionArgs& a, const PrefillTile* tiles, int64_t tile_count,
                              cudaStream_t stream) {
  if (tile_count == 0) return;
  const int heads = int(prefill_attention_heads(a.cache, a.q_heads));
  if (is_mla(a.cache)) {
    launch_dtype<Mla>(a, tiles, tile_count, heads, stream);
  } else if (a.cache.k_dim == 64) {
    launch_dtype<Layout<64, 64, false>>(a, tiles, tile_count, heads, stream);
  } else {
    launch_dtype<Layout<128, 128, false>>(a, tiles, tile_count, heads, stream);
  }
}

}  // namespace moet::cuda
