// Attention over chosen keys and the lightning indexer (see sparse_attention.h). The arithmetic of
// attention_gather is attention_paged's (kernels/cpu/attention.cpp), key by key.
#include "kernels/cpu/sparse_attention.h"

#include "formats/kv_codec.h"
#include "kernels/cpu/matmul.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

namespace moet {
namespace {

constexpr int64_t kHeadsPerItem = 4;  // query heads of one KV head attended together (attention.cpp's)

// One key of a row: its source and physical slot.
struct KeyRef {
  int32_t source;
  int64_t slot;
};

int64_t slot_of(const PagedKv& cache, const int32_t* table, int64_t position) {
  return int64_t(table[position / cache.block_size]) * cache.block_size + position % cache.block_size;
}

// The keys row t sees, source by source.
void row_keys(std::span<const KeySource> sources, const AttentionRows& info, int64_t t, std::vector<KeyRef>& keys) {
  keys.clear();
  const int32_t* table = info.block_tables[info.row_seq[t]];
  const int64_t pos = info.positions[t];
  for (size_t s = 0; s < sources.size(); ++s) {
    const KeySource& src = sources[s];
    if (src.positions != nullptr) {
      for (int64_t i = 0; i < src.width; ++i) {
        const int32_t j = src.positions[t * src.width + i];
        if (j >= 0 && j <= pos) keys.push_back({int32_t(s), slot_of(src.cache, table, j)});
      }
      continue;
    }
    const int64_t first = src.window > 0 ? std::max<int64_t>(0, pos - src.window + 1) : 0;
    for (int64_t j = first; j <= pos; ++j)
      if ((j + 1) % src.stride == 0) keys.push_back({int32_t(s), slot_of(src.cache, table, j)});
  }
}

// Decodes values [offset, offset + dim) of a slot into `row` unless the cache is F32 (then in place).
const float* read_values(const PagedKv& cache, const uint8_t* base, int64_t slot, int64_t offset, int64_t dim,
                         float* row) {
  const uint8_t* bytes = base + slot * cache.slot_bytes;
  if (cache.dtype == KvDtype::f32) return reinterpret_cast<const float*>(bytes) + offset;
  const KvLayout layout = paged_kv_layout(cache);
  kv_slot_decode(layout, kv_slot_layout(layout), bytes, offset, dim, row);
  return row;
}

// q . k for the key `slot` of `cache`, head kv_head (BF16 caches read in place, as attention.cpp).
float key_dot(const PagedKv& cache, int64_t slot, int64_t kv_head, const float* q, float* row, CpuIsa isa) {
  if (cache.dtype == KvDtype::bf16)
    return dot_bf16(q, reinterpret_cast<const uint16_t*>(cache.k + slot * cache.slot_bytes) + kv_head * cache.k_dim,
                    cache.k_dim, isa);
  return dot_f32(q, read_values(cache, cache.k, slot, kv_head * cache.k_dim, cache.k_dim, row), cache.k_dim, isa);
}

}  // namespace

void attention_gather(std::span<const KeySource> sources, const AttentionRows& info, const float* q, int64_t rows,
                      int64_t q_heads, int64_t q_stride, float scale, const float* sinks, float* out,
                      ThreadPool& pool, CpuIsa isa) {
  const PagedKv& first = sources.front().cache;
  const int64_t kv_heads = first.kv_heads, k_dim = first.k_dim, v_dim = first.v_dim;
  const int64_t group = q_heads / kv_heads;
  const int64_t chunks = (group + kHeadsPerItem - 1) / kHeadsPerItem;
  pool.parallel_for(size_t(rows * kv_heads * chunks), [&](size_t begin, size_t end) {
    std::vector<float> scores, row(size_t(std::max(k_dim, v_dim)));
    std::vector<KeyRef> keys;
    for (size_t item = begin; item < end; ++item) {
      const int64_t t = int64_t(item) / (kv_heads * chunks);
      const int64_t kv_head = int64_t(item) / chunks % kv_heads;
      const int64_t h0 = kv_head * group + int64_t(item) % chunks * kHeadsPerItem;
      const int64_t heads = std::min(kHeadsPerItem, kv_head * group + group - h0);
      row_keys(sources, info, t, keys);
      const int64_t n = int64_t(keys.size());
      scores.resize(size_t(heads * n));
      float max_score[kHeadsPerItem], denom[kHeadsPerItem];
      for (int64_t i = 0; i < heads; ++i) max_score[i] = sinks ? sinks[h0 + i] : -INFINITY;
      for (int64_t j = 0; j < n; ++j) {
        const PagedKv& cache = sources[size_t(keys[size_t(j)].source)].cache;
        for (int64_t i = 0; i < heads; ++i) {
          const float s = key_dot(cache, keys[size_t(j)].slot, kv_head, q + (t * q_heads + h0 + i) * q_stride,
                                  row.data(), isa) * scale;
          scores[size_t(i * n + j)] = s;
          max_score[i] = std::max(max_score[i], s);
        }
      }
      for (int64_t i = 0; i < heads; ++i) {
        denom[i] = 0.0f;
        for (int64_t j = 0; j < n; ++j) {
          float& s = scores[size_t(i * n + j)];
          s = std::exp(s - max_score[i]);
          denom[i] += s;
        }
        if (sinks) denom[i] += std::exp(sinks[h0 + i] - max_score[i]);
        float* oh = out + (t * q_heads + h0 + i) * v_dim;
        std::fill(oh, oh + v_dim, 0.0f);
      }
      for (int64_t j = 0; j < n; ++j) {
        const PagedKv& cache = sources[size_t(keys[size_t(j)].source)].cache;
        const float* vj = read_values(cache, cache.v, keys[size_t(j)].slot, kv_head * v_dim, v_dim, row.data());
        for (int64_t i = 0; i < heads; ++i)
          axpy_f32(scores[size_t(i * n + j)] / denom[i], vj, out + (t * q_heads + h0 + i) * v_dim, v_dim, isa);
      }
    }
  }, 1);
}

void indexer_topk(const PagedKv& keys, const AttentionRows& info, const float* q, int64_t rows, int64_t heads,
                  const float* weights, float scale, int64_t stride, int64_t k, int32_t* out, ThreadPool& pool,
                  CpuIsa isa) {
  const int64_t dim = keys.k_dim;
  pool.parallel_for(size_t(rows), [&](size_t begin, size_t end) {
    std::vector<float> row(static_cast<size_t>(dim)), scores;
    std::vector<int32_t> candidates;
    for (size_t r = begin; r < end; ++r) {
      const int64_t t = int64_t(r), pos = info.positions[t];
      const int32_t* table = info.block_tables[info.row_seq[t]];
      candidates.clear();
      for (int64_t j = stride - 1; j <= pos; j += stride) candidates.push_back(int32_t(j));
      int32_t* dst = out + t * k;
      std::fill(dst, dst + k, -1);
      if (int64_t(candidates.size()) <= k) {
        std::copy(candidates.begin(), candidates.end(), dst);
        continue;
      }
      scores.assign(candidates.size(), 0.0f);
      for (size_t c = 0; c < candidates.size(); ++c) {
        const int64_t slot = slot_of(keys, table, candidates[c]);
        float total = 0.0f;
        for (int64_t h = 0; h < heads; ++h) {
          const float s = key_dot(keys, slot, 0, q + (t * heads + h) * dim, row.data(), isa) * scale;
          total += weights[t * heads + h] * std::max(s, 0.0f);
        }
        scores[c] = total;
      }
      std::vector<int32_t> order(candidates.size());
      std::iota(order.begin(), order.end(), 0);
      std::partial_sort(order.begin(), order.begin() + k, order.end(), [&](int32_t a, int32_t b) {
        return scores[size_t(a)] > scores[size_t(b)] || (scores[size_t(a)] == scores[size_t(b)] && a < b);
      });
      order.resize(static_cast<size_t>(k));
      std::sort(order.begin(), order.end());
      for (int64_t i = 0; i < k; ++i) dst[i] = candidates[size_t(order[size_t(i)])];
    }
  }, 1);
}

}  // namespace moet
