// top_logits (the CPU reference of the top-k op) against a full sort with the order spelled out
// here: larger first, equal values (-0 and +0 included) by the lower id, NaNs (either sign) after
// everything, -inf included, by id among themselves; values bit for bit. Rows with ties, NaNs and
// infinities, an all-NaN row and a one-value row; k = 1, k = vocab, and k outside [1, vocab]
// refused with an error naming the range. append_best_keys (the selection under both, and under
// the Sampler's sort) extending one sorted prefix in growing steps, on a vocabulary-size row and
// on rows that defeat its sampled threshold estimate, and refusing a k below 1.
#include "../random_values.h"
#include "core/error.h"
#include "kernels/cpu/top_logits.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>

namespace moet {
namespace {

// Whether (a, token ia) comes before (b, token ib).
bool before(float a, int32_t ia, float b, int32_t ib) {
  const bool nan_a = std::isnan(a), nan_b = std::isnan(b);
  if (nan_a != nan_b) return nan_b;
  if (!nan_a && a != b) return a > b;
  return ia < ib;
}

TEST(TopLogits, MatchesAFullSort) {
  for (int64_t vocab : {1, 2, 7, 100, 1000, 5003}) {
    const int64_t rows = 4;
    const auto logits = awkward_logits(rows, vocab, uint64_t(vocab));
    for (int64_t k : {int64_t(1), int64_t(2), int64_t(50), vocab / 2, vocab - 1, vocab}) {
      if (k < 1 || k > vocab) continue;
      std::vector<float> values(static_cast<size_t>(rows * k));
      std::vector<int32_t> ids(static_cast<size_t>(rows * k));
      top_logits(logits.data(), rows, vocab, k, values.data(), ids.data());
      for (int64_t r = 0; r < rows; ++r) {
        const float* row = logits.data() + r * vocab;
        std::vector<int32_t> order(static_cast<size_t>(vocab));
        std::iota(order.begin(), order.end(), 0);
        std::sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return before(row[a], a, row[b], b); });
        for (int64_t j = 0; j < k; ++j) {
          const size_t at = size_t(r * k + j);
          ASSERT_EQ(ids[at], order[size_t(j)]) << "vocab " << vocab << " k " << k << " row " << r << " rank " << j;
          ASSERT_EQ(0, std::memcmp(&values[at], &row[order[size_t(j)]], sizeof(float)))
              << "the value of rank " << j << " is not the row's bits";
        }
      }
    }
  }
}

// The full order of a row as rank keys, best first.
std::vector<uint64_t> sorted_keys(const std::vector<float>& row) {
  std::vector<int32_t> order(row.size());
  std::iota(order.begin(), order.end(), 0);
  std::sort(order.begin(), order.end(),
            [&](int32_t a, int32_t b) { return before(row[size_t(a)], a, row[size_t(b)], b); });
  std::vector<uint64_t> keys;
  for (int32_t id : order) keys.push_back(logit_rank_key(row[size_t(id)], id));
  return keys;
}

// Growing prefixes (k = 1, then fourfold, then the whole row), each call given the previous
// floor, append exactly the next entries of the full order and return the k-th key.
TEST(TopLogits, BestKeysExtendOneSortedPrefix) {
  const int64_t vocab = 151936;
  std::vector<std::vector<float>> rows;
  rows.push_back(awkward_logits(1, vocab, 5));
  rows.push_back(random_floats(size_t(vocab), 6, 3.0f));
  // The sampled values (every 64th) are the row's best: the threshold estimate keeps too few.
  std::vector<float> spiky = random_floats(size_t(vocab), 7);
  for (size_t i = 0; i < spiky.size(); i += 64) spiky[i] = 100.0f + float(i % 1000);
  rows.push_back(spiky);
  rows.push_back(std::vector<float>(size_t(vocab), 1.5f));  // all equal: by id
  for (size_t r = 0; r < rows.size(); ++r) {
    const std::vector<uint64_t> expected = sorted_keys(rows[r]);
    std::vector<uint64_t> keys;
    uint64_t floor = UINT64_MAX;
    for (int64_t k = 1;; k = std::min(4 * k, vocab)) {
      floor = append_best_keys(rows[r].data(), vocab, k, floor, keys);
      ASSERT_EQ(keys.size(), size_t(k)) << "row " << r << " k " << k;
      ASSERT_TRUE(std::equal(keys.begin(), keys.end(), expected.begin())) << "row " << r << " k " << k;
      ASSERT_EQ(floor, k < vocab ? expected[size_t(k - 1)] : 0u) << "row " << r << " k " << k;
      if (k == vocab) break;
    }
  }
}

TEST(TopLogits, OrdersSpecialValues) {
  const std::vector<float> row = {NAN, -INFINITY, -0.0f, 0.0f, 2.0f, NAN, 2.0f, -INFINITY, -1.0f};
  std::vector<float> values(row.size());
  std::vector<int32_t> ids(row.size());
  top_logits(row.data(), 1, int64_t(row.size()), int64_t(row.size()), values.data(), ids.data());
  EXPECT_EQ(ids, (std::vector<int32_t>{4, 6, 2, 3, 8, 1, 7, 0, 5}));
  EXPECT_TRUE(std::signbit(values[2]));  // -0 kept as -0
  const std::vector<float> nans = {NAN, NAN, NAN};
  top_logits(nans.data(), 1, 3, 1, values.data(), ids.data());
  EXPECT_EQ(ids[0], 0);  // an all-NaN row: id 0, as argmax()
}

TEST(TopLogits, BestKeysRejectKBelowOne) {
  const std::vector<float> row(10, 1.0f);
  std::vector<uint64_t> keys;
  EXPECT_THROW(append_best_keys(row.data(), 10, 0, UINT64_MAX, keys), Error);
  EXPECT_TRUE(keys.empty());
}

TEST(TopLogits, RejectsKOutsideTheVocabulary) {
  const std::vector<float> row(10, 1.0f);
  std::vector<float> values(11);
  std::vector<int32_t> ids(11);
  for (int64_t k : {0, 11}) {
    try {
      top_logits(row.data(), 1, 10, k, values.data(), ids.data());
      FAIL() << "k " << k << " accepted";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("k must be in [1, vocab = 10]"), std::string::npos) << e.what();
    }
  }
}

}  // namespace
}  // namespace moet
