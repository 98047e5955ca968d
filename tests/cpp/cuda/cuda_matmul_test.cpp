// The CUDA backend's products against the CPU backend (the reference) on random inputs: BF16, F32
// and FP8-block weights on the vector and scalar paths, the CUDA-core GEMV and the tensor-core one
// (kernels/cuda/gemv_mma.h: large BF16 and FP8-block products from 4 rows), matmul_group, per-head
// products; decode shapes of 128..40000 columns over 512..16384 with 1..8 rows and 1..36 rows on
// the GEMV (split K in a block, several passes); plus batch invariance (a row's bits do not depend
// on the other rows or its place among them, for row counts taking the same kernel) and run-to-run
// bit-identity. Skips with a message when no GPU is visible.
#include "gpu_test_util.h"

#include "core/error.h"

#include <fmt/format.h>

#include <string>

namespace moet::test {
namespace {

constexpr double kTol = 2e-5;

TEST(CudaOps, MatmulMatchesCpu) {
  MOET_SKIP_WITHOUT_GPU();
  BackendPair p;
  for (int64_t k : {64, 200, 1032, 3}) {
    for (int64_t rows : {1, 3, 8, 13}) {
      for (bool bf16 : {true, false}) {
        const int64_t n = 37;
        const auto wf = random_floats(size_t(n * k), uint64_t(k), 0.05f);
        const auto wb = to_bf16(wf);
        auto w = bf16 ? p.weight(wb.data(), DType::bf16, {n, k}) : p.weight(wf.data(), DType::f32, {n, k});
        auto x = p.activation(random_floats(size_t(rows * k), uint64_t(rows)), {rows, k});
        auto bias = p.activation(random_floats(size_t(n), 9), {n});
        auto y = p.alloc({rows, n});
        p.cpu->matmul(x.first, w.first, &bias.first, y.first);
        p.gpu->matmul(x.second, w.second, &bias.second, y.second);
        EXPECT_LT(max_rel_diff(p, y), kTol) << "k " << k << " rows " << rows << " bf16 " << bf16;
      }
    }
  }
}

TEST(CudaOps, MatmulIsBatchInvariantAndDeterministic) {
  MOET_SKIP_WITHOUT_GPU();
  BackendPair p;
  const int64_t k = 512, n = 300, rows = 11;
  const auto wb = to_bf16(random_floats(size_t(n * k), 1, 0.05f));
  Tensor w = p.weight(wb.data(), DType::bf16, {n, k}).second;
  const auto xs = random_floats(size_t(rows * k), 2);
  Tensor x = p.activation(xs, {rows, k}).second, x1 = p.activation({xs.begin(), xs.begin() + k}, {1, k}).second;
  Tensor y = p.gpu->alloc({rows, n}), y_again = p.gpu->alloc({rows, n}), y1 = p.gpu->alloc({1, n});
  p.gpu->matmul(x, w, nullptr, y);
  p.gpu->matmul(x, w, nullptr, y_again);
  p.gpu->matmul(x1, w, nullptr, y1);
  const auto all = host(*p.gpu, y), again = host(*p.gpu, y_again), one = host(*p.gpu, y1);
  EXPECT_EQ(0, std::memcmp(all.data(), again.data(), all.size() * sizeof(float)));
  EXPECT_EQ(0, std::memcmp(all.data(), one.data(), one.size() * sizeof(float)));
}

// matmul_group (GQA's q, k and v in one launch): against the CPU backend's products, and bit for
// bit against one GPU matmul() per part; parts of different heights (q with S = 1, K/V split over
// 8 warps), a partial column tile with odd k (the scalar path), with and without biases, one row
// and several; more parts than one launch holds, and mixed weight types, run as separate launches.
TEST(CudaOps, MatmulGroupMatchesMatmuls) {
  MOET_SKIP_WITHOUT_GPU();
  BackendPair p;
  const std::vector<std::vector<int64_t>> heights = {{2048, 512, 512}, {131, 67}, {512, 512, 256, 128, 64}};
  const std::vector<int64_t> widths = {4096, 4099, 1024};
  for (size_t c = 0; c < heights.size(); ++c) {
    const int64_t k = widths[c];
    const size_t count = heights[c].size();
    for (int64_t rows : {1, 5}) {
      for (bool with_bias : {false, true}) {
        const std::string what = fmt::format("case {} k {} rows {} bias {}", c, k, rows, with_bias);
        auto x = p.activation(random_floats(size_t(rows * k), uint64_t(rows + k)), {rows, k});
        std::vector<std::pair<Tensor, Tensor>> w, bias, y;
        std::vector<MatmulPart> cpu_parts, gpu_parts;
        for (size_t i = 0; i < count; ++i) {
          const int64_t n = heights[c][i];
          // The mixed case's last part is F32: those launches fall back to one per part.
          const bool f32 = c == 2 && i + 1 == count;
          const auto values = random_floats(size_t(n * k), 11 + i, 0.02f);
          w.push_back(f32 ? p.weight(values.data(), DType::f32, {n, k})
                          : p.weight(to_bf16(values).data(), DType::bf16, {n, k}));
          bias.push_back(p.activation(random_floats(size_t(n), 31 + i), {n}));
          y.push_back(p.alloc({rows, n}));
        }
        for (size_t i = 0; i < count; ++i) {
          cpu_parts.push_back({&w[i].first, with_bias ? &bias[i].first : nullptr, &y[i].first});
          gpu_parts.push_back({&w[i].second, with_bias ? &bias[i].second : nullptr, &y[i].second});
        }
        p.cpu->matmul_group(x.first, cpu_parts);
        p.gpu->matmul_group(x.second, gpu_parts);
        for (size_t i = 0; i < count; ++i) {
          EXPECT_LT(max_rel_diff(p, y[i]), kTol) << what << " part " << i;
          Tensor alone = p.gpu->alloc({rows, heights[c][i]});
          p.gpu->matmul(x.second, w[i].second, with_bias ? &bias[i].second : nullptr, alone);
          const auto grouped = host(*p.gpu, y[i].second), one = host(*p.gpu, alone);
          EXPECT_EQ(0, std::memcmp(grouped.data(), one.data(), one.size() * sizeof(float))) << what << " part " << i;
        }
      }
    }
  }
  auto x = p.activation(random_floats(64, 1), {1, 64});
  auto w = p.weight(to_bf16(random_floats(64 * 8, 2)).data(), DType::bf16, {8, 64});
  auto w_wide = p.weight(to_bf16(random_floats(128 * 4, 3)).data(), DType::bf16, {4, 128});
  auto y = p.alloc({1, 8}), y_wide = p.alloc({1, 4});
  const MatmulPart mismatched[] = {{&w.second, nullptr, &y.second}, {&w_wide.second, nullptr, &y_wide.second}};
  EXPECT_THROW(p.gpu->matmul_group(x.second, mismatched), Error);
}

// Whether a product of `rows` rows takes the tensor-core GEMV (kernels/cuda/gemv_mma.h: BF16
// weights with k % 32 == 0 or FP8-block ones with k % 64 == 0, n >= 2048, 4 rows or more).
bool takes_tensor_cores(WeightType type, int64_t n, int64_t k, int64_t rows) {
  const bool shape = type == WeightType::bf16 ? k % 32 == 0 : type == WeightType::fp8 && k % 64 == 0;
  return shape && n >= 2048 && rows >= 4;
}

// The decode shapes of Qwen3-235B (q/o projections 8192 x 4096 / 4096 x 8192, K/V 512 x 4096,
// router 128 x 4096) and odd ones: 8 and 3 rows against the CPU; every row count 1..7
// bit-identical to the first rows of the 8-row result when both take the same kernel (batch
// invariance; shapes the tensor cores take from 4 rows give rows 1..3 the CUDA-core GEMV, checked
// against the 3-row result instead; one row takes a kernel of its own); the 8 rows reversed give
// the reversed bits (a row's place in the MMA tile does not matter); a second run bit-identical.
void check_decode_matmul(BackendPair& p, int64_t n, int64_t k, WeightType type) {
  const int64_t rows = 8;
  auto w = random_weight(p, type, n, k, uint64_t(n + k));
  const auto xs = random_floats(size_t(rows * k), uint64_t(n * k));
  auto x = p.activation(xs, {rows, k});
  auto bias = p.activation(random_floats(size_t(n), 5), {n});
  auto y = p.alloc({rows, n});
  p.cpu->matmul(x.first, w.first, &bias.first, y.first);
  p.gpu->matmul(x.second, w.second, &bias.second, y.second);
  const std::string what = "n " + std::to_string(n) + " k " + std::to_string(k) + " type " + std::to_string(int(type));
  EXPECT_LT(max_rel_diff(p, y), kTol) << what;
  const auto gpu = host(*p.gpu, y.second);
  const int64_t few = 3;
  auto x_few = p.activation({xs.begin(), xs.begin() + few * k}, {few, k});
  auto y_few = p.alloc({few, n});
  p.cpu->matmul(x_few.first, w.first, &bias.first, y_few.first);
  p.gpu->matmul(x_few.second, w.second, &bias.second, y_few.second);
  EXPECT_LT(max_rel_diff(p, y_few), kTol) << what << " rows " << few;
  const auto gpu_few = host(*p.gpu, y_few.second);
  for (int64_t r = 1; r < rows; ++r) {
    Tensor xr = p.activation({xs.begin(), xs.begin() + r * k}, {r, k}).second, yr = p.gpu->alloc({r, n});
    p.gpu->matmul(xr, w.second, &bias.second, yr);
    const auto part = host(*p.gpu, yr);
    const bool same_kernel = takes_tensor_cores(type, n, k, r) == takes_tensor_cores(type, n, k, rows);
    const auto& whole = same_kernel ? gpu : gpu_few;
    EXPECT_EQ(0, std::memcmp(part.data(), whole.data(), part.size() * sizeof(float))) << what << " rows " << r;
  }
  std::vector<float> reversed;
  for (int64_t r = rows - 1; r >= 0; --r) reversed.insert(reversed.end(), xs.begin() + r * k, xs.begin() + (r + 1) * k);
  Tensor xrev = p.activation(reversed, {rows, k}).second;
  Tensor yrev = p.gpu->alloc({rows, n}), again = p.gpu->alloc({rows, n});
  p.gpu->matmul(xrev, w.second, &bias.second, yrev);
  p.gpu->matmul(x.second, w.second, &bias.second, again);
  const auto rev = host(*p.gpu, yrev), twice = host(*p.gpu, again);
  for (int64_t r = 0; r < rows; ++r)
    EXPECT_EQ(0, std::memcmp(rev.data() + (rows - 1 - r) * n, gpu.data() + r * n, size_t(n) * sizeof(float)))
        << what << " reversed row " << r;
  EXPECT_EQ(0, std::memcmp(twice.data(), gpu.data(), gpu.size() * sizeof(float))) << what << " run to run";
}

TEST(CudaOps, DecodeMatmulShapesMatchCpu) {
  MOET_SKIP_WITHOUT_GPU();
  BackendPair p;
  for (int64_t k : {4096, 8192})
    for (int64_t n : {128, 512, 4096, 8192}) check_decode_matmul(p, n, k, WeightType::bf16);
  for (int64_t n : {128, 512, 4096}) check_decode_matmul(p, n, 4096, WeightType::f32);
  check_decode_matmul(p, 131, 4104, WeightType::bf16);  // a partial column tile and a partial 32-k step
  check_decode_matmul(p, 1000, 7168, WeightType::bf16); // DeepSeek-V3's hidden size
  check_decode_matmul(p, 40000, 512, WeightType::bf16); // several waves of warps: 4 loads in flight, not 2
  check_decode_matmul(p, 77, 4099, WeightType::bf16);   // odd k: the CUDA-core scalar path
  check_decode_matmul(p, 77, 4099, WeightType::f32);
}

// FP8-block weights: DeepSeek-V3's dense products (q_a 1536 x 7168, q_b 24576 x 1536, kv_a
// 576 x 7168, o 7168 x 16384, shared expert gate_up 4096 x 7168 and down 7168 x 2048: one slice
// or split K, whose slices start on block boundaries), partial blocks in both directions (131 x
// 1040), an LM-head-sized launch of several waves, k % 16 != 0 (the scalar path) and, on the
// tensor cores from 4 rows, a half block at the end of k with a partial tile (2100 x 1088), through
// check_decode_matmul: against the CPU within FP32 rounding (the GPU sums 16 codes (CUDA cores) or
// a 128-k block (tensor cores) times x, then scales the sum; the CPU scales each weight first) and
// batch-invariant by memcmp within each kernel.
TEST(CudaOps, Fp8BlockDecodeMatmulMatchesCpu) {
  MOET_SKIP_WITHOUT_GPU();
  BackendPair p;
  for (const auto& [n, k] : std::vector<std::pair<int64_t, int64_t>>{
           {1536, 7168}, {24576, 1536}, {576, 7168}, {7168, 16384}, {4096, 7168}, {7168, 2048}, {131, 1040},
           {40000, 512}, {77, 4104}, {77, 200}, {2100, 1088}})
    check_decode_matmul(p, n, k, WeightType::fp8);
}

// FP8-block and BF16 weights at 1..36 rows (several passes: 8 rows for the CUDA-core GEMV, 16 for
// the tensor-core one, which takes them from 4 rows when k % 32 (BF16) or 64 (FP8) is 0: n = 2051
// here) with a bias,
// at odd shapes, on the GEMV (a backend with gemm_min_rows 0: from 16 rows products otherwise take
// cuBLASLt, cuda_gemm_test.cpp): against the CPU; the 36-row result's first r rows bit-identical
// to an r-row launch taking the same kernel; in a matmul_group of three parts, bit-identical to
// one matmul per part.
TEST(CudaOps, MatmulRowsMatchCpu) {
  MOET_SKIP_WITHOUT_GPU();
  BackendPair p;
  CudaBackendOptions gemv_only;
  gemv_only.gemm_min_rows = 0;
  p.gpu = cuda_backend_create(gemv_only);
  const int64_t max_rows = 36;
  const int64_t n = 2051;
  for (WeightType type : {WeightType::fp8, WeightType::bf16}) {
    for (int64_t k : {64, 300, 720, 1040, 2048}) {
      auto w = random_weight(p, type, n, k, uint64_t(k));
      auto bias = p.activation(random_floats(size_t(n), 9), {n});
      const auto xs = random_floats(size_t(max_rows * k), uint64_t(k) + 1);
      auto x = p.activation(xs, {max_rows, k});
      auto y = p.alloc({max_rows, n});
      p.gpu->matmul(x.second, w.second, &bias.second, y.second);
      const auto all = host(*p.gpu, y.second);
      for (int64_t rows : {1, 2, 5, 8, 9, 16, 17, 20, 36}) {
        auto xr = p.activation({xs.begin(), xs.begin() + rows * k}, {rows, k});
        auto yr = p.alloc({rows, n});
        p.cpu->matmul(xr.first, w.first, &bias.first, yr.first);
        p.gpu->matmul(xr.second, w.second, &bias.second, yr.second);
        const std::string what = fmt::format("type {} k {} rows {}", int(type), k, rows);
        EXPECT_LT(max_rel_diff(p, yr), kTol) << what;
        const auto part = host(*p.gpu, yr.second);
        if (takes_tensor_cores(type, n, k, rows) == takes_tensor_cores(type, n, k, max_rows)) {
          EXPECT_EQ(0, std::memcmp(part.data(), all.data(), part.size() * sizeof(float))) << what;
        }
      }
    }
  }
  for (WeightType type : {WeightType::fp8, WeightType::bf16}) {
    const int64_t k = 1024, rows = 5;
    auto x = p.activation(random_floats(size_t(rows * k), 5), {rows, k});
    std::vector<std::pair<Tensor, Tensor>> w, y;
    std::vector<MatmulPart> parts;
    for (int64_t height : {2048, 576, 130}) {
      w.push_back(random_weight(p, type, height, k, uint64_t(height)));
      y.push_back(p.alloc({rows, height}));
    }
    for (size_t i = 0; i < w.size(); ++i) parts.push_back({&w[i].second, nullptr, &y[i].second});
    p.gpu->matmul_group(x.second, parts);
    for (size_t i = 0; i < w.size(); ++i) {
      Tensor alone = p.gpu->alloc({rows, w[i].second.dim(0)});
      p.gpu->matmul(x.second, w[i].second, nullptr, alone);
      const auto grouped = host(*p.gpu, y[i].second), one = host(*p.gpu, alone);
      EXPECT_EQ(0, std::memcmp(grouped.data(), one.data(), one.size() * sizeof(float))) << "type " << int(type) << " part " << i;
    }
  }
}

// Small per-head products, and MLA's absorbed ones (W_uk^T: 512 x 128 per head, W_uv: 128 x 512).
TEST(CudaOps, HeadMatmulMatchesCpu) {
  MOET_SKIP_WITHOUT_GPU();
  BackendPair p;
  struct Shape {
    int64_t rows, heads, n, k, x_stride, y_stride;
  };
  // (The last three take the tensor-core GEMV: 4 rows or more, n * heads >= 2048.)
  for (const Shape& s : {Shape{5, 4, 24, 32, 48, 40}, Shape{3, 16, 512, 128, 192, 576}, Shape{2, 16, 128, 512, 512, 128},
                         Shape{5, 16, 512, 128, 192, 576}, Shape{6, 16, 128, 512, 512, 128}, Shape{11, 16, 128, 64, 64, 128}}) {
    const auto wb = to_bf16(random_floats(size_t(s.heads * s.n * s.k), 3, 0.1f));
    auto w = p.weight(wb.data(), DType::bf16, {s.heads, s.n, s.k});
    auto x = p.activation(random_floats(size_t(s.rows * s.heads * s.x_stride), 4), {s.rows, s.heads, s.x_stride});
    auto y = p.activation(std::vector<float>(size_t(s.rows * s.heads * s.y_stride), 0.0f),
                          {s.rows, s.heads, s.y_stride});
    p.cpu->head_matmul(x.first, s.heads, s.x_stride, w.first, y.first, s.y_stride);
    p.gpu->head_matmul(x.second, s.heads, s.x_stride, w.second, y.second, s.y_stride);
    EXPECT_LT(max_rel_diff(p, y), kTol) << "heads " << s.heads << " n " << s.n << " k " << s.k;
  }
}

}  // namespace
}  // namespace moet::test
