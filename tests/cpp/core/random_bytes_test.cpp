// RandomBytes: a parallel fill gives the bytes of the plain sequential walk (for sizes around the
// chunk size and ragged tails, any thread count), and consecutive fills continue that walk.
#include "core/random_bytes.h"

#include <gtest/gtest.h>

#include <cstring>
#include <vector>

namespace moet {
namespace {

std::vector<uint8_t> sequential(uint64_t& state, size_t n) {
  std::vector<uint8_t> out(n);
  for (size_t i = 0; i < n; i += 8) {
    state = state * RandomBytes::kMultiplier + RandomBytes::kIncrement;
    const uint64_t bits = RandomBytes::bits_of(state);
    std::memcpy(out.data() + i, &bits, std::min<size_t>(8, n - i));
  }
  return out;
}

TEST(RandomBytes, ParallelFillIsTheSequentialWalk) {
  for (int threads : {1, 3, 8}) {
    ThreadPool pool(threads);
    for (size_t n : {size_t(0), size_t(5), size_t(8), size_t(65536), size_t(65536 * 3 + 13), size_t(1000003)}) {
      uint64_t expected_state = 42;
      const std::vector<uint8_t> expected = sequential(expected_state, n);
      RandomBytes bytes(42);
      std::vector<uint8_t> got(n);
      bytes.fill(got.data(), n, pool);
      EXPECT_EQ(got, expected) << threads << " threads, " << n << " bytes";
      EXPECT_EQ(bytes.state(), expected_state) << threads << " threads, " << n << " bytes";
    }
  }
}

TEST(RandomBytes, ConsecutiveFillsContinueTheWalk) {
  ThreadPool pool(4);
  uint64_t state = 7;
  const std::vector<uint8_t> first = sequential(state, 200000), second = sequential(state, 77777);
  RandomBytes bytes(7);
  std::vector<uint8_t> a(200000), b(77777);
  bytes.fill(a.data(), a.size(), pool);
  bytes.fill(b.data(), b.size(), pool);
  EXPECT_EQ(a, first);
  EXPECT_EQ(b, second);
}

}  // namespace
}  // namespace moet
