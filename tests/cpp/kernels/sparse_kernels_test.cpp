// The CPU kernels of GLM-5 (DeepSeek sparse attention) and DeepSeek-V4 against float64 references
// written here from transformers' formulas: attention over chosen keys (a causal source gives
// attention_paged's bits, memcmp; position lists, windows, strides and sinks within FP32
// rounding), the lightning indexer's top-k (exact sets), the KV compressor (overlapping and plain
// windows), hyper-connections (Sinkhorn's matrix is doubly stochastic), rope with pairs in place
// and its inverse, sqrtsoftplus and hash routing, the SwiGLU clamp and LayerNorm. Thread counts
// change no bit (memcmp).
#include "../cpu_isa_env.h"
#include "../random_values.h"
#include "formats/kv_codec.h"
#include "kernels/cpu/attention.h"
#include "kernels/cpu/elementwise.h"
#include "kernels/cpu/hyper_connection.h"
#include "kernels/cpu/kv_compress.h"
#include "kernels/cpu/rope.h"
#include "kernels/cpu/router.h"
#include "kernels/cpu/sparse_attention.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <vector>

namespace moet {
namespace {

// One sequence of `length` tokens over a cache of blocks of 3 (table out of order), every row a query.
struct Scene {
  static constexpr int64_t kBlock = 3;
  std::vector<int32_t> table = {4, 0, 6, 2, 1, 5, 3};
  std::vector<int32_t> positions, row_seq;
  std::vector<int64_t> slots;
  const int32_t* tables[1];

