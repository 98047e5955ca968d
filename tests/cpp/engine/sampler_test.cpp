// Sampler: greedy, seeded reproducibility, top-k/top-p/min-p truncation, penalties, logit_bias,
// logprobs of the raw distribution, and parameter validation.
#include "engine/sampler.h"

#include "core/error.h"

#include <gtest/gtest.h>

#include <cmath>
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
