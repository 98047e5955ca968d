// Causal attention over a paged KV cache (FP32 cache, FP32 math), for prefill and decode alike.
// The cache is a pool of blocks of `block_size` token slots; a sequence owns a block table
// (logical block -> physical block). Each query row t belongs to one sequence and sees that
// sequence's keys at positions 0..positions[t]. Keys and values of a slot are `kv_heads` heads
// of k_dim / v_dim floats, `token_stride` floats per slot; V may alias K (MLA latent cache,
// where V is the first v_dim floats of K). Query head h reads kv head h / (q_heads / kv_heads).
// Rows are independent; each is computed by one thread with a fixed order (deterministic).
#pragma once

#include "core/thread_pool.h"

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

// Writes k_src / v_src rows ([rows, kv_heads * dim]) into cache slots slot[t] (physical slot
// = block * block_size + offset). v_src may be null when V aliases K.
void kv_cache_write(const PagedKv& cache, const float* k_src, const float* v_src, int64_t rows,
                    const int64_t* slots);

// q: [rows, q_heads, q_stride] (first k_dim floats of each head are used);
// out: [rows, q_heads, v_dim].
void attention_paged(const PagedKv& cache, const AttentionRows& rows_info, const float* q,
                     int64_t rows, int64_t q_heads, int64_t q_stride, float scale, float* out,
                     ThreadPool& pool);

}  // namespace moet
