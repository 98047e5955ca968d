// GPU kernels of the GLM-5 / DeepSeek-V4 ops, with the semantics of their CPU references:
// kernels/cpu/sparse_attention.h (attention_gather, indexer_topk), kv_compress.h,
// hyper_connection.h, rope.h (pairs in place, inverse), elementwise.h (LayerNorm, the SwiGLU
// clamp), router.h (hash routing). Written for correctness first: one block per row (and head),
// reductions over fixed trees (run-to-run bit-identical), online softmax in attention_gather (so
// its results agree with the CPU's two-pass softmax to FP32 rounding, not bit for bit). Every
// per-step value comes from device memory (positions, row -> sequence, block tables): capturable.
// None of these has run on a GPU yet: tests/cpp/cuda/cuda_sparse_ops_test.cpp compares each with
// the CPU backend, and the families stay refused on --device cuda until it has passed.
#pragma once

#include "kernels/cuda/attention.h"
#include "kernels/cuda/head_norm_rope.h"

#include <cuda_runtime_api.h>

#include <cstdint>

namespace moet::cuda {

// The step's per-row inputs as the kernels read them (device memory).
struct StepRowsArgs {
  const int32_t* positions;
  const int32_t* row_seq;
  const int32_t* block_tables;  // [sequences, table_stride]
  int64_t table_stride;
  int64_t rows;
};

constexpr int kMaxKeySources = 4;
struct KeySourceArgs {
  PagedKvArgs cache;
  const int32_t* positions;  // [rows, width] or null (then window / stride)
  int64_t width, window, stride;
};
struct GatherArgs {
  KeySourceArgs sources[kMaxKeySources];
  int count;
  const float* q;  // [rows, q_heads, q_stride]
  int64_t q_heads, q_stride;
  float scale;
  const float* sinks;  // [q_heads] or null
  float* out;          // [rows, q_heads, v_dim]
};
void attention_gather_launch(const GatherArgs& a, const StepRowsArgs& rows, cudaStream_t stream);

// scores: rows * max_candidates floats of scratch (max_candidates >= the most candidates a row has).
struct IndexerArgs {
  PagedKvArgs keys;
  const float* q;        // [rows, heads, keys.k_dim]
  const float* weights;  // [rows, heads]
  int64_t heads;
  float scale;
  int64_t stride, k;
  int32_t* out;  // [rows, k]
  float* scores;
  int64_t max_candidates;
};
void indexer_topk_launch(const IndexerArgs& a, const StepRowsArgs& rows, cudaStream_t stream);

struct CompressArgs {
  PagedKvArgs state, out;
  int64_t ratio, dim;
  bool overlap;
  float eps;
  const float* position_bias;  // [ratio, coff * dim]
  const float* norm;           // [dim]
  RopeArgs rope;               // pairs rotated in place on the last 2 * pairs values
};
void kv_compress_launch(const CompressArgs& a, const StepRowsArgs& rows, cudaStream_t stream);

constexpr int kMaxHyperStreams = 8;
struct HyperArgs {
  int64_t hc, dim, iters;
  float eps, norm_eps;
  const float* fn;
  const float* base;
  const float* scale;
};
void hc_pre_launch(const HyperArgs& a, const float* streams, int64_t rows, float* post, float* comb, float* collapsed,
                   cudaStream_t stream);
void hc_post_launch(const HyperArgs& a, float* streams, int64_t rows, const float* block_out, const float* post,
                    const float* comb, cudaStream_t stream);
void hc_head_launch(const HyperArgs& a, const float* streams, int64_t rows, float* out, cudaStream_t stream);

// rope_apply of kernels/cpu/rope.h with every mode (halves, interleaved de-interleaved, pairs in
// place) and the inverse rotation: x [rows, heads, row_stride], heads head_stride apart.
void rope_rotate_launch(const RopeArgs& rope, bool pairs_in_place, bool inverse, float* x, int64_t rows,
                        int64_t heads, int64_t row_stride, int64_t head_stride, int64_t offset,
                        const int32_t* positions, cudaStream_t stream);
void layernorm_launch(const float* x, int64_t rows, int64_t dim, const float* weight, const float* bias, float eps,
                      float* out, cudaStream_t stream);
void silu_mul_clamped_launch(const float* gate_up, int64_t rows, int64_t inner, float limit, float* out,
                             cudaStream_t stream);
// Hash routing: experts from table [vocab, top_k] at tokens[t], weights from sqrtsoftplus(logits).
void router_hash_launch(const float* logits, int64_t rows, int64_t experts, int64_t top_k, const int32_t* tokens,
                        const int32_t* table, int64_t vocab, bool normalize, float scaling, int32_t* expert_ids,
                        float* weights, cudaStream_t stream);

}  // namespace moet::cuda