  explicit Scene(int32_t length) {
    for (int32_t t = 0; t < length; ++t) {
      positions.push_back(t);
      row_seq.push_back(0);
      slots.push_back(int64_t(table[size_t(t / kBlock)]) * kBlock + t % kBlock);
    }
    tables[0] = table.data();
  }
  int64_t rows() const { return int64_t(positions.size()); }
  AttentionRows info() const { return {positions.data(), row_seq.data(), tables}; }
  int64_t capacity() const { return int64_t(table.size()) * kBlock; }
};

// A latent cache (one row of `dim` per slot, V = K) holding `values` for the scene's rows.
struct LatentCache {
  KvLayout layout;
  std::vector<uint8_t> memory;
  PagedKv view;
  LatentCache(const Scene& scene, int64_t dim, const std::vector<float>& values, KvDtype dtype = KvDtype::f32)
      : layout{dtype, 1, dim, dim, true},
        memory(size_t(scene.capacity() * kv_slot_layout(layout).bytes)),
        view(paged_kv_view(layout, memory.data(), memory.data(), Scene::kBlock)) {
    kv_cache_write(view, values.data(), nullptr, scene.rows(), scene.slots.data());
  }
  float value(const Scene& scene, int64_t position, int64_t i) const {
    const KvSlotLayout s = kv_slot_layout(layout);
    return kv_slot_value(layout, s, view.k + scene.slots[size_t(position)] * s.bytes, i);
  }
};

// float64 attention of q over the listed keys (positions of `cache`), with an optional sink.
std::vector<double> reference_attention(const Scene& scene, const std::vector<const LatentCache*>& caches,
                                        const std::vector<std::vector<int64_t>>& keys, const float* q, int64_t dim,
                                        double scale, const float* sink) {
  std::vector<double> p;
  double mx = sink ? *sink : -1e300;
  for (size_t c = 0; c < caches.size(); ++c)
    for (int64_t j : keys[c]) {
      double dot = 0.0;
      for (int64_t d = 0; d < dim; ++d) dot += double(q[d]) * double(caches[c]->value(scene, j, d));
      p.push_back(dot * scale);
      mx = std::max(mx, p.back());
    }
  double sum = sink ? std::exp(*sink - mx) : 0.0;
  for (double& e : p) sum += (e = std::exp(e - mx));
  std::vector<double> out(size_t(dim), 0.0);
  size_t n = 0;
  for (size_t c = 0; c < caches.size(); ++c)
    for (int64_t j : keys[c]) {
      for (int64_t d = 0; d < dim; ++d) out[size_t(d)] += p[n] / sum * double(caches[c]->value(scene, j, d));
      ++n;
    }
  return out;
}

TEST(SparseAttention, CausalSourceIsAttentionPagedBitForBit) {
  const Scene scene(17);
  for (KvDtype dtype : {KvDtype::f32, KvDtype::bf16, KvDtype::fp8_e4m3}) {
    const LatentCache cache(scene, 24, random_floats(size_t(17 * 24), 1), dtype);
    const auto q = random_floats(size_t(17 * 4 * 24), 2);
    std::vector<float> dense(size_t(17 * 4 * 24)), gathered(dense.size());
    ThreadPool pool(2);
    attention_paged(cache.view, scene.info(), q.data(), 17, 4, 24, 0.2f, dense.data(), pool, test_cpu_isa());
    const KeySource all{cache.view};
    attention_gather({&all, 1}, scene.info(), q.data(), 17, 4, 24, 0.2f, nullptr, gathered.data(), pool,
                     test_cpu_isa());
    EXPECT_EQ(std::memcmp(dense.data(), gathered.data(), dense.size() * sizeof(float)), 0) << int(dtype);
  }
}

TEST(SparseAttention, ListsWindowsStridesAndSinksMatchFloat64) {
  const Scene scene(19);
  const int64_t rows = 19, heads = 4, dim = 16, width = 5, window = 6, stride = 4;
  const LatentCache a(scene, dim, random_floats(size_t(rows * dim), 3));
  const LatentCache b(scene, dim, random_floats(size_t(rows * dim), 4));
  // Row t's list: some of its earlier positions, -1 holes, and positions after t (never attended).
  std::vector<int32_t> lists(size_t(rows * width), -1);
  for (int64_t t = 0; t < rows; ++t)
    for (int64_t i = 0; i < width; ++i) lists[size_t(t * width + i)] = int32_t((t * 7 + i * 5) % (t + 3)) - 1;
  const auto q = random_floats(size_t(rows * heads * dim), 5);
  const auto sinks = random_floats(size_t(heads), 6);
  const KeySource sources[] = {{a.view, nullptr, 0, window, 1}, {b.view, lists.data(), width, 0, 1},
                               {b.view, nullptr, 0, 0, stride}};
  std::vector<float> out(size_t(rows * heads * dim));
  ThreadPool pool(3);
  attention_gather(sources, scene.info(), q.data(), rows, heads, dim, 0.25f, sinks.data(), out.data(), pool,
                   test_cpu_isa());
  double worst = 0.0;
  for (int64_t t = 0; t < rows; ++t) {
    std::vector<std::vector<int64_t>> keys(3);
    for (int64_t j = std::max<int64_t>(0, t - window + 1); j <= t; ++j) keys[0].push_back(j);
    for (int64_t i = 0; i < width; ++i)
      if (int64_t j = lists[size_t(t * width + i)]; j >= 0 && j <= t) keys[1].push_back(j);
    for (int64_t j = stride - 1; j <= t; j += stride) keys[2].push_back(j);
    for (int64_t h = 0; h < heads; ++h) {
      const auto want = reference_attention(scene, {&a, &b, &b}, keys, q.data() + (t * heads + h) * dim, dim, 0.25,
                                            &sinks[size_t(h)]);
      for (int64_t d = 0; d < dim; ++d)
        worst = std::max(worst, std::fabs(double(out[size_t((t * heads + h) * dim + d)]) - want[size_t(d)]));
    }
  }
  EXPECT_LT(worst, 1e-5);
  ThreadPool one(1);
  std::vector<float> again(out.size());
  attention_gather(sources, scene.info(), q.data(), rows, heads, dim, 0.25f, sinks.data(), again.data(), one,
                   test_cpu_isa());
  EXPECT_EQ(std::memcmp(out.data(), again.data(), out.size() * sizeof(float)), 0);
}

TEST(LightningIndexer, ChoosesTheBestKeysAscending) {
  const Scene scene(20);
  const int64_t rows = 20, heads = 3, dim = 8, k = 5;
  for (const int64_t stride : {1, 3}) {
    const LatentCache keys(scene, dim, random_floats(size_t(rows * dim), 10 + uint64_t(stride)));
    const auto q = random_floats(size_t(rows * heads * dim), 12);
    const auto weights = random_floats(size_t(rows * heads), 13);
    std::vector<int32_t> out(size_t(rows * k));
    ThreadPool pool(2);
    indexer_topk(keys.view, scene.info(), q.data(), rows, heads, weights.data(), 0.5f, stride, k, out.data(), pool,
                 test_cpu_isa());
    for (int64_t t = 0; t < rows; ++t) {
      std::vector<std::pair<double, int32_t>> scored;
      for (int64_t j = stride - 1; j <= t; j += stride) {
        double total = 0.0;
        for (int64_t h = 0; h < heads; ++h) {
          double dot = 0.0;
          for (int64_t d = 0; d < dim; ++d)
            dot += double(q[size_t((t * heads + h) * dim + d)]) * keys.value(scene, j, d);
          total += double(weights[size_t(t * heads + h)]) * std::max(0.5 * dot, 0.0);
        }
        scored.push_back({total, int32_t(j)});
      }
      std::stable_sort(scored.begin(), scored.end(), [](auto x, auto y) { return x.first > y.first; });
      std::vector<int32_t> want;
      for (size_t i = 0; i < scored.size() && int64_t(i) < k; ++i) want.push_back(scored[i].second);
      std::sort(want.begin(), want.end());
      want.resize(size_t(k), -1);
      EXPECT_EQ(std::vector<int32_t>(out.begin() + t * k, out.begin() + (t + 1) * k), want) << "row " << t;
    }
  }
}

TEST(KvCompress, WindowsMatchFloat64WithAndWithoutOverlap) {
  const Scene scene(13);
  const int64_t rows = 13, dim = 8, ratio = 4;
  RopeTable rope;
  rope.inv_freq = {0.5f, 0.05f};
  rope.interleaved = rope.pairs_in_place = true;
  for (const bool overlap : {false, true}) {
    const int64_t width = (overlap ? 2 : 1) * dim;
    const auto states = random_floats(size_t(rows * 2 * width), 20);
    const LatentCache state(scene, 2 * width, states);
    const auto bias = random_floats(size_t(ratio * width), 21), norm = random_floats(size_t(dim), 22);
    const KvLayout out_layout{KvDtype::f32, 1, dim, dim, true};
    std::vector<uint8_t> memory(size_t(scene.capacity() * kv_slot_layout(out_layout).bytes), 0);
    const PagedKv out = paged_kv_view(out_layout, memory.data(), memory.data(), Scene::kBlock);
    ThreadPool pool(2);
    kv_compress({ratio, overlap, dim, 1e-6f}, state.view, scene.info(), rows, bias.data(), norm.data(), rope, out,
                pool);
    for (int64_t t = 0; t < rows; ++t) {
      const float* got = reinterpret_cast<const float*>(memory.data()) + scene.slots[size_t(t)] * dim;
      if ((t + 1) % ratio != 0) {  // closes no window: untouched
        EXPECT_TRUE(std::all_of(got, got + dim, [](float v) { return v == 0.0f; })) << t;
        continue;
      }
      const int64_t w = t / ratio;
      std::vector<double> entry(static_cast<size_t>(dim));
      for (int64_t c = 0; c < dim; ++c) {
        std::vector<std::pair<double, double>> slots;  // (kv, gate)
        const auto at = [&](int64_t pos, int64_t i, int64_t half) {
          const float* row = states.data() + pos * 2 * width;
          slots.push_back(
              {row[half * dim + c], double(row[width + half * dim + c]) + bias[size_t(i * width + half * dim + c)]});
        };
        if (overlap && w > 0)
          for (int64_t i = 0; i < ratio; ++i) at((w - 1) * ratio + i, i, 0);
        for (int64_t i = 0; i < ratio; ++i) at(w * ratio + i, i, overlap ? 1 : 0);
        double mx = -1e300, sum = 0.0, acc = 0.0;
        for (auto [kv, g] : slots) mx = std::max(mx, g);
        for (auto [kv, g] : slots) sum += std::exp(g - mx);
        for (auto [kv, g] : slots) acc += kv * std::exp(g - mx) / sum;
        entry[size_t(c)] = acc;
      }
      double sq = 0.0;
      for (double e : entry) sq += e * e;
      const double inv = 1.0 / std::sqrt(sq / double(dim) + 1e-6);
      for (int64_t c = 0; c < dim; ++c) entry[size_t(c)] *= inv * double(norm[size_t(c)]);
      const int64_t off = dim - 4;  // the last 4 values: pairs rotated in place at position w * ratio
      for (int64_t i = 0; i < 2; ++i) {
        const double angle = double(w * ratio) * double(rope.inv_freq[size_t(i)]);
        const double a = entry[size_t(off + 2 * i)], b = entry[size_t(off + 2 * i + 1)];
        entry[size_t(off + 2 * i)] = a * std::cos(angle) - b * std::sin(angle);
        entry[size_t(off + 2 * i + 1)] = b * std::cos(angle) + a * std::sin(angle);
      }
      for (int64_t c = 0; c < dim; ++c) EXPECT_NEAR(got[c], entry[size_t(c)], 2e-5) << t << " " << c;
    }
  }
}

TEST(HyperConnection, PrePostCombAndHeadMatchFloat64) {
  const HyperParams p{4, 6, 20, 1e-6f, 1e-6f};
  const int64_t rows = 3, n = p.hc * p.dim, mixes = (2 + p.hc) * p.hc;
  auto streams = random_floats(size_t(rows * n), 30);
  const auto fn = random_floats(size_t(mixes * n), 31, 0.3f), base = random_floats(size_t(mixes), 32, 0.1f);
  const std::vector<float> scale = {1.1f, 0.9f, 1.3f};
  std::vector<float> post(size_t(rows * p.hc)), comb(size_t(rows * p.hc * p.hc)), collapsed(size_t(rows * p.dim));
  ThreadPool pool(2);
  hc_pre(p, streams.data(), rows, fn.data(), base.data(), scale.data(), post.data(), comb.data(), collapsed.data(),
         pool, test_cpu_isa());
  const auto sigmoid = [](double x) { return 1.0 / (1.0 + std::exp(-x)); };
  for (int64_t t = 0; t < rows; ++t) {
    const float* x = streams.data() + t * n;
    double sq = 0.0;
    for (int64_t i = 0; i < n; ++i) sq += double(x[i]) * x[i];
    const double inv = 1.0 / std::sqrt(sq / double(n) + 1e-6);
    std::vector<double> mix(static_cast<size_t>(mixes));
    for (int64_t m = 0; m < mixes; ++m)
      for (int64_t i = 0; i < n; ++i) mix[size_t(m)] += double(x[i]) * inv * fn[size_t(m * n + i)];
    for (int64_t i = 0; i < p.hc; ++i)
      EXPECT_NEAR(post[size_t(t * p.hc + i)], 2.0 * sigmoid(mix[size_t(p.hc + i)] * 0.9 + base[size_t(p.hc + i)]),
                  1e-5);
    // comb: softmax over each row + eps, column sums, then 19 times row and column sums (+ eps each).
    const int64_t hc = p.hc;
    std::vector<double> c(size_t(hc * hc));
    for (int64_t i = 0; i < hc; ++i) {
      double mx = -1e300, sum = 0.0;
      for (int64_t j = 0; j < hc; ++j) {
        c[size_t(i * hc + j)] = mix[size_t(2 * hc + i * hc + j)] * 1.3 + base[size_t(2 * hc + i * hc + j)];
        mx = std::max(mx, c[size_t(i * hc + j)]);
      }
      for (int64_t j = 0; j < hc; ++j) sum += (c[size_t(i * hc + j)] = std::exp(c[size_t(i * hc + j)] - mx));
      for (int64_t j = 0; j < hc; ++j) c[size_t(i * hc + j)] = c[size_t(i * hc + j)] / sum + 1e-6;
    }
    const auto normalise = [&](bool rows_first) {
      for (int64_t i = 0; i < hc; ++i) {
        double sum = 0.0;
        for (int64_t j = 0; j < hc; ++j) sum += rows_first ? c[size_t(i * hc + j)] : c[size_t(j * hc + i)];
        for (int64_t j = 0; j < hc; ++j) (rows_first ? c[size_t(i * hc + j)] : c[size_t(j * hc + i)]) /= sum + 1e-6;
      }
    };
    normalise(false);
    for (int it = 1; it < 20; ++it) {
      normalise(true);
      normalise(false);
    }
    for (int64_t i = 0; i < hc * hc; ++i) EXPECT_NEAR(comb[size_t(t * hc * hc + i)], c[size_t(i)], 1e-5);
    for (int64_t d = 0; d < p.dim; ++d) {
      double want = 0.0;
      for (int64_t i = 0; i < p.hc; ++i)
        want += (sigmoid(mix[size_t(i)] * 1.1 + base[size_t(i)]) + 1e-6) * x[i * p.dim + d];
      EXPECT_NEAR(collapsed[size_t(t * p.dim + d)], want, 1e-5);
    }
    // 20 Sinkhorn iterations: every row and column of comb sums to 1 (up to eps).
    for (int64_t i = 0; i < p.hc; ++i) {
      double row = 0.0, col = 0.0;
      for (int64_t j = 0; j < p.hc; ++j) {
        row += comb[size_t((t * p.hc + i) * p.hc + j)];
        col += comb[size_t((t * p.hc + j) * p.hc + i)];
      }
      EXPECT_NEAR(row, 1.0, 1e-3);
      EXPECT_NEAR(col, 1.0, 1e-5);
    }
  }
  // hc_post: stream_k = post[k] * out + sum_j comb[j, k] * stream_j.
  const auto block = random_floats(size_t(rows * p.dim), 33);
  const std::vector<float> before = streams;
  hc_post(p, streams.data(), rows, block.data(), post.data(), comb.data(), pool);
  for (int64_t t = 0; t < rows; ++t)
    for (int64_t k = 0; k < p.hc; ++k)
      for (int64_t d = 0; d < p.dim; ++d) {
        double want = double(post[size_t(t * p.hc + k)]) * block[size_t(t * p.dim + d)];
        for (int64_t j = 0; j < p.hc; ++j)
          want += double(comb[size_t((t * p.hc + j) * p.hc + k)]) * before[size_t(t * n + j * p.dim + d)];
        EXPECT_NEAR(streams[size_t(t * n + k * p.dim + d)], want, 1e-5);
      }
  // hc_head with fn [hc, n]: the same collapse as hc_pre's with its own weights.
  std::vector<float> head(size_t(rows * p.dim)), head_post(post.size()), head_comb(comb.size()), pre_out(head.size());
  hc_head(p, streams.data(), rows, fn.data(), base.data(), scale.data(), head.data(), pool, test_cpu_isa());
  hc_pre(p, streams.data(), rows, fn.data(), base.data(), scale.data(), head_post.data(), head_comb.data(),
         pre_out.data(), pool, test_cpu_isa());
  EXPECT_EQ(std::memcmp(head.data(), pre_out.data(), head.size() * sizeof(float)), 0);
}

TEST(Rope, PairsInPlaceAndInverse) {
  RopeTable halves, pairs;
  halves.inv_freq = pairs.inv_freq = {1.0f, 0.1f, 0.01f};
  halves.interleaved = pairs.interleaved = true;
  pairs.pairs_in_place = true;
  const auto x = random_floats(8, 40);
  std::vector<float> a(x.begin(), x.end()), b(x.begin(), x.end());
  const int32_t pos = 7;
  rope_apply(halves, a.data(), 1, 1, 8, 8, 2, &pos);  // de-interleaved output
  rope_apply(pairs, b.data(), 1, 1, 8, 8, 2, &pos);   // the same values, pairs where they were
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(b[size_t(2 + 2 * i)], a[size_t(2 + i)]);
    EXPECT_EQ(b[size_t(3 + 2 * i)], a[size_t(5 + i)]);
  }
  EXPECT_EQ(b[0], x[0]);
  EXPECT_EQ(b[1], x[1]);
  rope_apply(pairs, b.data(), 1, 1, 8, 8, 2, &pos, true);
  for (int i = 0; i < 8; ++i) EXPECT_NEAR(b[size_t(i)], x[size_t(i)], 1e-6);
}

TEST(Router, SqrtSoftplusAndHashRouting) {
  const auto logits = random_floats(2 * 6, 50, 3.0f);
  const std::vector<float> bias = {0.0f, 0.5f, 0.0f, -0.5f, 0.0f, 0.0f};
  RouterParams p{6, 2, false, true, 1.5f, 1, 1, bias.data(), true};
  std::vector<int32_t> ids(4);
  std::vector<float> weights(4);
  router_topk(p, logits.data(), 2, ids.data(), weights.data());
  const auto score = [](double x) { return std::sqrt(x > 20 ? x : std::log1p(std::exp(x))); };
  for (int64_t t = 0; t < 2; ++t) {
    std::vector<int> order(6);
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [&](int a, int b) {
      return score(logits[size_t(t * 6 + a)]) + bias[size_t(a)] > score(logits[size_t(t * 6 + b)]) + bias[size_t(b)];
    });
    const double s0 = score(logits[size_t(t * 6 + order[0])]), s1 = score(logits[size_t(t * 6 + order[1])]);
    EXPECT_EQ(ids[size_t(t * 2)], order[0]);
    EXPECT_EQ(ids[size_t(t * 2 + 1)], order[1]);
    EXPECT_NEAR(weights[size_t(t * 2)], 1.5 * s0 / (s0 + s1), 1e-6);
  }
  const std::vector<int32_t> table = {3, 1, 0, 5, 2, 4};  // vocab 3, top-2
  const std::vector<int32_t> tokens = {2, 0};
  router_hash(p, logits.data(), 2, tokens.data(), table.data(), 3, ids.data(), weights.data());
  EXPECT_EQ(ids, (std::vector<int32_t>{2, 4, 3, 1}));
  const double a = score(logits[2]), b = score(logits[4]);
  EXPECT_NEAR(weights[0], 1.5 * a / (a + b), 1e-6);
}

