// Attention over chosen keys, and the lightning indexer that chooses them (DeepSeek Sparse
// Attention: GLM-5's DSA and DeepSeek-V4's compressed attention).
//
// attention_gather: query row t attends to the union of its keys from one or more KeySources,
// each a paged cache read through the row's block table: either the positions a list names
// (the indexer's choice; -1 entries are skipped), or every position j <= positions[t] with
// (j + 1) % stride == 0 and j > positions[t] - window (window 0: no limit; stride 1, window 0 is
// plain causal attention, and then the result is bit-identical to attention_paged: same scores,
// same order, same sums). Keys are taken source by source, in list order within a source. With
// per-head sinks (DeepSeek-V4) the softmax denominator has one more term exp(sink[h] - max) whose
// value contributes nothing (gpt-oss's sink). Every source has the same kv_heads, k_dim and
// v_dim; out is [rows, q_heads, v_dim].
//
// indexer_topk: for row t, every candidate key j of `keys` (j <= positions[t], (j + 1) % stride
// == 0) is scored sum_h weights[t, h] * relu(scale * q[t, h] . k_j), and out[t] lists the
// positions of the best min(k, candidates) in ascending order (ties to the lower position), -1
// after them. A row with at most k candidates takes them all without scoring (what transformers'
// top-k over a causally masked row gives).
//
// Rows are independent, each computed by one thread in a fixed order (deterministic for any
// thread count).
#pragma once

#include "core/cpu_isa.h"
#include "core/paged_kv.h"
#include "core/thread_pool.h"

#include <cstdint>
#include <span>

namespace moet {

struct KeySource {
  PagedKv cache{};
  const int32_t* positions = nullptr;  // [rows, width] or null
  int64_t width = 0;
  int64_t window = 0;
  int64_t stride = 1;
};

// q: [rows, q_heads, q_stride] (first k_dim floats of each head used); sinks: [q_heads] or null.
void attention_gather(std::span<const KeySource> sources, const AttentionRows& rows_info, const float* q,
                      int64_t rows, int64_t q_heads, int64_t q_stride, float scale, const float* sinks, float* out,
                      ThreadPool& pool, CpuIsa isa);

// keys: one head of k_dim per slot; q: [rows, heads, k_dim]; weights: [rows, heads]; out: [rows, k].
void indexer_topk(const PagedKv& keys, const AttentionRows& rows_info, const float* q, int64_t rows, int64_t heads,
                  const float* weights, float scale, int64_t stride, int64_t k, int32_t* out, ThreadPool& pool,
                  CpuIsa isa);

}  // namespace moet
