// The host experts' kernel (kernels/cpu/expert_ffn.h): one W2 / MXFP4 expert's SwiGLU FFN gives
// exactly what the CPU backend's MoE op computes for that expert (the op's per-expert work), and
// stays within FP32 rounding of a float64 evaluation of the dequantized expert; the W2 products
// sharing a block's decoding among rows (kernels/cpu/w2_rows.h) give matmul_w2's bits for any
// number of rows on every level, and the avx512 level the avx2 level's bits.
#include "../cpu_isa_env.h"
#include "../random_values.h"
#include "backend/cpu/cpu_backend.h"
#include "formats/mx_block.h"
#include "kernels/cpu/expert_ffn.h"
#include "kernels/cpu/w2_matmul.h"
#include "kernels/cpu/w2_rows.h"

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>

namespace moet {
namespace {

constexpr int64_t kHidden = 96, kInner = 64, kRows = 3;

// A random block-format expert: codes any bytes, scales around 2^-4.
struct Expert {
  int bits;
  std::vector<uint8_t> gate_up_codes, gate_up_scales, down_codes, down_scales;

  explicit Expert(int b, uint64_t seed) : bits(b) {
    std::mt19937_64 rng(seed);
    const auto bytes = [&](size_t n, bool scale) {
      std::vector<uint8_t> v(n);
      for (auto& x : v) x = scale ? uint8_t(119 + rng() % 4) : uint8_t(rng());
      return v;
    };
    gate_up_codes = bytes(size_t(2 * kInner * kHidden * bits / 8), false);
    gate_up_scales = bytes(size_t(2 * kInner * kHidden / 32), true);
    down_codes = bytes(size_t(kHidden * kInner * bits / 8), false);
    down_scales = bytes(size_t(kHidden * kInner / 32), true);
  }
  BlockExpertPlanes planes() const {
    return {gate_up_codes.data(), gate_up_scales.data(), down_codes.data(), down_scales.data(), bits};
  }
  // Row r of a [rows, cols] plane pair as floats.
  std::vector<float> row(const std::vector<uint8_t>& codes, const std::vector<uint8_t>& scales, int64_t r,
                         int64_t cols) const {
    std::vector<float> out(static_cast<size_t>(cols));
    const uint8_t* c = codes.data() + r * cols * bits / 8;
    const uint8_t* s = scales.data() + r * (cols / 32);
    (bits == 2 ? w2_dequant_row : mxfp4_dequant_row)(c, s, cols, out.data());
    return out;
  }
};

std::vector<float> run_kernel(const Expert& e, const std::vector<float>& x, int threads) {
  ThreadPool pool(threads);
  std::vector<float> scratch(size_t(block_expert_ffn_scratch(kRows, kInner))), out(size_t(kRows * kHidden));
  block_expert_ffn(x.data(), kRows, kHidden, kInner, e.planes(), scratch.data(), out.data(), pool, test_cpu_isa());
  return out;
}

Tensor plane(Backend& b, const std::vector<uint8_t>& bytes, std::vector<int64_t> shape) {
  HostTensor info;
  info.dtype = DType::u8;
  info.shape = std::move(shape);
  info.data = bytes.data();
  info.bytes = bytes.size();
  return b.upload(info);
}

TEST(ExpertFfn, GivesTheCpuMoeOpsBitsForThatExpert) {
  for (const int bits : {2, 4}) {
    const Expert e(bits, 7 + uint64_t(bits));
    const std::vector<float> x = random_floats(size_t(kRows * kHidden), 11);
    auto backend = cpu_backend_create({2, test_cpu_isa()});
    const ExpertFormat format = bits == 2 ? ExpertFormat::w2 : ExpertFormat::fp4;
    ExpertWeights w{plane(*backend, e.gate_up_codes, {2 * kInner, kHidden * bits / 8}),
                    plane(*backend, e.down_codes, {kHidden, kInner * bits / 8}), format,
                    plane(*backend, e.gate_up_scales, {2 * kInner, kHidden / 32}),
                    plane(*backend, e.down_scales, {kHidden, kInner / 32})};
    const ExpertSet set = backend->expert_set({format, kHidden, kInner}, {w});
    Tensor xt = backend->alloc({kRows, kHidden}), ids = backend->alloc({kRows, 1}, DType::i32);
    Tensor weights = backend->alloc({kRows, 1}), out = backend->alloc({kRows, kHidden});
    backend->from_host(x.data(), xt);
    const std::vector<int32_t> zero(kRows, 0);
    const std::vector<float> one(kRows, 1.0f);
    backend->from_host(zero.data(), ids);
    backend->from_host(one.data(), weights);
    backend->moe_experts(xt, set, ids, weights, out);
    std::vector<float> op(size_t(kRows * kHidden));
    backend->to_host(out, op.data());
    const std::vector<float> kernel = run_kernel(e, x, 2);
    for (size_t i = 0; i < op.size(); ++i) ASSERT_EQ(kernel[i], op[i]) << bits << " bits, element " << i;
    EXPECT_EQ(kernel, run_kernel(e, x, 1)) << "independent of the thread count";
  }
}

// The float64 result and a bound on the FP32 kernel's error: every dot product of n terms errs by
// at most n * 2^-24 times the sum of its terms' magnitudes (the worst case of a sum in any order),
// the gate and up errors carried through SiLU-and-mul by its derivatives, then through the down product.
TEST(ExpertFfn, WithinFp32RoundingOfFloat64) {
  const double eps = std::ldexp(1.0, -24);
  for (const int bits : {2, 4}) {
    const Expert e(bits, 21 + uint64_t(bits));
    const std::vector<float> x = random_floats(size_t(kRows * kHidden), 5);
    const std::vector<float> got = run_kernel(e, x, 2);
    double worst = 0;
    for (int64_t t = 0; t < kRows; ++t) {
      std::vector<double> act(static_cast<size_t>(kInner)), act_err(static_cast<size_t>(kInner));
      for (int64_t j = 0; j < kInner; ++j) {
        const std::vector<float> g = e.row(e.gate_up_codes, e.gate_up_scales, j, kHidden);
        const std::vector<float> u = e.row(e.gate_up_codes, e.gate_up_scales, kInner + j, kHidden);
        double gate = 0, up = 0, gate_abs = 0, up_abs = 0;
        for (int64_t k = 0; k < kHidden; ++k) {
          const double xv = x[size_t(t * kHidden + k)];
          gate += double(g[size_t(k)]) * xv;
          up += double(u[size_t(k)]) * xv;
          gate_abs += std::abs(double(g[size_t(k)]) * xv);
          up_abs += std::abs(double(u[size_t(k)]) * xv);
        }
        const double sig = 1.0 / (1.0 + std::exp(-gate)), silu = gate * sig, dsilu = sig * (1.0 + gate * (1.0 - sig));
        act[size_t(j)] = silu * up;
        act_err[size_t(j)] = double(kHidden) * eps * (std::abs(dsilu * up) * gate_abs + std::abs(silu) * up_abs) +
                             4 * eps * std::abs(act[size_t(j)]);
      }
      for (int64_t n = 0; n < kHidden; ++n) {
        const std::vector<float> d = e.row(e.down_codes, e.down_scales, n, kInner);
        double want = 0, magnitude = 0, carried = 0;
        for (int64_t j = 0; j < kInner; ++j) {
          want += double(d[size_t(j)]) * act[size_t(j)];
          magnitude += std::abs(double(d[size_t(j)]) * act[size_t(j)]);
          carried += std::abs(double(d[size_t(j)])) * act_err[size_t(j)];
        }
        const double bound = double(kInner) * eps * magnitude + carried;
        const double err = std::abs(double(got[size_t(t * kHidden + n)]) - want);
        EXPECT_LE(err, bound) << bits << " bits, row " << t << " column " << n;
        worst = std::max(worst, err / std::max(bound, 1e-300));
      }
    }
    EXPECT_GT(worst, 0.0) << "the kernel rounds (a float64 kernel would make this test vacuous)";
  }
}

// On every level (skipped where the CPU lacks it), over K multiples of 32 but not all of 64, 128
// or 256, N odd and 1, and row counts across passes: matmul_w2_rows gives matmul_w2's bits, and
// the avx512 level gives the avx2 level's (two columns per register, each with AVX2's operations).
class W2Rows : public testing::TestWithParam<CpuIsa> {};

TEST_P(W2Rows, GiveMatmulW2sBitsForAnyRowCount) {
  const CpuIsa isa = GetParam();
  if (!cpu_supports(isa)) GTEST_SKIP() << cpu_isa_missing(isa);
  std::mt19937_64 rng(3);
  for (const int64_t k : {int64_t(32), int64_t(96), int64_t(192), int64_t(2080)}) {
    for (const int64_t n : {int64_t(1), int64_t(37)}) {
      std::vector<uint8_t> codes(size_t(n * k / 4)), scales(size_t(n * k / 32));
      for (auto& c : codes) c = uint8_t(rng());
      for (auto& s : scales) s = uint8_t(110 + rng() % 20);
      for (int64_t rows = 1; rows <= 2 * kW2RowsPerPass + 1; ++rows) {
        const std::vector<float> x = random_floats(size_t(rows * k), uint64_t(k + rows));
        std::vector<float> want(size_t(rows * n)), got(size_t(rows * n)), on_avx2(size_t(rows * n));
        for (const int threads : {1, 2}) {
          ThreadPool pool(threads);
          const auto where = [&] { return fmt::format("k {} n {} rows {} threads {}", k, n, rows, threads); };
          matmul_w2(x.data(), rows, k, codes.data(), scales.data(), n, want.data(), pool, isa);
          matmul_w2_rows(x.data(), rows, k, codes.data(), scales.data(), n, got.data(), pool, isa);
          ASSERT_EQ(0, std::memcmp(want.data(), got.data(), want.size() * sizeof(float))) << where();
          if (isa != CpuIsa::avx512) continue;
          matmul_w2_rows(x.data(), rows, k, codes.data(), scales.data(), n, on_avx2.data(), pool, CpuIsa::avx2);
          ASSERT_EQ(0, std::memcmp(on_avx2.data(), got.data(), got.size() * sizeof(float))) << "vs avx2: " << where();
        }
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Levels, W2Rows, testing::ValuesIn(kCpuIsas),
                         [](const auto& info) { return std::string(cpu_isa_name(info.param)); });

}  // namespace
}  // namespace moet
