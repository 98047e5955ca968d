// Paged causal attention and KV writes (see attention.h). Softmax in FP32 with the running
// maximum subtracted; scores and weighted sums in key order.
#include "kernels/cpu/attention.h"

#include "kernels/cpu/matmul.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

namespace moet {

void kv_cache_write(const PagedKv& cache, const float* k_src, const float* v_src, int64_t rows,
                    const int64_t* slots) {
  const int64_t k_row = cache.kv_heads * cache.k_dim;
  const int64_t v_row = cache.kv_heads * cache.v_dim;
  for (int64_t t = 0; t < rows; ++t) {
    std::memcpy(cache.k + slots[t] * cache.token_stride, k_src + t * k_row, sizeof(float) * size_t(k_row));
    if (v_src != nullptr)
      std::memcpy(cache.v + slots[t] * cache.token_stride, v_src + t * v_row, sizeof(float) * size_t(v_row));
  }
}

void attention_paged(const PagedKv& cache, const AttentionRows& info, const float* q,
                     int64_t rows, int64_t q_heads, int64_t q_stride, float scale, float* out,
                     ThreadPool& pool, CpuIsa isa) {
  const int64_t group = q_heads / cache.kv_heads;
  pool.parallel_for(size_t(rows * q_heads), [&](size_t begin, size_t end) {
    std::vector<float> scores;
    for (size_t item = begin; item < end; ++item) {
      const int64_t t = int64_t(item) / q_heads;
      const int64_t h = int64_t(item) % q_heads;
      const int64_t kv_head = h / group;
      const int32_t* table = info.block_tables[info.row_seq[t]];
      const int64_t keys = int64_t(info.positions[t]) + 1;
      const float* qh = q + (t * q_heads + h) * q_stride;
      scores.resize(size_t(keys));
      float max_score = -INFINITY;
      for (int64_t j = 0; j < keys; ++j) {
        const int64_t slot = int64_t(table[j / cache.block_size]) * cache.block_size + j % cache.block_size;
        const float* kj = cache.k + slot * cache.token_stride + kv_head * cache.k_dim;
        scores[size_t(j)] = dot_f32(qh, kj, cache.k_dim, isa) * scale;
        max_score = std::max(max_score, scores[size_t(j)]);
      }
      float denom = 0.0f;
      for (float& s : scores) {
        s = std::exp(s - max_score);
        denom += s;
      }
      float* oh = out + (t * q_heads + h) * cache.v_dim;
      std::fill(oh, oh + cache.v_dim, 0.0f);
      for (int64_t j = 0; j < keys; ++j) {
        const int64_t slot = int64_t(table[j / cache.block_size]) * cache.block_size + j % cache.block_size;
        const float* vj = cache.v + slot * cache.token_stride + kv_head * cache.v_dim;
        axpy_f32(scores[size_t(j)] / denom, vj, oh, cache.v_dim, isa);
      }
    }
  }, 1);
}

}  // namespace moet
