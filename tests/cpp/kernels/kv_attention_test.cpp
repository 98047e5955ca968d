// Paged attention over a quantized KV cache, every dtype, GQA heads and MLA latent rows: the CPU
// kernel's output against a float64 attention computed over the same quantized cache (each key
// and value decoded by the reference codec, formats/kv_codec.h), within FP32 rounding; the cache
// bytes the kernel writes are the reference encoder's; and the result does not depend on the
// thread count (memcmp).
#include "../cpu_isa_env.h"
#include "../random_values.h"
#include "formats/kv_codec.h"
#include "kernels/cpu/attention.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

namespace moet {
namespace {

struct Case {
  KvLayout layout;
  int64_t q_heads;
  std::string name;
};

std::vector<Case> cases() {
  std::vector<Case> out;
  for (KvDtype dtype : {KvDtype::f32, KvDtype::bf16, KvDtype::fp8_e4m3, KvDtype::fp8_e5m2})
    out.push_back({{dtype, 2, 24, 24, false}, 6, "gqa"});
  for (KvDtype dtype : {KvDtype::f32, KvDtype::bf16, KvDtype::fp8_e4m3, KvDtype::fp8_e5m2, KvDtype::nvfp4})
    out.push_back({{dtype, 1, 48, 32, true}, 4, "latent"});
  return out;
}

// Two sequences over one cache (blocks of 3 out of order), prefill-style: every row attends.
struct Scene {
  static constexpr int64_t kBlock = 3, kBlocks = 10;
  std::vector<std::vector<int32_t>> tables = {{3, 0, 7, 1}, {2, 9, 5}};
  std::vector<int32_t> positions, row_seq;
  std::vector<int64_t> slots;

