// The view of one layer's paged KV cache that attention kernels read and write, and the per-row
// sequence information they need; plain pointers and byte strides, so kernels (CPU and CUDA: this
// header is C++17), backends and the KV module (kv/, which owns the memory) share it without
// depending on each other.
// The cache is a pool of blocks of `block_size` token slots; a sequence owns a block table
// (logical block -> physical block). A slot holds `kv_heads` heads of k_dim (K) / v_dim (V)
// values in the cache's dtype, `slot_bytes` apart; V may alias K (MLA latent cache, where V is the
// first v_dim values of the K row). What a slot's bytes are for each dtype (docs/kv.md):
//   f32 / bf16  the values, head after head;
//   fp8_e4m3 /  the codes (one byte per value, head after head), then from scale_offset one F32
//   fp8_e5m2    scale per group: a GQA slot's groups are its heads, a latent row's are its value
//               prefix [0, v_dim) and the rest [v_dim, k_dim) (MLA's rope key); value = code * scale;
//   nvfp4       latent rows only: v_dim e2m1 nibbles (two per byte, even index in the low nibble),
//               then the k_dim - v_dim rope values as e4m3 (no scale), then from scale_offset one
//               e4m3 scale per 16 nibbles; DeepSeek-V3's 512 + 64: 256 + 64 + 32 = 352 bytes.
// Every slot is rounded up to 16 bytes (vector loads on the GPU). formats/kv_codec.h encodes and
// decodes these slots.
#pragma once

#include <cstdint>

// Functions both the host and CUDA kernels call (this header is C++17 for nvcc).
#if defined(__CUDACC__)
#define MOET_HOST_DEVICE __host__ __device__
#else
#define MOET_HOST_DEVICE
#endif

namespace moet {

enum class KvDtype : uint8_t { f32, bf16, fp8_e4m3, fp8_e5m2, nvfp4 };

constexpr int64_t kKvSlotAlign = 16;    // bytes a slot is rounded up to
constexpr int64_t kKvNvfp4Block = 16;   // nibbles per e4m3 scale (nvfp4)

// What one layer's cache holds per token slot; the backend allocates from it (Backend::alloc_kv).
struct KvLayout {
  KvDtype dtype = KvDtype::f32;
  int64_t kv_heads = 0;
  int64_t k_dim = 0;          // per head
  int64_t v_dim = 0;          // per head (latent: the prefix of K that is V)
  bool v_aliases_k = false;   // MLA's latent row (kv_heads 1)
  float k_scale = 0.0f;       // fp8: fixed per-tensor scales (a checkpoint's k_scale / v_scale);
  float v_scale = 0.0f;       // 0: each group's scale from its own values when written
};

// Where things sit in one slot of K (or of V: a separate V cache has K's shape).
struct KvSlotLayout {
  int64_t values = 0;        // values a slot holds (kv_heads * k_dim)
  int64_t groups = 0;        // fp8: scales per slot; nvfp4: e4m3 scales per slot
  int64_t rope_offset = 0;   // nvfp4: byte offset of the e4m3 rope values
  int64_t scale_offset = 0;  // fp8 / nvfp4: byte offset of the scales
  int64_t bytes = 0;         // bytes per slot, rounded up to kKvSlotAlign
};

MOET_HOST_DEVICE constexpr int64_t kv_round_up(int64_t n, int64_t to) { return (n + to - 1) / to * to; }

// The slot layout of `layout`'s K cache (V's when separate is the same). Assumes a valid layout
// (kv/kv_cache.h checks: nvfp4 only for latent rows whose v_dim is a multiple of 16).
MOET_HOST_DEVICE constexpr KvSlotLayout kv_slot_layout(const KvLayout& layout) {
  KvSlotLayout s{};
  s.values = layout.kv_heads * layout.k_dim;
  switch (layout.dtype) {
    case KvDtype::f32: s.bytes = 4 * s.values; break;
    case KvDtype::bf16: s.bytes = 2 * s.values; break;
    case KvDtype::fp8_e4m3:
    case KvDtype::fp8_e5m2:
      s.groups = layout.v_aliases_k ? (layout.k_dim > layout.v_dim ? 2 : 1) : layout.kv_heads;
      s.scale_offset = kv_round_up(s.values, 4);
      s.bytes = s.scale_offset + 4 * s.groups;
      break;
    case KvDtype::nvfp4:
      s.groups = layout.v_dim / kKvNvfp4Block;
      s.rope_offset = layout.v_dim / 2;
      s.scale_offset = s.rope_offset + (layout.k_dim - layout.v_dim);
      s.bytes = s.scale_offset + s.groups;
      break;
  }
  s.bytes = kv_round_up(s.bytes, kKvSlotAlign);
  return s;
}

struct PagedKv {
  uint8_t* k;              // [blocks * block_size] slots of slot_bytes
  uint8_t* v;              // same layout; may equal k
  KvDtype dtype;
  int64_t block_size;
  int64_t kv_heads;
  int64_t k_dim;
  int64_t v_dim;
  int64_t slot_bytes;      // bytes between consecutive slots (of k and of v)
  float k_scale, v_scale;  // KvLayout's (read by the writes only: a slot carries its scales)
};

// The view of a cache of `layout` over memory k (and v, k itself when V aliases K).
MOET_HOST_DEVICE constexpr PagedKv paged_kv_view(const KvLayout& layout, uint8_t* k, uint8_t* v, int64_t block_size) {
  return {k, layout.v_aliases_k ? k : v, layout.dtype, block_size, layout.kv_heads, layout.k_dim, layout.v_dim,
          kv_slot_layout(layout).bytes, layout.k_scale, layout.v_scale};
}

// The layout a view was made from.
MOET_HOST_DEVICE constexpr KvLayout paged_kv_layout(const PagedKv& c) {
  return {c.dtype, c.kv_heads, c.k_dim, c.v_dim, c.v == c.k, c.k_scale, c.v_scale};
}

struct AttentionRows {
  const int32_t* positions;       // [rows] position of each query row in its sequence
  const int32_t* row_seq;         // [rows] sequence index of each query row
  const int32_t* const* block_tables;  // [sequences] physical block ids
};

}  // namespace moet
