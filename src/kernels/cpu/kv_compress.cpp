// The KV compressor (see kv_compress.h).
#include "kernels/cpu/kv_compress.h"

#include "formats/kv_codec.h"
#include "kernels/cpu/rope.h"

#include <algorithm>
#include <cmath>
#include <vector>

namespace moet {

void kv_compress(const KvCompressParams& p, const PagedKv& state, const AttentionRows& info, int64_t rows,
                 const float* position_bias, const float* norm, const RopeTable& rope, const PagedKv& out,
                 ThreadPool& pool) {
  const int64_t m = p.ratio, dim = p.dim, coff = p.overlap ? 2 : 1, width = coff * dim;
  const KvLayout state_layout = paged_kv_layout(state), out_layout = paged_kv_layout(out);
  const KvSlotLayout state_slot = kv_slot_layout(state_layout), out_slot = kv_slot_layout(out_layout);
  const int64_t rot_dim = 2 * int64_t(rope.inv_freq.size());
  pool.parallel_for(size_t(rows), [&](size_t begin, size_t end) {
    std::vector<float> kv, gate, entry(static_cast<size_t>(dim)), row(size_t(2 * width));
    for (size_t r = begin; r < end; ++r) {
      const int64_t t = int64_t(r), pos = info.positions[t];
      if ((pos + 1) % m != 0) continue;
      const int64_t w = pos / m;
      const int32_t* table = info.block_tables[info.row_seq[t]];
      const auto slot_of = [&](const PagedKv& c, int64_t j) {
        return int64_t(table[j / c.block_size]) * c.block_size + j % c.block_size;
      };
      // The window's (kv, gate) pairs as [slots, dim] each, gate with its position bias.
      kv.clear();
      gate.clear();
      const auto take = [&](int64_t position, int64_t i, int64_t half) {
        kv_slot_decode(state_layout, state_slot, state.k + slot_of(state, position) * state.slot_bytes, 0, 2 * width,
                       row.data());
        for (int64_t c = 0; c < dim; ++c) {
          kv.push_back(row[size_t(half * dim + c)]);
          gate.push_back(row[size_t(width + half * dim + c)] + position_bias[i * width + half * dim + c]);
        }
      };
      if (p.overlap && w > 0)
        for (int64_t i = 0; i < m; ++i) take((w - 1) * m + i, i, 0);
      for (int64_t i = 0; i < m; ++i) take(w * m + i, i, p.overlap ? 1 : 0);
      const int64_t slots = int64_t(kv.size()) / dim;
      for (int64_t c = 0; c < dim; ++c) {
        float max = -INFINITY;
        for (int64_t s = 0; s < slots; ++s) max = std::max(max, gate[size_t(s * dim + c)]);
        float sum = 0.0f, acc = 0.0f;
        for (int64_t s = 0; s < slots; ++s) sum += std::exp(gate[size_t(s * dim + c)] - max);
        for (int64_t s = 0; s < slots; ++s)
          acc += kv[size_t(s * dim + c)] * (std::exp(gate[size_t(s * dim + c)] - max) / sum);
        entry[size_t(c)] = acc;
      }
      double sq = 0.0;
      for (int64_t c = 0; c < dim; ++c) sq += double(entry[size_t(c)]) * double(entry[size_t(c)]);
      const float inv = 1.0f / std::sqrt(float(sq / double(dim)) + p.eps);
      for (int64_t c = 0; c < dim; ++c) entry[size_t(c)] = norm[c] * (entry[size_t(c)] * inv);
      rope_rotate(rope, entry.data() + dim - rot_dim, float(w * m));
      kv_slot_encode(out_layout, out_slot, entry.data(), out.k_scale, out.k + slot_of(out, pos) * out.slot_bytes);
    }
  }, 1);
}

}  // namespace moet
