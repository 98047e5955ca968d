// logit_confidence (the gate's signals, kernels/cpu/logit_confidence.h) against the definitions
// computed here in long double with std::exp: p1 = 1 / sum e^(l - l1) over the numbers of the row,
// margin = p1 - e^(l2 - l1) p1. Random rows of several vocabularies (the kernel's exponential is
// within 2 float ulps, its sum in double: agreement to 1e-6), rows with NaNs and infinities, ties
// of the largest value (margin 0), one-value rows (p1 = margin = 1), and rows without a number
// above -inf ({0, 0}).
#include "../random_values.h"
#include "kernels/cpu/logit_confidence.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <vector>

namespace moet {
namespace {

struct Signals {
  double p1, margin;
};

Signals reference(const float* row, int64_t vocab) {
  double first = -INFINITY, second = -INFINITY;
  for (int64_t i = 0; i < vocab; ++i) {
    const double v = row[i];
    if (std::isnan(v)) continue;
    if (v > first) {
      second = first;
      first = v;
    } else if (v > second) {
      second = v;
    }
  }
  if (first == -INFINITY) return {0.0, 0.0};
  long double sum = 0.0L;
  for (int64_t i = 0; i < vocab; ++i)
    if (!std::isnan(row[i])) sum += row[i] == first ? 1.0L : std::exp((long double)(row[i]) - first);
  const long double p1 = 1.0L / sum, p2 = (second == first ? 1.0L : std::exp((long double)second - first)) / sum;
  return {double(p1), double(p1 - p2)};
}

void expect_signals(const std::vector<float>& logits, int64_t rows, int64_t vocab, const std::string& what) {
  std::vector<float> out(size_t(2 * rows), -1.0f);
  logit_confidence(logits.data(), rows, vocab, out.data());
  for (int64_t r = 0; r < rows; ++r) {
    const Signals want = reference(logits.data() + r * vocab, vocab);
    EXPECT_NEAR(out[size_t(2 * r)], want.p1, 1e-6) << what << " row " << r;
    EXPECT_NEAR(out[size_t(2 * r + 1)], want.margin, 1e-6) << what << " row " << r;
    EXPECT_GE(out[size_t(2 * r)], out[size_t(2 * r + 1)]) << what;
    EXPECT_LE(out[size_t(2 * r)], 1.0f) << what;
  }
}

TEST(LogitConfidence, MatchesTheDefinitions) {
  for (int64_t vocab : {1, 2, 33, 1000, 8192}) {
    expect_signals(random_floats(size_t(3 * vocab), uint64_t(vocab), 4.0f), 3, vocab, "normal");
    expect_signals(awkward_logits(3, vocab, uint64_t(vocab) + 7), 3, vocab, "awkward");
  }
}

TEST(LogitConfidence, EdgeRows) {
  const float inf = std::numeric_limits<float>::infinity(), nan = std::numeric_limits<float>::quiet_NaN();
  const std::vector<float> rows = {
      2.0f, 5.0f, 5.0f, -1.0f,   // a tie at the top: margin 0
      nan, 3.0f, nan, nan,       // one number: p1 = margin = 1
      -inf, -inf, nan, -inf,     // nothing above -inf: {0, 0}
      inf, 1.0f, 0.0f, -3.0f,    // +inf takes all: p1 = margin = 1
      0.0f, 0.0f, 0.0f, 0.0f,    // flat: p1 = 1/4, margin 0
  };
  std::vector<float> out(10);
  logit_confidence(rows.data(), 5, 4, out.data());
  EXPECT_EQ(out[1], 0.0f);
  EXPECT_GT(out[0], 0.4f);
  EXPECT_EQ(out[2], 1.0f);
  EXPECT_EQ(out[3], 1.0f);
  EXPECT_EQ(out[4], 0.0f);
  EXPECT_EQ(out[5], 0.0f);
  EXPECT_EQ(out[6], 1.0f);
  EXPECT_EQ(out[7], 1.0f);
  EXPECT_EQ(out[8], 0.25f);
  EXPECT_EQ(out[9], 0.0f);
  expect_signals(rows, 5, 4, "edge");
}

}  // namespace
}  // namespace moet
