// The view of one layer's paged KV cache that attention kernels read and write, and the per-row
// sequence information they need; plain pointers and strides, so kernels, backends and the KV
// module (kv/, which owns the memory) share it without depending on each other.
// The cache is a pool of blocks of `block_size` token slots; a sequence owns a block table
// (logical block -> physical block). Keys and values of a slot are `kv_heads` heads of k_dim /
// v_dim floats, `token_stride` floats per slot; V may alias K (MLA latent cache, where V is the
// first v_dim floats of K).
#pragma once

#include <cstdint>

namespace moet {

struct PagedKv {
  float* k;                // [blocks * block_size, token_stride]
  float* v;                // same layout; may equal k
  int64_t block_size;
  int64_t kv_heads;
  int64_t k_dim;
  int64_t v_dim;
  int64_t token_stride;    // floats between consecutive slots (of k and of v)
};

struct AttentionRows {
  const int32_t* positions;       // [rows] position of each query row in its sequence
  const int32_t* row_seq;         // [rows] sequence index of each query row
  const int32_t* const* block_tables;  // [sequences] physical block ids
};

}  // namespace moet
