// The CPU backend's fused ops are their parts run in order, bit for bit: add_rmsnorm is add then
// rmsnorm, qk_norm_rope is rmsnorm per head (when the norm weights are given) then rope, for q
// and k. The CPU backend is the reference the CUDA backend and the golden fixtures are held to,
// so fusing must not move a bit. Also: the per-op profile names the fused ops, and an absent
// expert (tiered residency) contributes exactly nothing to moe_experts.
#include "../cpu_isa_env.h"
#include "../random_values.h"
#include "backend/bench_ops.h"
#include "backend/cpu/cpu_backend.h"
#include "core/error.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <random>
#include <vector>

namespace moet {
namespace {

constexpr float kEps = 1e-6f;

Tensor tensor(Backend& backend, const std::vector<float>& values, std::vector<int64_t> shape) {
  Tensor t = backend.alloc(std::move(shape));
  backend.from_host(values.data(), t);
  return t;
}

bool same_bits(const Tensor& a, const Tensor& b) {
  return a.numel() == b.numel() && std::memcmp(a.data, b.data, a.bytes()) == 0;
}

RopeTable rope_table(int64_t rot_dim, bool interleaved) {
  RopeTable table;
  for (int64_t i = 0; i < rot_dim / 2; ++i)
    table.inv_freq.push_back(float(std::pow(1e6, -2.0 * double(i) / double(rot_dim))));
  table.scale = 1.1f;
  table.interleaved = interleaved;
  return table;
}

TEST(CpuBackend, AddRmsNormIsAddThenRmsNorm) {
  auto backend = cpu_backend_create({2, test_cpu_isa()});
  for (int64_t hidden : {96, 4096}) {
    for (int64_t rows : {1, 5}) {
      const auto residual_values = random_floats(size_t(rows * hidden), 1, 4.0f);
      const auto delta = tensor(*backend, random_floats(size_t(rows * hidden), 2), {rows, hidden});
      const auto weight = tensor(*backend, random_floats(size_t(hidden), 3), {hidden});
      Tensor fused = tensor(*backend, residual_values, {rows, hidden}), fused_out = backend->alloc({rows, hidden});
      Tensor parts = tensor(*backend, residual_values, {rows, hidden}), parts_out = backend->alloc({rows, hidden});
      backend->add_rmsnorm(fused, delta, weight, kEps, fused_out);
      backend->add(parts, delta);
      backend->rmsnorm(parts, weight, kEps, parts_out);
      EXPECT_TRUE(same_bits(fused, parts)) << "residual, hidden " << hidden << " rows " << rows;
      EXPECT_TRUE(same_bits(fused_out, parts_out)) << "normed, hidden " << hidden << " rows " << rows;
    }
  }
}

// read_regions folds every 32-bit word of every region by XOR (the benchmarks' read reference),
// and refuses regions it cannot read whole 16 bytes at a time.
// A vocab-parallel rank's embedding: rows [first_row, first_row + rows) of the table, zeros for
// the other tokens; the parts of all ranks add up to the whole lookup bit for bit.
TEST(CpuBackend, EmbeddingOfARowRangeIsZeroOutsideIt) {
  auto backend = cpu_backend_create({1, test_cpu_isa()});
  const int64_t vocab = 10, dim = 6;
  const auto table = random_floats(size_t(vocab * dim), 4);
  const std::vector<int32_t> tokens = {0, 5, 9, 4}, positions = {0, 1, 2, 3}, row_seq = {0, 0, 0, 0};
  const std::vector<int64_t> slots = {0, 1, 2, 3};
  backend->begin_step({4, tokens.data(), positions.data(), row_seq.data(), slots.data(), 0, nullptr, 4, vocab});
  const Tensor whole_table = tensor(*backend, table, {vocab, dim});
  Tensor whole = backend->alloc({4, dim}), sum = backend->alloc({4, dim}), part = backend->alloc({4, dim});
  backend->embedding(whole_table, 0, whole);
  backend->fill_zero(sum);
  for (int64_t first : {0, 5}) {
    const std::vector<float> own(table.begin() + first * dim, table.begin() + (first + 5) * dim);
    const Tensor rows = tensor(*backend, own, {5, dim});
    backend->embedding(rows, first, part);
    for (int64_t t = 0; t < 4; ++t) {
      const bool inside = tokens[size_t(t)] >= first && tokens[size_t(t)] < first + 5;
      for (int64_t i = 0; i < dim; ++i)
        EXPECT_EQ(part.as<float>()[t * dim + i], inside ? table[size_t(tokens[size_t(t)] * dim + i)] : 0.0f);
    }
    backend->add(sum, part);
  }
  EXPECT_TRUE(same_bits(sum, whole));
  const std::vector<int32_t> bad = {10};
  backend->begin_step({1, bad.data(), positions.data(), row_seq.data(), slots.data(), 0, nullptr, 4, vocab});
  EXPECT_THROW(backend->embedding(whole_table, 0, whole), Error);  // outside the vocabulary, not a zero row
}

TEST(CpuBackend, ReadRegionsXorsEveryWord) {
  auto backend = cpu_backend_create({2, test_cpu_isa()});
  alignas(16) const uint32_t a[4] = {1, 2, 3, 4};
  alignas(16) const uint32_t b[8] = {4, 3, 2, 1, 8, 0, 0, 0x100};
  Tensor sink = backend->alloc({1}, DType::i32);
  BenchOps& ops = bench_ops(*backend);
  ops.read_regions({{a, 16}, {b, 32}, {b, 0}}, sink);
  EXPECT_EQ(0x108u, *sink.as<uint32_t>());
  EXPECT_THROW(ops.read_regions({{a, 12}}, sink), Error);
  EXPECT_THROW(ops.read_regions({{a + 1, 16}}, sink), Error);
  EXPECT_THROW(ops.read_regions(std::vector<ByteRegion>(257, ByteRegion{a, 16}), sink), Error);
}

TEST(CpuBackend, QkNormRopeIsRmsNormThenRope) {
  auto backend = cpu_backend_create({2, test_cpu_isa()});
  const std::vector<int32_t> tokens(3, 0), positions = {0, 4093, 131071}, row_seq(3, 0), table(1, 0);
  const std::vector<int64_t> slots = {0, 1, 2};
  const int32_t* tables[] = {table.data()};
  backend->begin_step({3, tokens.data(), positions.data(), row_seq.data(), slots.data(), 1, tables, 16});
  const int64_t rows = 3, q_heads = 8, k_heads = 2, head_dim = 64;
  for (const bool norm : {true, false}) {
    for (const int64_t rot_dim : {64, 32}) {
      for (const bool interleaved : {false, true}) {
        const RopeTable rope = rope_table(rot_dim, interleaved);
        const auto q_values = random_floats(size_t(rows * q_heads * head_dim), 4, 2.0f);
        const auto k_values = random_floats(size_t(rows * k_heads * head_dim), 5, 2.0f);
        const Tensor q_norm = norm ? tensor(*backend, random_floats(size_t(head_dim), 6), {head_dim}) : Tensor{};
        const Tensor k_norm = norm ? tensor(*backend, random_floats(size_t(head_dim), 7), {head_dim}) : Tensor{};
        Tensor q = tensor(*backend, q_values, {rows, q_heads * head_dim});
        Tensor k = tensor(*backend, k_values, {rows, k_heads * head_dim});
        backend->qk_norm_rope(rope, q, q_heads, k, k_heads, head_dim, q_norm, k_norm, kEps);
        Tensor q_parts = tensor(*backend, q_values, {rows, q_heads * head_dim});
        Tensor k_parts = tensor(*backend, k_values, {rows, k_heads * head_dim});
        if (norm) {
          backend->rmsnorm(q_parts, q_norm, kEps, q_parts);
          backend->rmsnorm(k_parts, k_norm, kEps, k_parts);
        }
        backend->rope(rope, q_parts, q_heads, head_dim, 0);
        backend->rope(rope, k_parts, k_heads, head_dim, 0);
        EXPECT_TRUE(same_bits(q, q_parts) && same_bits(k, k_parts))
            << "norm " << norm << " rot_dim " << rot_dim << " interleaved " << interleaved;
      }
    }
  }
}

TEST(CpuBackend, ProfileNamesTheFusedOps) {
  auto backend = cpu_backend_create({1, test_cpu_isa()});
  const std::vector<int32_t> tokens = {0}, positions = {5}, row_seq = {0}, table = {0};
  const std::vector<int64_t> slots = {0};
  const int32_t* tables[] = {table.data()};
  backend->begin_step({1, tokens.data(), positions.data(), row_seq.data(), slots.data(), 1, tables, 16});
  Tensor residual = tensor(*backend, random_floats(32, 8), {1, 32}), out = backend->alloc({1, 32});
  const Tensor delta = tensor(*backend, random_floats(32, 13), {1, 32});
  const Tensor weight = tensor(*backend, random_floats(32, 9), {32});
  Tensor q = tensor(*backend, random_floats(32, 10), {1, 32}), k = tensor(*backend, random_floats(16, 11), {1, 16});
  const Tensor norm = tensor(*backend, random_floats(16, 12), {16});
  bench_ops(*backend).set_profiling(true);
  backend->add_rmsnorm(residual, delta, weight, kEps, out);
  backend->qk_norm_rope(rope_table(16, false), q, 2, k, 1, 16, norm, norm, kEps);
  std::map<std::string, int64_t> calls;
  for (const OpProfile& op : bench_ops(*backend).take_profile()) calls[op.op] = op.calls;
  EXPECT_EQ(calls, (std::map<std::string, int64_t>{{"add_rmsnorm[dim=32]", 1}, {"qk_norm_rope[dim=16]", 1}}));
}

// A layer of `count` experts of hidden x inner in `format` (dense F32, or W2 or MXFP4 planes of
// random codes and scales near 2^-4); `absent` experts have no tensors.
ExpertSet expert_layer(Backend& backend, ExpertFormat format, int64_t count, int64_t hidden, int64_t inner,
                       const std::vector<int64_t>& absent) {
  std::vector<ExpertWeights> experts;
  std::mt19937_64 rng(77);
  const int64_t codes_per_byte = format == ExpertFormat::fp4 ? 2 : 4;
  const auto plane = [&](DType dtype, std::vector<int64_t> shape, bool scales) {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    std::vector<uint8_t> bytes(size_t(n) * dtype_size(dtype));
    if (dtype == DType::f32) {
      const auto values = random_floats(size_t(n), rng(), 0.2f);
      std::memcpy(bytes.data(), values.data(), bytes.size());
    } else {
      for (auto& b : bytes) b = scales ? uint8_t(119 + rng() % 6) : uint8_t(rng());
    }
    return backend.upload(HostTensor{"expert", dtype, std::move(shape), bytes.data(), bytes.size(), "(test)"});
  };
  for (int64_t e = 0; e < count; ++e) {
    ExpertWeights w;
    w.format = format;
    if (format == ExpertFormat::dense) {
      w.gate_up = plane(DType::f32, {2 * inner, hidden}, false);
      w.down = plane(DType::f32, {hidden, inner}, false);
    } else {
      w.gate_up = plane(DType::u8, {2 * inner, hidden / codes_per_byte}, false);
      w.gate_up_scales = plane(DType::u8, {2 * inner, hidden / 32}, true);
      w.down = plane(DType::u8, {hidden, inner / codes_per_byte}, false);
      w.down_scales = plane(DType::u8, {hidden, inner / 32}, true);
    }
    if (std::count(absent.begin(), absent.end(), e)) w = ExpertWeights{};
    experts.push_back(std::move(w));
  }
  return backend.expert_set({format, hidden, inner}, std::move(experts));
}

// Rows routed to an absent expert get exactly what they get when the router names no expert in
// that slot (an id of -1), for dense and W2 experts: the absent expert adds nothing, bit for bit.
TEST(CpuBackend, AbsentExpertsContributeNothing) {
  auto backend = cpu_backend_create({2, test_cpu_isa()});
  const int64_t rows = 6, hidden = 64, inner = 32, count = 6, top_k = 3;
  const std::vector<int64_t> absent = {1, 4};
  std::vector<int32_t> ids(size_t(rows * top_k)), dropped;
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = int32_t((i * 5 + i / 3) % count);
  for (int32_t id : ids) dropped.push_back(std::count(absent.begin(), absent.end(), id) ? -1 : id);
  ASSERT_NE(ids, dropped);
  const Tensor x = tensor(*backend, random_floats(size_t(rows * hidden), 21), {rows, hidden});
  const Tensor weights = tensor(*backend, random_floats(size_t(rows * top_k), 22), {rows, top_k});
  const auto int_tensor = [&](const std::vector<int32_t>& values) {
    Tensor t = backend->alloc({rows, top_k}, DType::i32);
    backend->from_host(values.data(), t);
    return t;
  };
  for (const ExpertFormat format : {ExpertFormat::dense, ExpertFormat::w2}) {
    const ExpertSet full = expert_layer(*backend, format, count, hidden, inner, {});
    const ExpertSet partial = expert_layer(*backend, format, count, hidden, inner, absent);
    EXPECT_FALSE(partial.experts[1].present());
    EXPECT_TRUE(partial.experts[2].present());
    Tensor with_absent = backend->alloc({rows, hidden}), unrouted = backend->alloc({rows, hidden});
    Tensor resident = backend->alloc({rows, hidden});
    backend->moe_experts(x, partial, int_tensor(ids), weights, with_absent);
    backend->moe_experts(x, full, int_tensor(dropped), weights, unrouted);
    backend->moe_experts(x, full, int_tensor(ids), weights, resident);
    EXPECT_TRUE(same_bits(with_absent, unrouted)) << int(format);
    EXPECT_FALSE(same_bits(with_absent, resident)) << int(format);
  }
}

// A W2 layer holding some experts at FP4 (the recovery tier) computes each expert in its own
// format: bit for bit, each row is the sum of weight * that expert's output as a layer of that
// expert alone gives it (its W2 or its FP4 weights), its W2 experts in ascending order first, then
// its FP4 ones; routings of tier experts are counted apart; experts of a third format are refused.
TEST(CpuBackend, TierExpertsRunInTheirOwnFormat) {
  auto backend = cpu_backend_create({2, test_cpu_isa()});
  const int64_t rows = 5, hidden = 64, inner = 32, count = 6, top_k = 3;
  const std::vector<int64_t> fp4 = {0, 3, 4};
  std::vector<int32_t> ids(static_cast<size_t>(rows * top_k));
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t s = 0; s < top_k; ++s) ids[size_t(r * top_k + s)] = int32_t((r * 2 + s * 5) % count);
  const Tensor x = tensor(*backend, random_floats(size_t(rows * hidden), 31), {rows, hidden});
  const Tensor weights = tensor(*backend, random_floats(size_t(rows * top_k), 32), {rows, top_k});
  Tensor id_tensor = backend->alloc({rows, top_k}, DType::i32);
  backend->from_host(ids.data(), id_tensor);
  const ExpertSet w2 = expert_layer(*backend, ExpertFormat::w2, count, hidden, inner, {});
  const ExpertSet mx = expert_layer(*backend, ExpertFormat::fp4, count, hidden, inner, {});
  const std::vector<ExpertWeights> tier_entries = {mx.experts[0], mx.experts[3], mx.experts[4]};
  ExpertSet mixed = w2;
  EXPECT_THROW(backend->expert_set_update(mixed, fp4, tier_entries), Error) << "FP4 entries need the tier";
  backend->expert_set_add_tier(mixed, ExpertFormat::fp4);
  backend->expert_set_update(mixed, fp4, tier_entries);
  std::vector<int32_t> counters(4 + 2, 0);  // miss_count, routed_items[3], absent bits, used bits
  Tensor tracking = tensor(*backend, std::vector<float>(counters.size(), 0.0f), {int64_t(counters.size())});
  int32_t* track = tracking.as<int32_t>();
  mixed.tracking = {reinterpret_cast<uint32_t*>(track + 4), reinterpret_cast<uint32_t*>(track + 5), track, track + 1};
  Tensor out = backend->alloc({rows, hidden});
  backend->moe_experts(x, mixed, id_tensor, weights, out);
  // Each expert alone, weight 1: its output for every row (0 + 1 * y = y exactly).
  const Tensor ones = tensor(*backend, std::vector<float>(size_t(rows * top_k), 1.0f), {rows, top_k});
  std::vector<std::vector<float>> alone(static_cast<size_t>(count));
  for (int64_t e = 0; e < count; ++e) {
    const bool at_fp4 = std::count(fp4.begin(), fp4.end(), e) > 0;
    std::vector<ExpertWeights> only(static_cast<size_t>(count));
    only[size_t(e)] = (at_fp4 ? mx : w2).experts[size_t(e)];
    const ExpertSet single = backend->expert_set({at_fp4 ? ExpertFormat::fp4 : ExpertFormat::w2, hidden, inner}, only);
    Tensor y = backend->alloc({rows, hidden});
    backend->moe_experts(x, single, id_tensor, ones, y);
    alone[size_t(e)].assign(y.as<float>(), y.as<float>() + rows * hidden);
  }
  std::vector<int64_t> order;  // W2 experts, then FP4 ones
  for (const bool tier : {false, true})
    for (int64_t e = 0; e < count; ++e)
      if ((std::count(fp4.begin(), fp4.end(), e) > 0) == tier) order.push_back(e);
  std::vector<float> want(size_t(rows * hidden), 0.0f);
  for (int64_t r = 0; r < rows; ++r)
    for (const int64_t e : order)
      for (int64_t s = 0; s < top_k; ++s) {
        if (ids[size_t(r * top_k + s)] != e) continue;
        const float w = weights.as<float>()[r * top_k + s];
        for (int64_t d = 0; d < hidden; ++d)
          want[size_t(r * hidden + d)] += w * alone[size_t(e)][size_t(r * hidden + d)];
      }
  EXPECT_EQ(0, std::memcmp(want.data(), out.data, want.size() * sizeof(float)));
  int64_t tier_routings = 0;
  for (int32_t id : ids) tier_routings += std::count(fp4.begin(), fp4.end(), id);
  EXPECT_EQ(track[0], 0);  // no miss
  EXPECT_EQ(track[1], rows * top_k - tier_routings);
  EXPECT_EQ(track[3], tier_routings);
  const ExpertSet dense = expert_layer(*backend, ExpertFormat::dense, count, hidden, inner, {});
  EXPECT_THROW(backend->expert_set_update(mixed, std::vector<int64_t>{1}, std::vector<ExpertWeights>{dense.experts[1]}),
               Error)
      << "only the tier's format";
}

// expert_set() refuses a present expert whose shapes are not the layout's.
TEST(CpuBackend, ExpertSetChecksTheLayout) {
  auto backend = cpu_backend_create({1, test_cpu_isa()});
  ExpertSet good = expert_layer(*backend, ExpertFormat::w2, 2, 64, 32, {});
  EXPECT_THROW(backend->expert_set({ExpertFormat::w2, 64, 64}, good.experts), Error);
  EXPECT_THROW(backend->expert_set({ExpertFormat::fp4, 64, 32}, good.experts), Error);
  EXPECT_NO_THROW(backend->expert_set({ExpertFormat::w2, 64, 32}, {ExpertWeights{}, good.experts[1]}));
}

}  // namespace
}  // namespace moet
