// Paged causal attention on the GPU, for prefill and decode rows alike, GQA and MLA (V aliasing
// K: the latent cache), with the semantics of kernels/cpu/attention.h: query row t, head h sees
// keys 0..positions[t] of its sequence through the block table. One block per (row, head):
// scores in shared memory, softmax with the maximum subtracted, then the weighted sum of values
// in key order; reductions use fixed trees, so results are bit-identical run to run.
// Also the KV write of a step's rows into their slots.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace moet::cuda {

struct PagedKvArgs {
  float* k;
  float* v;  // may equal k
  int64_t block_size, kv_heads, k_dim, v_dim, token_stride;
};

struct AttentionArgs {
  PagedKvArgs cache;
  const int32_t* positions;     // [rows]
  const int32_t* row_seq;       // [rows]
  const int32_t* block_tables;  // [sequences, table_stride]
  int64_t table_stride;
  const float* q;               // [rows, q_heads, q_stride]
  int64_t rows, q_heads, q_stride;
  float scale;
  float* out;                   // [rows, q_heads, v_dim]
  int64_t max_keys;             // >= positions[t] + 1 for every row (sizes shared memory)
};

// Shared memory one block needs; callers check it against attention_max_shared_bytes().
size_t attention_shared_bytes(const AttentionArgs& a);
size_t attention_max_shared_bytes();
void attention_launch(const AttentionArgs& a, cudaStream_t stream);

// cache slot slots[t] <- row t of k (and of v when v is not null); rows of kv_heads * dim floats.
void kv_write_launch(const PagedKvArgs& cache, const float* k, const float* v, const int64_t* slots,
                     int64_t rows, cudaStream_t stream);

}  // namespace moet::cuda
