// Paged causal attention on the GPU, for prefill and decode rows alike, GQA and MLA (V aliasing
// K: the latent cache), with the semantics of kernels/cpu/attention.h: query row t, head h sees
// keys 0..positions[t] of its sequence through the block table.
//
// Flash-decoding style, with nothing sized by a host-side key count (so a captured CUDA graph
// stays valid as contexts grow): each row reads its key count from positions[t] on the device.
// Keys are cut into segments of kAttentionSegment; a segment is processed in chunks of 128 keys
// with an online softmax (scores of a chunk in shared memory, running maximum, rescaled sums),
// giving a partial (max m, sum l, unnormalised output o). The partials of a row's segments are
// then folded in segment order (M = max, L and O rescaled and added) and out = O / L. Either one
// block per (row, head) loops over the segments, or (split mode, for decode-sized steps) one block
// per (row, head, segment) writes its partial and a combine kernel folds them: the arithmetic is
// the same function in the same order (explicitly rounded operations, no contraction freedom), so
// both modes give the same bits, and a row's result never depends on the other rows of the step
// or on the mode. Reductions use fixed trees: bit-identical run to run. Shared memory is fixed
// (~6 KiB: the query, one chunk's scores and slot offsets). Also the KV write of a step's rows.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace moet::cuda {

constexpr int64_t kAttentionSegment = 1024;  // keys per segment (a multiple of the 128-key chunk)
constexpr int64_t kAttentionMaxKDim = 1024;  // floats of a query/key head (MLA: 576)
constexpr int64_t kAttentionMaxVDim = 512;   // floats of a value head (MLA latent: 512)

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
  // Split mode when not null: [rows, q_heads, splits, v_dim + 2] partials (m, l, o[v_dim]);
  // `splits` >= the segment count of every row (blocks past a row's count exit at once).
  float* partials;
  int64_t splits;
};

// Segments a row with up to `max_keys` keys needs.
inline int64_t attention_segments(int64_t max_keys) { return (max_keys + kAttentionSegment - 1) / kAttentionSegment; }
// The launcher's choice (results are the same either way): split when a row can have more than
// one segment and the step has too few (row, head) pairs to fill the GPU on its own.
inline bool attention_use_split(int64_t rows, int64_t q_heads, int64_t segments) {
  return segments > 1 && rows * q_heads < 256;
}
inline int64_t attention_partial_floats(int64_t rows, int64_t q_heads, int64_t splits, int64_t v_dim) {
  return rows * q_heads * splits * (v_dim + 2);
}

void attention_launch(const AttentionArgs& a, cudaStream_t stream);

// cache slot slots[t] <- row t of k (and of v when v is not null); rows of kv_heads * dim floats.
void kv_write_launch(const PagedKvArgs& cache, const float* k, const float* v, const int64_t* slots,
                     int64_t rows, cudaStream_t stream);

}  // namespace moet::cuda
