// Paged causal attention and KV writes (see attention.h). Softmax in FP32 with the running
// maximum subtracted; scores and weighted sums in key order. An F32 cache is read in place; other
// dtypes decode each key's head (and value) row into a scratch row first, once for up to
// kHeadsPerItem query heads of its KV head.
#include "kernels/cpu/attention.h"

#include "formats/kv_codec.h"
#include "kernels/cpu/matmul.h"

#include <algorithm>
#include <cmath>
#include <vector>

namespace moet {
namespace {

// Query heads of one KV head that one work item attends together: each key (and value) row is
// read, and decoded, once for them. Every head's arithmetic is the same whatever the grouping.
constexpr int64_t kHeadsPerItem = 4;

}  // namespace

void kv_cache_write(const PagedKv& cache, const float* k_src, const float* v_src, int64_t rows,
                    const int64_t* slots) {
  const KvLayout layout = paged_kv_layout(cache);
  const KvSlotLayout s = kv_slot_layout(layout);
  for (int64_t t = 0; t < rows; ++t) {
    kv_slot_encode(layout, s, k_src + t * s.values, cache.k_scale, cache.k + slots[t] * cache.slot_bytes);
    if (v_src != nullptr)
      kv_slot_encode(layout, s, v_src + t * s.values, cache.v_scale, cache.v + slots[t] * cache.slot_bytes);
  }
}

void attention_paged(const PagedKv& cache, const AttentionRows& info, const float* q,
                     int64_t rows, int64_t q_heads, int64_t q_stride, float scale, float* out,
                     ThreadPool& pool, CpuIsa isa) {
  const int64_t group = q_heads / cache.kv_heads;
  const int64_t chunks = (group + kHeadsPerItem - 1) / kHeadsPerItem;  // items per (row, KV head)
  const KvLayout layout = paged_kv_layout(cache);
  const KvSlotLayout slot_layout = kv_slot_layout(layout);
  const bool bf16 = cache.dtype == KvDtype::bf16;
  pool.parallel_for(size_t(rows * cache.kv_heads * chunks), [&](size_t begin, size_t end) {
    std::vector<float> scores, row(size_t(std::max(cache.k_dim, cache.v_dim)));
    // Head `kv_head` of slot `slot` of `base` (K or V), values [offset, offset + dim), as floats.
    const auto read = [&](const uint8_t* base, int64_t slot, int64_t offset, int64_t dim) -> const float* {
      const uint8_t* bytes = base + slot * cache.slot_bytes;
      if (cache.dtype == KvDtype::f32) return reinterpret_cast<const float*>(bytes) + offset;
      kv_slot_decode(layout, slot_layout, bytes, offset, dim, row.data());
      return row.data();
    };
    for (size_t item = begin; item < end; ++item) {
      const int64_t t = int64_t(item) / (cache.kv_heads * chunks);
      const int64_t kv_head = int64_t(item) / chunks % cache.kv_heads;
      const int64_t h0 = kv_head * group + int64_t(item) % chunks * kHeadsPerItem;
      const int64_t heads = std::min(kHeadsPerItem, kv_head * group + group - h0);
      const int32_t* table = info.block_tables[info.row_seq[t]];
      const int64_t keys = int64_t(info.positions[t]) + 1;
      const auto slot_of = [&](int64_t j) {
        return int64_t(table[j / cache.block_size]) * cache.block_size + j % cache.block_size;
      };
      scores.resize(size_t(heads * keys));
      float max_score[kHeadsPerItem], denom[kHeadsPerItem];
      std::fill(max_score, max_score + heads, -INFINITY);
      for (int64_t j = 0; j < keys; ++j) {
        // BF16 keys in place: dot_bf16 gives decode-then-dot_f32's bits.
        const uint16_t* kj_bf16 = bf16 ? reinterpret_cast<const uint16_t*>(cache.k + slot_of(j) * cache.slot_bytes) +
                                             kv_head * cache.k_dim
                                       : nullptr;
        const float* kj = bf16 ? nullptr : read(cache.k, slot_of(j), kv_head * cache.k_dim, cache.k_dim);
        for (int64_t i = 0; i < heads; ++i) {
          const float* qh = q + (t * q_heads + h0 + i) * q_stride;
          const float s =
              (bf16 ? dot_bf16(qh, kj_bf16, cache.k_dim, isa) : dot_f32(qh, kj, cache.k_dim, isa)) * scale;
          scores[size_t(i * keys + j)] = s;
          max_score[i] = std::max(max_score[i], s);
        }
      }
      for (int64_t i = 0; i < heads; ++i) {
        denom[i] = 0.0f;
        for (int64_t j = 0; j < keys; ++j) {
          float& s = scores[size_t(i * keys + j)];
          s = std::exp(s - max_score[i]);
          denom[i] += s;
        }
        float* oh = out + (t * q_heads + h0 + i) * cache.v_dim;
        std::fill(oh, oh + cache.v_dim, 0.0f);
      }
      for (int64_t j = 0; j < keys; ++j) {
        const float* vj = read(cache.v, slot_of(j), kv_head * cache.v_dim, cache.v_dim);
        for (int64_t i = 0; i < heads; ++i)
          axpy_f32(scores[size_t(i * keys + j)] / denom[i], vj, out + (t * q_heads + h0 + i) * cache.v_dim,
                   cache.v_dim, isa);
      }
    }
  }, 1);
}

}  // namespace moet
