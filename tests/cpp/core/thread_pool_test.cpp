// ThreadPool covers every index exactly once, for any size and thread count.
#include "core/thread_pool.h"

#include <gtest/gtest.h>

#include <atomic>
#include <vector>

namespace moet {

TEST(ThreadPool, CoversEveryIndexOnce) {
  for (int threads : {1, 2, 3, 8}) {
    ThreadPool pool(threads);
    for (size_t n : {size_t(0), size_t(1), size_t(5), size_t(1000)}) {
      std::vector<std::atomic<int>> hits(n);
      pool.parallel_for(n, [&](size_t begin, size_t end) {
        for (size_t i = begin; i < end; ++i) hits[i]++;
      });
      for (size_t i = 0; i < n; ++i) EXPECT_EQ(hits[i].load(), 1) << threads << " " << n;
    }
  }
}

TEST(ThreadPool, ReusableManyTimes) {
  ThreadPool pool(4);
  std::atomic<long> total{0};
  for (int round = 0; round < 200; ++round)
    pool.parallel_for(64, [&](size_t b, size_t e) { total += long(e - b); });
  EXPECT_EQ(total.load(), 200 * 64);
}

}  // namespace moet