  Scene() {
    for (int32_t s = 0; s < 2; ++s)
      for (int32_t t = 0; t < (s == 0 ? 11 : 8); ++t) {
        positions.push_back(t);
        row_seq.push_back(s);
        slots.push_back(int64_t(tables[size_t(s)][size_t(t / kBlock)]) * kBlock + t % kBlock);
      }
  }
  int64_t rows() const { return int64_t(positions.size()); }
};

TEST(KvAttention, EveryDtypeMatchesFloat64OverItsQuantizedCache) {
  const Scene scene;
  const int64_t rows = scene.rows();
  for (const Case& c : cases()) {
    const KvLayout& layout = c.layout;
    const KvSlotLayout s = kv_slot_layout(layout);
    SCOPED_TRACE(c.name + " dtype " + std::to_string(int(layout.dtype)));
    std::vector<uint8_t> k_mem(size_t(Scene::kBlocks * Scene::kBlock * s.bytes), 0xaa), v_mem(k_mem.size(), 0xaa);
    const PagedKv cache = paged_kv_view(layout, k_mem.data(), v_mem.data(), Scene::kBlock);
    const auto k = random_floats(size_t(rows * s.values), 7);
    const auto v = random_floats(size_t(rows * s.values), 8);
    kv_cache_write(cache, k.data(), layout.v_aliases_k ? nullptr : v.data(), rows, scene.slots.data());
    std::vector<uint8_t> expected(size_t(s.bytes));
    for (int64_t t = 0; t < rows; ++t) {  // what the reference encoder makes of the row, byte for byte
      kv_slot_encode(layout, s, k.data() + t * s.values, 0.0f, expected.data());
      ASSERT_EQ(std::memcmp(expected.data(), cache.k + scene.slots[size_t(t)] * s.bytes, size_t(s.bytes)), 0) << t;
    }

    const int64_t q_stride = layout.k_dim + 5;  // heads of q further apart than k_dim
    const auto q = random_floats(size_t(rows * c.q_heads * q_stride), 9);
    const float scale = 0.3f;
    const int32_t* tables[] = {scene.tables[0].data(), scene.tables[1].data()};
    const AttentionRows info{scene.positions.data(), scene.row_seq.data(), tables};
    std::vector<float> out(size_t(rows * c.q_heads * layout.v_dim));
    ThreadPool pool(3);
    attention_paged(cache, info, q.data(), rows, c.q_heads, q_stride, scale, out.data(), pool, test_cpu_isa());

    const int64_t group = c.q_heads / layout.kv_heads;
    double worst = 0.0;
    int64_t quantized = 0;  // keys whose decoded value differs from the value written
    for (int64_t t = 0; t < rows; ++t) {
      const int32_t* table = tables[scene.row_seq[size_t(t)]];
      const int64_t keys = scene.positions[size_t(t)] + 1;
      for (int64_t h = 0; h < c.q_heads; ++h) {
        const int64_t kv_head = h / group;
        std::vector<double> p(static_cast<size_t>(keys));
        double mx = -1e300, sum = 0.0;
        const auto slot_bytes = [&](const uint8_t* base, int64_t j) {
          return base + (int64_t(table[j / Scene::kBlock]) * Scene::kBlock + j % Scene::kBlock) * s.bytes;
        };
        for (int64_t j = 0; j < keys; ++j) {
          double dot = 0.0;
          for (int64_t d = 0; d < layout.k_dim; ++d)
            dot += double(q[size_t((t * c.q_heads + h) * q_stride + d)]) *
                   double(kv_slot_value(layout, s, slot_bytes(cache.k, j), kv_head * layout.k_dim + d));
          p[size_t(j)] = dot * scale;
          mx = std::max(mx, p[size_t(j)]);
        }
        for (double& e : p) sum += (e = std::exp(e - mx));
        for (int64_t d = 0; d < layout.v_dim; ++d) {
          double o = 0.0;
          for (int64_t j = 0; j < keys; ++j)
            o += p[size_t(j)] / sum *
                 double(kv_slot_value(layout, s, slot_bytes(cache.v, j), kv_head * layout.v_dim + d));
          const double got = out[size_t((t * c.q_heads + h) * layout.v_dim + d)];
          worst = std::max(worst, std::fabs(got - o));
        }
      }
      for (int64_t d = 0; d < s.values; ++d)
        quantized +=
            kv_slot_value(layout, s, cache.k + scene.slots[size_t(t)] * s.bytes, d) != k[size_t(t * s.values + d)];
    }
    EXPECT_LT(worst, 1e-5);  // outputs are O(1): FP32 rounding of the scores and sums
    if (layout.dtype == KvDtype::f32) {
      EXPECT_EQ(quantized, 0);
    } else {
      EXPECT_GT(quantized, rows * s.values / 2);  // the reference really is the quantized cache
    }

    ThreadPool one(1);  // thread count does not change a bit
    std::vector<float> again(out.size());
    attention_paged(cache, info, q.data(), rows, c.q_heads, q_stride, scale, again.data(), one, test_cpu_isa());
    EXPECT_EQ(std::memcmp(out.data(), again.data(), out.size() * sizeof(float)), 0);
  }
}

TEST(KvAttention, FixedFp8ScalesAreUsedForKAndV) {
  const KvLayout layout{KvDtype::fp8_e4m3, 1, 16, 16, false, 0.25f, 0.125f};
  const KvSlotLayout s = kv_slot_layout(layout);
  std::vector<uint8_t> k_mem(size_t(4 * s.bytes)), v_mem(k_mem.size());
  const PagedKv cache = paged_kv_view(layout, k_mem.data(), v_mem.data(), 4);
  const auto k = random_floats(16, 1), v = random_floats(16, 2);
  const int64_t slot = 2;
  kv_cache_write(cache, k.data(), v.data(), 1, &slot);
  float k_scale = 0.0f, v_scale = 0.0f;
  std::memcpy(&k_scale, cache.k + slot * s.bytes + s.scale_offset, 4);
  std::memcpy(&v_scale, cache.v + slot * s.bytes + s.scale_offset, 4);
  EXPECT_EQ(k_scale, 0.25f);
  EXPECT_EQ(v_scale, 0.125f);
  for (int64_t d = 0; d < 16; ++d)
    EXPECT_EQ(kv_slot_value(layout, s, cache.v + slot * s.bytes, d),
              fp8_decode(fp8_encode(v[size_t(d)] / 0.125f, Fp8Kind::e4m3), Fp8Kind::e4m3) * 0.125f);
}

}  // namespace
}  // namespace moet
