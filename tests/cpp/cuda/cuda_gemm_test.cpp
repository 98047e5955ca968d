// The tensor-core path of the CUDA backend's products (backend/cuda/dense_gemm.h): products of at
// least gemm_min_rows rows with BF16 weights run as two cuBLASLt GEMMs over the activations split
// into BF16 hi and lo pieces; with FP8-block weights as three, over the weights decoded a tile of
// rows at a time and split into BF16 pieces too. Checked: both split kernels bit for bit against
// their CPU references; the products against the CPU backend's FP32 ones within the GEMV's
// tolerance (the split keeps x to 2^-17, so a GEMM on hi alone would fail it), with and without
// bias, alone and as matmul_group parts, at row counts around the threshold and prefill sizes,
// DeepSeek-V3's FP8 shapes and odd ones, FP8 weights of several scratch tiles; that these rows
// really took the GEMM (the per-op profile names it) while fewer rows and odd k stayed on the
// GEMV; a second run bit-identical. Skips with a message when no GPU is visible.
#include "gpu_test_util.h"

#include "kernels/cpu/elementwise.h"
#include "kernels/cpu/fp8_matmul.h"
#include "kernels/cuda/elementwise.h"
#include "kernels/cuda/fp8_split.h"


#include <string>

namespace moet::test {
namespace {

constexpr double kTol = 2e-5;  // cuda_ops_test.cpp's for the GEMV
// Weights large enough that products exceed 1, where max_rel_diff is relative (below 1 it is an
// absolute difference, a weaker check).
constexpr float kWeightScale = 0.05f;
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
  ASSERT_TRUE(cuda_device_synchronize());
  const auto gpu = host<uint16_t>(*p.gpu, pieces);
  EXPECT_EQ(0, std::memcmp(gpu.data(), hi.data(), hi.size() * 2));
  for (int64_t i = 0; i < n; ++i) {  // lo of an infinity or NaN is a NaN whose bits the hardware picks
    if (!std::isfinite(x[size_t(i)])) continue;
    EXPECT_EQ(lo[size_t(i)], gpu[size_t(n + i)]) << "lo of x[" << i << "]";
  }
}

// Rows 130..279 of an FP8-block weight [300, 520] (a start inside a block row, partial blocks in
// both directions) with every code, NaNs included, and scales of full F32 mantissas (code * scale
// rounds): the GPU's pieces are the CPU's bit for bit, except those of NaN codes (NaN both).
TEST(CudaGemm, Fp8SplitMatchesCpu) {
  MOET_SKIP_WITHOUT_GPU();
  BackendPair p;
  const int64_t n = 300, k = 520, row_begin = 130, rows = 150;
  std::vector<uint8_t> codes = random_fp8_codes(size_t(n * k), 21);
  for (size_t i = 0; i < codes.size(); i += 7) codes[i] = uint8_t(i / 7);  // every code, 0x7f / 0xff (NaN) too
  const std::vector<int64_t> scale_shape = fp8_block_scale_shape(n, k);
  std::vector<float> scales = random_fp8_scales(size_t(scale_shape[0] * scale_shape[1]), 22);
  scales[size_t(scale_shape[1] + 1)] = 1e-36f;  // subnormal products (rows 130..255)
  scales[size_t(2 * scale_shape[1] + 2)] = 3e30f;  // large ones, finite (rows 256..279)
  const size_t count = size_t(rows * k);
  std::vector<uint16_t> hi(count), lo(count);
  fp8_block_split_bf16(codes.data(), scales.data(), k, row_begin, rows, hi.data(), lo.data());
  const auto w = p.fp8_weight(codes, scales, n, k).second;
  Tensor pieces = p.gpu->alloc({2, rows, k}, DType::bf16);
  host(*p.gpu, *w.block_scales);  // the uploads are complete before the kernel on the legacy stream
  cuda::fp8_block_split_bf16_launch(w.as<uint8_t>(), w.block_scales->as<float>(), k, row_begin, rows,
                                    pieces.as<uint16_t>(), pieces.as<uint16_t>() + count, nullptr);
  ASSERT_TRUE(cuda_device_synchronize());
  const auto gpu = host<uint16_t>(*p.gpu, pieces);
  const auto is_nan = [](uint16_t bits) { return (bits & 0x7fff) > 0x7f80; };
  int mismatches = 0;
  for (size_t i = 0; i < count; ++i) {
    const uint8_t code = codes[size_t(row_begin * k) + i];
    if ((code & 0x7f) == 0x7f) {  // NaN: the bits are the hardware's
      EXPECT_TRUE(is_nan(gpu[i]) && is_nan(gpu[count + i])) << i;
      continue;
    }
    if (hi[i] != gpu[i] || lo[i] != gpu[count + i]) {
      if (++mismatches <= 10) ADD_FAILURE() << "element " << i << " code " << int(code) << ": cpu " << hi[i] << " "
                                            << lo[i] << " gpu " << gpu[i] << " " << gpu[count + i];
    }
  }
  EXPECT_EQ(0, mismatches);
}

// Runs one product (or a group of them) as a profiled step and returns the names of the ops it
// recorded besides the step's input upload.
template <typename Op>
std::vector<std::string> profiled(Backend& gpu, Op&& op) {
  const int32_t zero = 0, table[1] = {0};
  const int32_t* tables[1] = {table};
  const int64_t slot = 0;
  bench_ops(gpu).set_profiling(true);
  gpu.begin_step({1, &zero, &zero, &zero, &slot, 1, tables, 16, 0});
  op();
  std::vector<std::string> names;
  for (const OpProfile& o : bench_ops(gpu).take_profile())
    if (o.op != "step_upload") names.push_back(o.op);
  bench_ops(gpu).set_profiling(false);
  return names;
}

void check_product(BackendPair& p, int64_t rows, int64_t n, int64_t k, bool with_bias,
                   WeightType type = WeightType::bf16) {
  const bool fp8 = type == WeightType::fp8;
  const std::string what = fmt::format("rows {} n {} k {} bias {} fp8 {}", rows, n, k, with_bias, fp8);
  auto w = random_weight(p, type, n, k, uint64_t(n * k + rows), kWeightScale);
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
  EXPECT_EQ(fmt::format("{}[n={},k={}]", want_gemm ? (fp8 ? "gemm_fp8" : "gemm") : "matmul", n, k), names[0]) << what;
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

// FP8-block weights: around the threshold, odd shapes (n and k not multiples of 128, k % 8 != 0 on
// the GEMV), DeepSeek-V3's dense shapes (kv_a 576 x 7168 at a 2048-row prefill, q_a 1536 x 7168,
// q_b 24576 x 1536 in three scratch tiles of 10880 rows, o_proj 7168 x 16384 in seven of 1024) and
// a last tile of 76 rows (n = 1100, k = 16384) with a bias.
TEST(CudaGemm, Fp8BlockProductsMatchCpu) {
  MOET_SKIP_WITHOUT_GPU();
  BackendPair p;
  const WeightType fp8 = WeightType::fp8;
  for (bool with_bias : {false, true}) {
    check_product(p, kMinRows - 1, 96, 256, with_bias, fp8);  // below the threshold: the GEMV
    check_product(p, kMinRows, 96, 256, with_bias, fp8);
    check_product(p, 17, 300, 520, with_bias, fp8);
    check_product(p, 40, 131, 1040, with_bias, fp8);
    check_product(p, 40, 64, 300, with_bias, fp8);  // k % 8 != 0: the GEMV
  }
  check_product(p, 2048, 576, 7168, false, fp8);
  check_product(p, 256, 1536, 7168, true, fp8);
  check_product(p, 200, 24576, 1536, false, fp8);
  check_product(p, 64, 7168, 16384, true, fp8);
  check_product(p, 20, 1100, 16384, true, fp8);
}

// A matmul_group on the tensor cores (the activations split once): against the CPU, the profile
// naming the GEMM, each part bit-identical to its own matmul.
void check_group(BackendPair& p, WeightType type, int64_t rows, int64_t k, const std::vector<int64_t>& heights,
                 const std::string& name) {
  auto x = p.activation(random_floats(size_t(rows * k), 5), {rows, k});
  std::vector<std::pair<Tensor, Tensor>> w, bias, y;
  for (size_t i = 0; i < heights.size(); ++i) {
    w.push_back(random_weight(p, type, heights[i], k, 40 + i, kWeightScale));
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
  EXPECT_EQ(name, names[0]);
  for (size_t i = 0; i < heights.size(); ++i) {
    EXPECT_LT(max_rel_diff(p, y[i]), kTol) << name << " part " << i;
    Tensor alone = p.gpu->alloc({rows, heights[i]});
    p.gpu->matmul(x.second, w[i].second, gpu_parts[i].bias, alone);
    const auto grouped = host(*p.gpu, y[i].second), one = host(*p.gpu, alone);
    EXPECT_EQ(0, std::memcmp(grouped.data(), one.data(), one.size() * sizeof(float))) << name << " part " << i;
  }
}

TEST(CudaGemm, GroupedPartsMatchCpu) {
  MOET_SKIP_WITHOUT_GPU();
  BackendPair p;
  check_group(p, WeightType::bf16, 37, 512, {256, 64, 64}, "gemm_group[n=256+64+64,k=512]");
  // MLA's q_a and kv_a of one x, q_a widened to two scratch tiles (2304 rows each at k = 7168).
  check_group(p, WeightType::fp8, 37, 7168, {2560, 576, 130}, "gemm_fp8_group[n=2560+576+130,k=7168]");
}

}  // namespace
}  // namespace moet::test
