// The CUDA top_logits against the CPU backend's, bit for bit (memcmp of values and ids): Qwen3's
// vocabulary of 151936 (38 chunks: two passes, three at k 256) and small odd ones (one chunk; two
// with a last chunk shorter than k; four), rows 1..17, k 1, 8, 50 and kMaxTopLogits where the
// vocabulary allows, on rows with ties, NaNs of both signs, infinities, an all-NaN row and a
// one-value row, and on rows of values packed in a narrow range (the radix select's top bytes all
// equal); a second run gives the same bits; k outside [1, min(vocab, kMaxTopLogits)] is refused.
// Skips with a message when no GPU is visible.
#include "gpu_test_util.h"

#include "core/error.h"

#include <fmt/format.h>

#include <string>

namespace moet::test {
namespace {

TEST(CudaTopLogits, MatchesCpuBitForBit) {
  MOET_SKIP_WITHOUT_GPU();
  BackendPair p;
  uint64_t seed = 1;
  for (int64_t vocab : {151936, 7, 300, 4097, 12289}) {
    for (int64_t rows : {1, 2, 5, 17}) {
      for (bool narrow : {false, true}) {
        const size_t n = static_cast<size_t>(rows * vocab);
        const auto logits = narrow ? random_floats(n, seed++, 1e-3f) : awkward_logits(rows, vocab, seed++);
        const auto x = p.activation(logits, {rows, vocab});
        for (int64_t k : {int64_t(1), int64_t(8), int64_t(50), kMaxTopLogits}) {
          if (k > vocab) continue;
          auto values = p.alloc({rows, k});
          auto ids = p.alloc({rows, k}, DType::i32);
          p.cpu->top_logits(x.first, k, values.first, ids.first);
          p.gpu->top_logits(x.second, k, values.second, ids.second);
          const auto cpu_values = host(*p.cpu, values.first), gpu_values = host(*p.gpu, values.second);
          const auto cpu_ids = host<int32_t>(*p.cpu, ids.first), gpu_ids = host<int32_t>(*p.gpu, ids.second);
          const std::string where = fmt::format("vocab {} rows {} k {} narrow {}", vocab, rows, k, narrow);
          ASSERT_EQ(cpu_ids, gpu_ids) << where;
          ASSERT_EQ(0, std::memcmp(cpu_values.data(), gpu_values.data(), cpu_values.size() * sizeof(float))) << where;
          p.gpu->top_logits(x.second, k, values.second, ids.second);
          ASSERT_EQ(gpu_ids, host<int32_t>(*p.gpu, ids.second)) << where << " (second run)";
        }
      }
    }
  }
}

TEST(CudaTopLogits, RejectsKOutOfRange) {
  MOET_SKIP_WITHOUT_GPU();
  BackendPair p;
  const auto x = p.activation(random_floats(2 * 100, 3), {2, 100});
  for (int64_t k : {int64_t(0), int64_t(101)}) {
    Tensor values = p.gpu->alloc({2, k}), ids = p.gpu->alloc({2, k}, DType::i32);
    EXPECT_THROW(p.gpu->top_logits(x.second, k, values, ids), Error) << k;
  }
  const auto wide = p.activation(random_floats(1000, 4), {1, 1000});
  Tensor values = p.gpu->alloc({1, kMaxTopLogits + 1}), ids = p.gpu->alloc({1, kMaxTopLogits + 1}, DType::i32);
  EXPECT_THROW(p.gpu->top_logits(wide.second, kMaxTopLogits + 1, values, ids), Error);
}

}  // namespace
}  // namespace moet::test
