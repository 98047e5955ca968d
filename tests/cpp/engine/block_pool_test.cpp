// KvBlockPool: allocation and release, refcounts on shared prefix blocks, prefix hits on full
// blocks only (hash chain + token check), LRU eviction of cached free blocks.
#include "kv/block_pool.h"

#include <gtest/gtest.h>

#include <numeric>

namespace moet {
namespace {

std::vector<int32_t> iota_tokens(int n, int start = 0) {
  std::vector<int32_t> t(static_cast<size_t>(n));
  std::iota(t.begin(), t.end(), start);
  return t;
}

TEST(BlockPool, EnsureAndReleaseWithoutCaching) {
  KvBlockPool pool(4, 2);
  std::vector<int32_t> a, b;
  ASSERT_TRUE(pool.ensure(a, 3));  // 2 blocks
  EXPECT_EQ(a.size(), 2u);
  EXPECT_EQ(pool.free_count(), 2);
  EXPECT_FALSE(pool.ensure(b, 6));  // needs 3
  EXPECT_TRUE(b.empty());
  ASSERT_TRUE(pool.ensure(b, 4));
  EXPECT_EQ(pool.free_count(), 0);
  pool.release(a);
  EXPECT_TRUE(a.empty());
  EXPECT_EQ(pool.free_count(), 2);
  EXPECT_TRUE(pool.match_prefix(iota_tokens(4)).empty());  // caching off
}

TEST(BlockPool, PrefixHitSharesFullBlocksAndCountsRefs) {
  KvBlockPool pool(8, 4, true);
  const auto tokens = iota_tokens(10);  // 2 full blocks + 2 tokens
  std::vector<int32_t> a;
  ASSERT_TRUE(pool.ensure(a, 10));
  pool.commit(a, tokens, 10);
  // Same prefix: the two full blocks are shared, the partial one is not.
  std::vector<int32_t> b = pool.match_prefix(tokens);
  ASSERT_EQ(b.size(), 2u);
  EXPECT_EQ(b[0], a[0]);
  EXPECT_EQ(b[1], a[1]);
  EXPECT_EQ(pool.refcount(a[0]), 2);
  EXPECT_EQ(pool.refcount(a[2]), 1);
  // A prefix that differs in the second block hits only the first.
  auto other = tokens;
  other[5] = 99;
  std::vector<int32_t> c = pool.match_prefix(other);
  ASSERT_EQ(c.size(), 1u);
  EXPECT_EQ(pool.refcount(a[0]), 3);
  pool.release(a);
  pool.release(b);
  pool.release(c);
  EXPECT_EQ(pool.free_count(), 8);
  EXPECT_EQ(pool.stats().cached_free, 2);
  // Freed but cached: still hit.
  std::vector<int32_t> d = pool.match_prefix(tokens);
  EXPECT_EQ(d.size(), 2u);
  EXPECT_EQ(pool.free_count(), 6);
  pool.release(d);
}

TEST(BlockPool, SameHashDifferentParentDoesNotHit) {
  KvBlockPool pool(8, 2, true);
  std::vector<int32_t> a;
  const std::vector<int32_t> t1 = {1, 2, 3, 4};
  ASSERT_TRUE(pool.ensure(a, 4));
  pool.commit(a, t1, 4);
  // Block [3, 4] exists only after [1, 2]; as a first block it must miss.
  EXPECT_TRUE(pool.match_prefix({3, 4, 5}).empty());
  pool.release(a);
}

TEST(BlockPool, EvictsLeastRecentlyFreedCachedBlockFirst) {
  KvBlockPool pool(4, 2, true);
  std::vector<int32_t> a, b;
  const std::vector<int32_t> ta = {1, 2}, tb = {3, 4};
  ASSERT_TRUE(pool.ensure(a, 2));
  ASSERT_TRUE(pool.ensure(b, 2));
  pool.commit(a, ta, 2);
  pool.commit(b, tb, 2);
  pool.release(a);  // freed first -> evicted first once the untouched free blocks are used up
  pool.release(b);
  std::vector<int32_t> c;
  ASSERT_TRUE(pool.ensure(c, 6));  // the 2 never-used blocks + 1 cached (a's)
  EXPECT_EQ(pool.stats().cached_free, 1);
  EXPECT_TRUE(pool.match_prefix(ta).empty());
  EXPECT_EQ(pool.match_prefix(tb).size(), 1u);
}

TEST(BlockPool, ReleaseReturnsTableTailFirst) {
  KvBlockPool pool(4, 1, true);
  std::vector<int32_t> a;
  const std::vector<int32_t> t = {7, 8, 9, 10};
  ASSERT_TRUE(pool.ensure(a, 4));
  pool.commit(a, t, 4);
  pool.release(a);
  // One allocation evicts the tail block of the chain; the head prefix survives.
  std::vector<int32_t> b;
  ASSERT_TRUE(pool.ensure(b, 1));
  EXPECT_EQ(pool.match_prefix(t).size(), 3u);
}

}  // namespace
}  // namespace moet
