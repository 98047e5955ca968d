// The CPU FP8-block matmul (kernels/cpu/fp8_matmul.h) against decoding the weights to F32 here
// (code * block scale, one F32 product) and running matmul_f32: the kernel dots every decoded row
// with dot_f32, the same accumulation in the same order, so the results must be bit-identical
// (memcmp), at shapes with partial 128-blocks in both directions, 1..9 rows and 1 or 3 threads
// (the suite also runs on the portable paths, MOET_CPU_SCALAR=1). The decode itself must equal the
// float64 product rounded once to F32, the value the loader's exact decode stores; its BF16 split
// (the tensor-core GEMM's weights) keeps it to 2^-17.
#include "../cpu_isa_env.h"
#include "../random_values.h"
#include "core/dtype.h"
#include "kernels/cpu/fp8_matmul.h"
#include "kernels/cpu/matmul.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

namespace moet {
namespace {

// W [n, k] decoded independently of the kernel: element (i, j) = code * scales[i / 128][j / 128].
std::vector<float> decode_reference(const std::vector<uint8_t>& codes, const std::vector<float>& scales, int64_t n,
                                    int64_t k) {
  const int64_t blocks_per_row = (k + 127) / 128;
  std::vector<float> w(codes.size());
  for (int64_t i = 0; i < n; ++i)
    for (int64_t j = 0; j < k; ++j)
      w[size_t(i * k + j)] = fp8_e4m3_to_float(codes[size_t(i * k + j)]) * scales[size_t(i / 128 * blocks_per_row + j / 128)];
  return w;
}

TEST(Fp8Matmul, BitIdenticalToF32MatmulOfTheDecodedWeights) {
  for (int threads : {1, 3}) {
    ThreadPool pool(threads);
    for (int64_t n : {1, 130, 257}) {
      for (int64_t k : {7, 128, 200, 1000}) {
        const int64_t scale_count = (n + 127) / 128 * ((k + 127) / 128);
        const auto codes = random_fp8_codes(size_t(n * k), uint64_t(n * 1000 + k));
        const auto scales = random_fp8_scales(size_t(scale_count), uint64_t(n + k));
        const auto w = decode_reference(codes, scales, n, k);
        const auto bias = random_floats(size_t(n), 3);
        for (int64_t rows : {1, 4, 9}) {
          const std::string what = "n " + std::to_string(n) + " k " + std::to_string(k) + " rows " +
                                   std::to_string(rows) + " threads " + std::to_string(threads);
          const auto x = random_floats(size_t(rows * k), uint64_t(rows));
          std::vector<float> y(size_t(rows * n)), expected(y.size());
          matmul_fp8_block(x.data(), rows, k, codes.data(), scales.data(), n, bias.data(), y.data(), pool, test_cpu_isa());
          matmul_f32(x.data(), rows, k, w.data(), n, bias.data(), expected.data(), pool, test_cpu_isa());
          EXPECT_EQ(0, std::memcmp(y.data(), expected.data(), y.size() * sizeof(float))) << what;
        }
      }
    }
  }
}

TEST(Fp8Matmul, DecodeIsTheExactProductRoundedOnce) {
  const int64_t n = 300, k = 260;
  const auto codes = random_fp8_codes(size_t(n * k), 5);
  const auto scales = random_fp8_scales(size_t(3 * 3), 6);
  std::vector<float> row(static_cast<size_t>(k));
  int64_t rounded = 0;  // products that F32 cannot hold exactly: the check is not vacuous
  for (int64_t i = 0; i < n; ++i) {
    fp8_block_decode_row(codes.data(), scales.data(), i, k, row.data());
    for (int64_t j = 0; j < k; ++j) {
      const double exact = double(fp8_e4m3_to_float(codes[size_t(i * k + j)])) * double(scales[size_t(i / 128 * 3 + j / 128)]);
      ASSERT_EQ(row[size_t(j)], float(exact)) << "row " << i << " col " << j;
      rounded += double(float(exact)) != exact;
    }
  }
  EXPECT_GT(rounded, 0);
}

// Rows 100..229 of [300, 260] (a start inside a block row): hi the decoded value rounded to BF16,
// hi + lo within 2^-17 of it, lo below 2^-8 of it.
TEST(Fp8Matmul, SplitKeepsTheDecodedValueTo17Bits) {
  const int64_t n = 300, k = 260, row_begin = 100, rows = 130;
  const auto codes = random_fp8_codes(size_t(n * k), 7);
  const auto scales = random_fp8_scales(size_t(3 * 3), 8);
  std::vector<uint16_t> hi(size_t(rows * k)), lo(size_t(rows * k));
  fp8_block_split_bf16(codes.data(), scales.data(), k, row_begin, rows, hi.data(), lo.data());
  const auto w = decode_reference(codes, scales, n, k);
  for (int64_t i = 0; i < rows * k; ++i) {
    const float v = w[size_t(row_begin * k + i)], h = bf16_to_float(hi[size_t(i)]), l = bf16_to_float(lo[size_t(i)]);
    ASSERT_EQ(hi[size_t(i)], float_to_bf16(v)) << i;
    ASSERT_LE(std::fabs(l), std::fabs(v) * 0x1p-8f) << i;
    ASSERT_LE(std::fabs(h + l - v), std::fabs(v) * 0x1p-17f) << i;
  }
}

}  // namespace
}  // namespace moet