TEST(Elementwise, SwigluClampAndLayerNorm) {
  const std::vector<float> gate_up = {3.0f, -4.0f, 0.5f, 2.5f, -3.0f, 0.25f};  // inner 3
  std::vector<float> out(3);
  silu_mul(gate_up.data(), 1, 3, out.data(), 2.0f);
  const auto silu = [](double g) { return g / (1.0 + std::exp(-g)); };
  EXPECT_NEAR(out[0], silu(2.0) * 2.0, 1e-6);    // gate clamped to 2, up clamped to 2
  EXPECT_NEAR(out[1], silu(-4.0) * -2.0, 1e-6);  // up clamped to -2
  EXPECT_NEAR(out[2], silu(0.5) * 0.25, 1e-6);
  const std::vector<float> x = {1.0f, 2.0f, 4.0f, 9.0f}, w = {1.0f, 2.0f, 0.5f, 1.0f}, b = {0.0f, 1.0f, 0.0f, -1.0f};
  std::vector<float> y(4);
  layernorm(x.data(), 1, 4, w.data(), b.data(), 1e-6f, y.data());
  const double mean = 4.0, sd = std::sqrt((9.0 + 4.0 + 0.0 + 25.0) / 4.0 + 1e-6);
  for (int i = 0; i < 4; ++i) EXPECT_NEAR(y[size_t(i)], (x[size_t(i)] - mean) / sd * w[size_t(i)] + b[size_t(i)], 1e-6);
}

}  // namespace
}  // namespace moet
