// The tensor-core path of the CUDA backend's products (backend/cuda/dense_gemm.h): products of at
// least gemm_min_rows rows with BF16 weights run as two cuBLASLt GEMMs over the activations split
// into BF16 hi and lo pieces. Checked: the split kernel bit for bit against the CPU reference; the
// products against the CPU backend's FP32 ones within the GEMV's tolerance (the split keeps x to
// 2^-17, so a GEMM on hi alone would fail it), with and without bias, alone and as matmul_group
// parts, at row counts around the threshold and prefill sizes; that these rows really took the
// GEMM (the per-op profile names it) while fewer rows and odd k stayed on the GEMV; a second run
// bit-identical. Skips with a message when no GPU is visible.
#include "gpu_test_util.h"

#include "kernels/cpu/elementwise.h"
#include "kernels/cuda/elementwise.h"

#include <cuda_runtime_api.h>

#include <string>

namespace moet::test {
namespace {

constexpr double kTol = 2e-5;  // cuda_ops_test.cpp's for the GEMV
constexpr int64_t kMinRows = 16;

TEST(CudaGemm, SplitMatchesCpu) {
  MOET_SKIP_WITHOUT_GPU();
  BackendPair p;
  std::vector<float> x = random_floats(4099, 7, 3.0f);
  x.insert(x.end(), {0.0f, -0.0f, 1e-30f, -1e30f, INFINITY, -INFINITY, NAN, 3.0e38f, 1.00390625f, 1.0f + 0x1p-9f});
  const int64_t n = int64_t(x.size());
  std::vector<uint16_t> hi(x.size()), lo(x.size());
  split_bf16(x.data(), n, hi.data(), lo.data());
  for (size_t i = 0; i < 4099; ++i)  // the finite random values: hi + lo within 2^-17 of x
    EXPECT_LE(std::fabs(bf16_to_float(hi[i]) + bf16_to_float(lo[i]) - x[i]), std::fabs(x[i]) * 0x1p-17f) << i;
  const Tensor xs = p.activation(x, {n}).second;
  Tensor pieces = p.gpu->alloc({2, n}, DType::bf16);
  p.gpu->to_host(xs, x.data());  // the upload is complete before the kernel on the legacy stream
  cuda::split_bf16_launch(xs.as<float>(), n, pieces.as<uint16_t>(), pieces.as<uint16_t>() + n, nullptr);
  ASSERT_EQ(cudaSuccess, cudaDeviceSynchronize());
  const auto gpu = host<uint16_t>(*p.gpu, pieces);
  EXPECT_EQ(0, std::memcmp(gpu.data(), hi.data(), hi.size() * 2));
  for (int64_t i = 0; i < n; ++i) {  // lo of an infinity or NaN is a NaN whose bits the hardware picks
    if (!std::isfinite(x[size_t(i)])) continue;
    EXPECT_EQ(lo[size_t(i)], gpu[size_t(n + i)]) << "lo of x[" << i << "]";
  }
}

// Runs one product (or a group of them) as a profiled step and returns the names of the ops it
// recorded besides the step's input upload.
template <typename Op>
std::vector<std::string> profiled(Backend& gpu, Op&& op) {
  const int32_t zero = 0, table[1] = {0};
  const int32_t* tables[1] = {table};
  const int64_t slot = 0;
  gpu.set_profiling(true);
  gpu.begin_step({1, &zero, &zero, &zero, &slot, 1, tables, 16, 0});
  op();
  std::vector<std::string> names;
  for (const OpProfile& o : gpu.take_profile())
    if (o.op != "step_upload") names.push_back(o.op);
  gpu.set_profiling(false);
  return names;
}

void check_product(BackendPair& p, int64_t rows, int64_t n, int64_t k, bool with_bias) {
  const std::string what = fmt::format("rows {} n {} k {} bias {}", rows, n, k, with_bias);
  const auto wb = to_bf16(random_floats(size_t(n * k), uint64_t(n * k + rows), 0.05f));
  auto w = p.weight(wb.data(), DType::bf16, {n, k});
  auto x = p.activation(random_floats(size_t(rows * k), uint64_t(rows + 3)), {rows, k});
  auto bias = p.activation(random_floats(size_t(n), 11), {n});
  auto y = p.alloc({rows, n});
  Tensor again = p.gpu->alloc({rows, n});
  const Tensor* b_cpu = with_bias ? &bias.first : nullptr;
  const Tensor* b_gpu = with_bias ? &bias.second : nullptr;
  p.cpu->matmul(x.first, w.first, b_cpu, y.first);
  const auto names = profiled(*p.gpu, [&] { p.gpu->matmul(x.second, w.second, b_gpu, y.second); });
  ASSERT_EQ(1u, names.size()) << what;
  const bool want_gemm = rows >= kMinRows && k % 8 == 0;
  EXPECT_EQ(want_gemm ? fmt::format("gemm[n={},k={}]", n, k) : fmt::format("matmul[n={},k={}]", n, k), names[0])
      << what;
  EXPECT_LT(max_rel_diff(p, y), kTol) << what;
  p.gpu->matmul(x.second, w.second, b_gpu, again);
  const auto first = host(*p.gpu, y.second), second = host(*p.gpu, again);
  EXPECT_EQ(0, std::memcmp(first.data(), second.data(), first.size() * sizeof(float))) << what << " run to run";
}

TEST(CudaGemm, ManyRowProductsMatchCpu) {
  MOET_SKIP_WITHOUT_GPU();
  BackendPair p;
  for (bool with_bias : {false, true}) {
    check_product(p, kMinRows - 1, 96, 256, with_bias);  // below the threshold: the GEMV
    check_product(p, kMinRows, 96, 256, with_bias);
    check_product(p, 17, 300, 520, with_bias);        // odd rows and columns
    check_product(p, 40, 64, 100, with_bias);         // k % 8 != 0: the GEMV
    check_product(p, 200, 1000, 2048, with_bias);
  }
  check_product(p, 2048, 512, 4096, false);  // a prefill of Qwen3-235B's K projection
  check_product(p, 513, 4096, 1536, true);
}

TEST(CudaGemm, GroupedPartsMatchCpu) {
  MOET_SKIP_WITHOUT_GPU();
  BackendPair p;
  const int64_t rows = 37, k = 512;
  const std::vector<int64_t> heights = {256, 64, 64};
  auto x = p.activation(random_floats(size_t(rows * k), 5), {rows, k});
  std::vector<std::pair<Tensor, Tensor>> w, bias, y;
  for (size_t i = 0; i < heights.size(); ++i) {
    const auto wb = to_bf16(random_floats(size_t(heights[i] * k), 40 + i, 0.05f));
    w.push_back(p.weight(wb.data(), DType::bf16, {heights[i], k}));
    bias.push_back(p.activation(random_floats(size_t(heights[i]), 50 + i), {heights[i]}));
    y.push_back(p.alloc({rows, heights[i]}));
  }
  std::vector<MatmulPart> cpu_parts, gpu_parts;
  for (size_t i = 0; i < heights.size(); ++i) {
    const bool with_bias = i != 1;
    cpu_parts.push_back({&w[i].first, with_bias ? &bias[i].first : nullptr, &y[i].first});
    gpu_parts.push_back({&w[i].second, with_bias ? &bias[i].second : nullptr, &y[i].second});
  }
  p.cpu->matmul_group(x.first, cpu_parts);
  const auto names = profiled(*p.gpu, [&] { p.gpu->matmul_group(x.second, gpu_parts); });
  ASSERT_EQ(1u, names.size());
  EXPECT_EQ("gemm_group[n=256+64+64,k=512]", names[0]);
  for (size_t i = 0; i < heights.size(); ++i) EXPECT_LT(max_rel_diff(p, y[i]), kTol) << "part " << i;
}

}  // namespace
}  // namespace moet::test
