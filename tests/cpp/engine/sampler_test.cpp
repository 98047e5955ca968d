// Sampler: greedy, seeded reproducibility, top-k/top-p/min-p truncation, penalties, logit_bias,
// logprobs of the raw distribution, parameter validation, the partial sort drawing the same
// tokens as a full sort, and sampling from a row's best logits (sample_top) drawing what sampling
// from the whole row draws, with top_width() saying when that holds.
#include "engine/sampler.h"

#include "../random_values.h"
#include "core/error.h"
#include "kernels/cpu/softmax_weights.h"
#include "kernels/cpu/top_logits.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
#include <set>

namespace moet {
namespace {

const std::vector<float> kLogits = {1.0f, 3.0f, 2.0f, 0.5f, 2.9f};

TEST(Sampler, GreedyPicksArgmax) {
  Sampler s({});
  EXPECT_EQ(s.sample(kLogits.data(), 5).token, 1);
}

TEST(Sampler, SeedReproduces) {
  SamplingParams p;
  p.temperature = 1.0f;
  p.seed = 42;
  std::vector<int32_t> a, b, c;
  Sampler sa(p), sb(p);
  p.seed = 43;
  Sampler sc(p);
  for (int i = 0; i < 64; ++i) {
    a.push_back(sa.sample(kLogits.data(), 5).token);
    b.push_back(sb.sample(kLogits.data(), 5).token);
    c.push_back(sc.sample(kLogits.data(), 5).token);
  }
  EXPECT_EQ(a, b);
  EXPECT_NE(a, c);
}

std::set<int32_t> support(SamplingParams p) {
  p.temperature = 1.0f;
  Sampler s(p);
  std::set<int32_t> seen;
  for (int i = 0; i < 400; ++i) seen.insert(s.sample(kLogits.data(), 5).token);
  return seen;
}

TEST(Sampler, Truncation) {
  SamplingParams p;
  p.top_k = 2;
  EXPECT_EQ(support(p), (std::set<int32_t>{1, 4}));
  p = {};
  p.top_p = 0.3f;  // the top token alone has p ~ 0.40
  EXPECT_EQ(support(p), (std::set<int32_t>{1}));
  p = {};
  p.min_p = 0.3f;  // keeps tokens with p >= 0.3 * p(1) ~ 0.12: ids 1, 4, 2
  EXPECT_EQ(support(p), (std::set<int32_t>{1, 2, 4}));
}

TEST(Sampler, LogitBiasAndPenalties) {
  SamplingParams p;
  p.logit_bias = {{3, 10.0f}};
  EXPECT_EQ(Sampler(p).sample(kLogits.data(), 5).token, 3);
  p = {};
  p.presence_penalty = 1.0f;  // token 1 was generated: 3 - 1 < 2.9
  const std::vector<int32_t> output = {1};
  EXPECT_EQ(Sampler(p).sample(kLogits.data(), 5, {}, output).token, 4);
  p = {};
  p.frequency_penalty = 0.05f;  // three times 1: 3 - 0.15 < 2.9
  const std::vector<int32_t> twice = {1, 1, 1};
  EXPECT_EQ(Sampler(p).sample(kLogits.data(), 5, {}, twice).token, 4);
  p = {};
  p.repetition_penalty = 2.0f;  // prompt token 1: 3 / 2 = 1.5
  const std::vector<int32_t> prompt = {1};
  EXPECT_EQ(Sampler(p).sample(kLogits.data(), 5, prompt, {}).token, 4);
}

TEST(Sampler, LogprobsAreRawLogSoftmax) {
  SamplingParams p;
  p.logprobs = 2;
  p.logit_bias = {{0, 50.0f}};
  const SampleResult r = Sampler(p).sample(kLogits.data(), 5);
  EXPECT_EQ(r.token, 0);
  double z = 0.0;
  for (float v : kLogits) z += std::exp(double(v));
  EXPECT_NEAR(r.logprob, 1.0 - std::log(z), 1e-5);
  ASSERT_EQ(r.top.size(), 2u);
  EXPECT_EQ(r.top[0].id, 1);
  EXPECT_EQ(r.top[1].id, 4);
  EXPECT_NEAR(r.top[0].logprob, 3.0 - std::log(z), 1e-5);
}

// The truncation and the draw as specified, over a fully sorted vocabulary: probabilities the
// weights softmax_weights() gives (e^((logit - max) / T) in float), tokens by logit then id,
// top-k, then top-p over the kept mass (the whole vocabulary's as softmax_weights() sums it),
// then min-p, then one uniform draw in [0, kept mass) walked in order, with sums in double. The
// sampler sorts only what it reads; it must pick the same.
std::vector<int32_t> reference_tokens(const std::vector<float>& logits, const SamplingParams& params, int draws) {
  std::mt19937_64 rng(params.seed);
  const size_t vocab = logits.size();
  const float max_logit = *std::max_element(logits.begin(), logits.end());
  std::vector<float> probs(vocab);
  const double vocab_mass =
      softmax_weights(logits.data(), int64_t(vocab), max_logit, 1.0f / params.temperature, probs.data(), cpu_isa_best());
  std::vector<int32_t> order(vocab);
  std::iota(order.begin(), order.end(), 0);
  std::sort(order.begin(), order.end(), [&](int32_t a, int32_t b) {
    return logits[size_t(a)] > logits[size_t(b)] || (logits[size_t(a)] == logits[size_t(b)] && a < b);
  });
  const auto mass = [&](size_t n) {
    double total = 0.0;
    for (size_t i = 0; i < n; ++i) total += probs[size_t(order[i])];
    return total;
  };
  size_t keep = params.top_k > 0 ? std::min<size_t>(size_t(params.top_k), vocab) : vocab;
  double total = keep == vocab ? vocab_mass : mass(keep);
  if (params.top_p < 1.0f) {
    double cumulative = 0.0;
    for (size_t i = 0; i < keep; ++i) {
      cumulative += probs[size_t(order[i])] / total;
      if (cumulative >= params.top_p) {
        keep = i + 1;
        break;
      }
    }
    total = mass(keep);
  }
  if (params.min_p > 0.0f) {
    const double threshold = params.min_p * probs[size_t(order[0])];
    while (keep > 1 && probs[size_t(order[keep - 1])] < threshold) --keep;
    total = mass(keep);
  }
  std::vector<int32_t> tokens;
  for (int d = 0; d < draws; ++d) {
    double u = std::uniform_real_distribution<double>(0.0, total)(rng);
    int32_t token = order[keep - 1];
    for (size_t i = 0; i < keep; ++i) {
      u -= probs[size_t(order[i])];
      if (u <= 0.0) {
        token = order[i];
        break;
      }
    }
    tokens.push_back(token);
  }
  return tokens;
}

// A 5000-token vocabulary, peaked (an LLM-like head over a long tail) and flat (wide random
// logits), with runs of equal logits for the ties (one across the first sorted prefix's end): every truncation, 300 draws each, the same
// tokens as the reference, including draws deep in the tail that make the sampler sort more.
TEST(Sampler, PartialSortDrawsAsAFullSort) {
  std::mt19937 rng(7);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (float spread : {2.0f, 8.0f}) {
    std::vector<float> logits(5000);
    for (float& v : logits) v = spread * normal(rng);
    for (size_t i = 0; i < 40; ++i) logits[100 + i] = logits[17];  // ties
    for (int i = 0; i < 5; ++i) logits[size_t(i * 997)] = 3.0f * spread;  // a head
    // Equal logits at ranks 240..299, across the first prefix the sampler sorts (256 tokens).
    std::vector<float> ranked = logits;
    std::sort(ranked.begin(), ranked.end(), std::greater<float>());
    for (float& v : logits)
      if (v <= ranked[240] && v >= ranked[299]) v = ranked[240];
    struct Case {
      float temperature, top_p, min_p;
      int64_t top_k;
    };
    for (const Case& c : {Case{1.0f, 1.0f, 0.0f, 0}, Case{0.7f, 0.9f, 0.0f, 0}, Case{1.3f, 0.5f, 0.0f, 0},
                          Case{1.0f, 1.0f, 0.0f, 40}, Case{0.8f, 0.95f, 0.0f, 300}, Case{1.0f, 1.0f, 0.05f, 0},
                          Case{2.0f, 0.99f, 0.001f, 0}, Case{5.0f, 1.0f, 0.0f, 0}}) {
      SamplingParams p;
      p.temperature = c.temperature;
      p.top_p = c.top_p;
      p.min_p = c.min_p;
      p.top_k = c.top_k;
      p.seed = uint64_t(spread * 100) + uint64_t(c.top_k);
      Sampler sampler(p);
      std::vector<int32_t> tokens;
      for (int d = 0; d < 300; ++d) tokens.push_back(sampler.sample(logits.data(), int64_t(logits.size())).token);
      EXPECT_EQ(tokens, reference_tokens(logits, p, 300))
          << "spread " << spread << " T " << c.temperature << " top_p " << c.top_p << " min_p " << c.min_p << " top_k "
          << c.top_k;
    }
  }
}

TEST(Sampler, ArgmaxTakesTheFirstOfEqualMaxima) {
  std::vector<float> v(1000, -1.0f);
  v[333] = v[777] = 5.0f;
  v[5] = NAN;
  EXPECT_EQ(argmax(v.data(), int64_t(v.size())), 333);
  v[999] = INFINITY;
  EXPECT_EQ(argmax(v.data(), int64_t(v.size())), 999);
  EXPECT_EQ(argmax(v.data(), 7), 0);  // all -1 but a NaN: the first -1
}

// sample_top() on a row's 256 best logits as top_logits() writes them draws what sample() draws on
// the whole row: 30 draws from each of two generators of one seed give the same tokens (so the
// generator is used alike), greedy and top-k with temperature, top-p and min-p, on rows with ties,
// NaNs, -inf and +inf, an all-NaN row and a one-value row. The greedy candidate is argmax().
TEST(Sampler, TopLogitsDrawAsTheWholeRow) {
  const int64_t vocab = 5000, rows = 6, n = 256;
  auto logits = awkward_logits(rows, vocab, 11);
  for (int64_t r : {0, 3, 4})  // a +inf takes all the mass; keep one in row 5 only
    std::replace(logits.begin() + r * vocab, logits.begin() + (r + 1) * vocab, INFINITY, 6.0f);
  std::vector<float> values(static_cast<size_t>(rows * n));
  std::vector<int32_t> ids(static_cast<size_t>(rows * n));
  top_logits(logits.data(), rows, vocab, n, values.data(), ids.data());
  int cases = 0;
  for (int64_t r = 0; r < rows; ++r) {
    const float* row = logits.data() + r * vocab;
    EXPECT_EQ(ids[size_t(r * n)], argmax(row, vocab)) << "row " << r;
    for (float temperature : {0.0f, 0.3f, 1.0f, 2.5f}) {
      for (int64_t top_k : {1, 7, 50, 256}) {
        for (float top_p : {1.0f, 0.9f, 0.4f}) {
          for (float min_p : {0.0f, 0.1f}) {
            SamplingParams p;
            p.temperature = temperature;
            p.top_k = top_k;
            p.top_p = top_p;
            p.min_p = min_p;
            p.seed = uint64_t(++cases);
            ASSERT_EQ(Sampler::top_width(p, vocab), temperature == 0.0f ? 1 : top_k);
            Sampler whole(p), top(p);
            for (int d = 0; d < 30; ++d)
              ASSERT_EQ(whole.sample(row, vocab).token,
                        top.sample_top(values.data() + r * n, ids.data() + r * n, n, vocab).token)
                  << "row " << r << " T " << temperature << " top_k " << top_k << " top_p " << top_p << " min_p "
                  << min_p << " draw " << d;
          }
        }
      }
    }
  }
}

// Rows need the whole vocabulary with logit_bias, penalties, logprobs, no top-k or top-k of the
// whole vocabulary; sample_top() refuses them, and too few candidates for the top-k.
TEST(Sampler, TopWidthNamesWhatSampleTopNeeds) {
  const int64_t vocab = 5;
  SamplingParams p;
  EXPECT_EQ(Sampler::top_width(p, vocab), 1);
  p.temperature = 1.0f;
  EXPECT_EQ(Sampler::top_width(p, vocab), 0);  // top_k 0: all of the row
  p.top_k = 5;
  EXPECT_EQ(Sampler::top_width(p, vocab), 0);  // the whole vocabulary: the top-p sum is in token order
  p.top_k = 4;
  EXPECT_EQ(Sampler::top_width(p, vocab), 4);
  const auto without = [&](auto change) {
    SamplingParams q = p;
    change(q);
    return Sampler::top_width(q, vocab);
  };
  EXPECT_EQ(without([](SamplingParams& q) { q.logprobs = 0; }), 0);
  EXPECT_EQ(without([](SamplingParams& q) { q.logit_bias = {{1, 1.0f}}; }), 0);
  EXPECT_EQ(without([](SamplingParams& q) { q.repetition_penalty = 1.1f; }), 0);
  EXPECT_EQ(without([](SamplingParams& q) { q.presence_penalty = 0.5f; }), 0);
  EXPECT_EQ(without([](SamplingParams& q) { q.frequency_penalty = 0.5f; }), 0);
  const std::vector<float> values = {3.0f, 2.9f, 2.0f};
  const std::vector<int32_t> ids = {1, 4, 2};
  EXPECT_THROW(Sampler(p).sample_top(values.data(), ids.data(), 3, vocab), Error);  // top_k 4 > 3 given
  p.logprobs = 1;
  EXPECT_THROW(Sampler(p).sample_top(values.data(), ids.data(), 3, vocab), Error);
}

TEST(Sampler, ValidateNamesTheField) {
  SamplingParams p;
  p.logit_bias = {{7, 1.0f}};
  EXPECT_THROW(p.validate(5), Error);
  p = {};
  p.top_p = 0.0f;
  EXPECT_THROW(p.validate(5), Error);
  p = {};
  p.presence_penalty = 3.0f;
  EXPECT_THROW(p.validate(5), Error);
  p = {};
  EXPECT_NO_THROW(p.validate(5));
}

}  // namespace
}  // namespace moet
