// The CPU backend's fused ops are their parts run in order, bit for bit: add_rmsnorm is add then
// rmsnorm, qk_norm_rope is rmsnorm per head (when the norm weights are given) then rope, for q
// and k. The CPU backend is the reference the CUDA backend and the golden fixtures are held to,
// so fusing must not move a bit. Also: the per-op profile names the fused ops.
#include "../random_values.h"
#include "backend/cpu/cpu_backend.h"
#include "core/error.h"

#include <gtest/gtest.h>

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
  auto backend = cpu_backend_create(2);
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
TEST(CpuBackend, ReadRegionsXorsEveryWord) {
  auto backend = cpu_backend_create(2);
  alignas(16) const uint32_t a[4] = {1, 2, 3, 4};
  alignas(16) const uint32_t b[8] = {4, 3, 2, 1, 8, 0, 0, 0x100};
  Tensor sink = backend->alloc({1}, DType::i32);
  backend->read_regions({{a, 16}, {b, 32}, {b, 0}}, sink);
  EXPECT_EQ(0x108u, *sink.as<uint32_t>());
  EXPECT_THROW(backend->read_regions({{a, 12}}, sink), Error);
  EXPECT_THROW(backend->read_regions({{a + 1, 16}}, sink), Error);
  EXPECT_THROW(backend->read_regions(std::vector<ByteRegion>(257, ByteRegion{a, 16}), sink), Error);
}

TEST(CpuBackend, QkNormRopeIsRmsNormThenRope) {
  auto backend = cpu_backend_create(2);
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
  auto backend = cpu_backend_create(1);
  const std::vector<int32_t> tokens = {0}, positions = {5}, row_seq = {0}, table = {0};
  const std::vector<int64_t> slots = {0};
  const int32_t* tables[] = {table.data()};
  backend->begin_step({1, tokens.data(), positions.data(), row_seq.data(), slots.data(), 1, tables, 16});
  Tensor residual = tensor(*backend, random_floats(32, 8), {1, 32}), out = backend->alloc({1, 32});
  const Tensor delta = tensor(*backend, random_floats(32, 13), {1, 32});
  const Tensor weight = tensor(*backend, random_floats(32, 9), {32});
  Tensor q = tensor(*backend, random_floats(32, 10), {1, 32}), k = tensor(*backend, random_floats(16, 11), {1, 16});
  const Tensor norm = tensor(*backend, random_floats(16, 12), {16});
  backend->set_profiling(true);
  backend->add_rmsnorm(residual, delta, weight, kEps, out);
  backend->qk_norm_rope(rope_table(16, false), q, 2, k, 1, 16, norm, norm, kEps);
  std::map<std::string, int64_t> calls;
  for (const OpProfile& op : backend->take_profile()) calls[op.op] = op.calls;
  EXPECT_EQ(calls, (std::map<std::string, int64_t>{{"add_rmsnorm[dim=32]", 1}, {"qk_norm_rope[dim=16]", 1}}));
}

}  // namespace
}  // namespace moet
