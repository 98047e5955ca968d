// Speculative decoding (engine/speculative.h) on the CPU: --speculative-config parsing and its
// errors; prompt lookup; the acceptance rule keeps the target distribution (chi-square over 30000
// seeded verifications of two drafts on an 8-token vocabulary, for temperature, top-k, top-p and
// min-p, drafts inside and outside the kept set) and draws the tokens plain sampling draws; the
// scheduler's lookahead slots and draft handling; and through the engine: greedy output with 1, 2 and 3 MTP
// drafts is token for token the output without speculation on models/tiny (16 concurrent requests
// mixing prefill chunks and verify steps) and the deepseek_v3 fixture (with preemption and prefix
// caching), and so are ngram drafts on qwen3_moe; the logprobs of every token are bit-identical
// (so each step's logits after rejected drafts equal the non-speculative run's: rejected KV is
// discarded); stop ids, stop strings and max_tokens cut inside an accepted run; seeded sampling
// gives the tokens of a run without speculation; a prefix hit across a block boundary keeps only
// the blocks whose MTP entries hold and gives the drafts of an uncached run. Decode-like steps
// (engine/step_runner.h): the rule, and which steps of an MTP run the runner marks row-invariant
// (verify, decode and draft steps, not prompts); the FP4 confidence gate judges every verify row.
#include "../cpu_isa_env.h"
#include "backend/cpu/cpu_backend.h"
#include "core/error.h"
#include "engine/engine_core.h"
#include "engine/speculative.h"
#include "experts/fp4_tier.h"
#include "io/checkpoint.h"
#include "tokenizer/tokenizer.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <numeric>
#include <optional>

namespace moet {
namespace {

const std::filesystem::path kSource = std::filesystem::path(MOET_SOURCE_DIR);

// ---------------------------------------------------------------------------------- config

TEST(SpeculativeConfig, ParsesVllmSyntax) {
  const SpeculativeConfig mtp = speculative_config_parse(R"({"method":"mtp","num_speculative_tokens":3})");
  EXPECT_EQ(mtp.method, SpeculativeConfig::Method::mtp);
  EXPECT_EQ(mtp.num_speculative_tokens, 3);
  EXPECT_EQ(speculative_config_parse(R"({"method":"mtp","num_speculative_tokens":15})").num_speculative_tokens, 15);
  const SpeculativeConfig ngram =
      speculative_config_parse(R"({"method":"ngram","num_speculative_tokens":2,"prompt_lookup_max":4})");
  EXPECT_EQ(ngram.method, SpeculativeConfig::Method::ngram);
  EXPECT_EQ(ngram.prompt_lookup_max, 4);
  EXPECT_EQ(ngram.prompt_lookup_min, 1);
  EXPECT_FALSE(speculative_config_parse("").enabled());
}

TEST(SpeculativeConfig, BadConfigsNameTheFlagAndTheField) {
  const std::vector<std::pair<std::string, std::string>> bad = {
      {R"({"method":"eagle","num_speculative_tokens":2})", "unknown method 'eagle'"},
      {R"({"method":"mtp","num_speculative_tokens":0})", "'num_speculative_tokens' must be an integer >= 1"},
      {R"({"method":"mtp","num_speculative_tokens":-2})", "'num_speculative_tokens' must be an integer >= 1"},
      {R"({"method":"mtp","num_speculative_tokens":"2"})", "'num_speculative_tokens' must be an integer >= 1"},
      {R"({"method":"mtp"})", "'num_speculative_tokens' is required"},
      {R"({"method":"mtp","num_speculative_tokens":16})", "'num_speculative_tokens' 16 is more than 15"},
      {R"({"num_speculative_tokens":2})", "'method'"},
      {R"({"method":"mtp","num_speculative_tokens":2,"draft":1})", "unknown field 'draft'"},
      {R"({"method":"ngram","num_speculative_tokens":2,"prompt_lookup_max":2,"prompt_lookup_min":3})",
       "prompt_lookup_min 3 is larger"},
      {R"({"method":"mtp","num_speculative_tokens":2,"prompt_lookup_max":2})", "fields of method ngram"},
      {"mtp", "not a JSON object"},
  };
  for (const auto& [text, message] : bad) {
    try {
      speculative_config_parse(text);
      ADD_FAILURE() << text << " was accepted";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("--speculative-config"), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find(message), std::string::npos) << e.what();
    }
  }
}

// ---------------------------------------------------------------------------------- ngram

TEST(Ngram, ProposesWhatFollowedTheLatestLongestMatch) {
  // The suffix [7 8 9] occurred at 1 and 7; the latest (7) was followed by 4 5.
  const std::vector<int32_t> tokens = {6, 7, 8, 9, 1, 2, 3, 7, 8, 9, 4, 5, 0, 8, 9};
  EXPECT_EQ(ngram_propose(tokens, 2, 1, 3), (std::vector<int32_t>{4, 5}));
  // Only n = 3 allowed: [0 8 9] never occurred before.
  EXPECT_TRUE(ngram_propose(tokens, 2, 3, 3).empty());
  // Fewer than k tokens when the occurrence is near the end.
  const std::vector<int32_t> repeat = {1, 2, 3, 1, 2, 3, 1, 2};
  EXPECT_EQ(ngram_propose(repeat, 5, 1, 2), (std::vector<int32_t>{3, 1, 2}));
  EXPECT_TRUE(ngram_propose(std::vector<int32_t>{1, 2, 3}, 4, 1, 3).empty());
  EXPECT_TRUE(ngram_propose(std::vector<int32_t>{5}, 4, 1, 3).empty());
}

// ---------------------------------------------------------------------------------- acceptance

// The distribution the sampler's parameters define over `logits`, computed independently:
// softmax at the temperature over the tokens kept by top-k, then top-p over the renormalised
// kept mass, then min-p relative to the best token.
std::vector<double> target_distribution(const std::vector<float>& logits, const SamplingParams& p) {
  const size_t n = logits.size();
  std::vector<size_t> order(n);
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return logits[a] > logits[b]; });
  std::vector<double> w(n);
  for (size_t i = 0; i < n; ++i) w[i] = std::exp((double(logits[i]) - double(logits[order[0]])) / p.temperature);
  size_t keep = p.top_k > 0 ? std::min(n, size_t(p.top_k)) : n;
  double total = 0.0;
  for (size_t r = 0; r < keep; ++r) total += w[order[r]];
  if (p.top_p < 1.0f) {
    double cumulative = 0.0;
    for (size_t r = 0; r < keep; ++r) {
      cumulative += w[order[r]] / total;
      if (cumulative >= p.top_p) {
        keep = r + 1;
        break;
      }
    }
  }
  if (p.min_p > 0.0f) {
    size_t above = 0;
    for (size_t i = 0; i < n; ++i) above += w[i] >= p.min_p * w[order[0]] ? 1 : 0;
    keep = std::max<size_t>(1, std::min(keep, above));
  }
  std::vector<double> probs(n, 0.0);
  double kept = 0.0;
  for (size_t r = 0; r < keep; ++r) kept += w[order[r]];
  for (size_t r = 0; r < keep; ++r) probs[order[r]] = w[order[r]] / kept;
  return probs;
}

// 0.1% critical values of the chi-square distribution with 1 .. 7 degrees of freedom.
constexpr double kChiSquare999[] = {0.0, 10.83, 13.82, 16.27, 18.47, 20.52, 22.46, 24.32};

// Chi-square of `counts` (n draws) against `probs`; tokens of probability 0 must never be drawn.
void expect_distribution(const std::vector<int64_t>& counts, const std::vector<double>& probs,
                         const std::string& what) {
  const int64_t draws = std::accumulate(counts.begin(), counts.end(), int64_t(0));
  ASSERT_GT(draws, 1000) << what;
  double chi = 0.0;
  int64_t support = 0;
  for (size_t t = 0; t < probs.size(); ++t) {
    if (probs[t] == 0.0) {
      EXPECT_EQ(counts[t], 0) << what << ": token " << t << " is outside the kept set";
      continue;
    }
    ++support;
    const double expected = double(draws) * probs[t];
    chi += (double(counts[t]) - expected) * (double(counts[t]) - expected) / expected;
  }
  if (support > 1) {
    EXPECT_LT(chi, kChiSquare999[support - 1]) << what << ": chi-square " << chi;
  }
}

// Three verify rows (fixed logits over 8 tokens) and two drafts, 30000 seeded verifications per
// parameter set: the first token follows row 0's distribution, the second (drawn only when the
// first draft was accepted) row 1's, the third row 2's; a draft outside the kept set is never
// accepted; and the tokens are those plain sampling of the rows draws with the same seed.
TEST(SpeculativeSampling, AcceptanceKeepsTheTargetDistribution) {
  const std::vector<std::vector<float>> rows = {{1.9f, 1.4f, 1.0f, 0.6f, 0.1f, -0.3f, -0.9f, -2.5f},
                                                {0.2f, 1.1f, -0.4f, 1.6f, 0.9f, -1.2f, 0.0f, 0.5f},
                                                {-0.5f, 0.3f, 1.2f, 0.8f, -0.1f, 1.7f, 0.4f, -2.0f}};
  const int64_t vocab = 8, trials = 30000;
  std::vector<SamplingParams> cases(5);
  cases[0].temperature = 1.0f;
  cases[1].temperature = 0.7f;
  cases[1].top_k = 5;
  cases[2].temperature = 1.3f;
  cases[2].top_p = 0.8f;
  cases[3].temperature = 1.0f;
  cases[3].min_p = 0.15f;
  cases[4].temperature = 1.0f;
  cases[4].top_k = 4;
  cases[4].top_p = 0.9f;
  for (size_t c = 0; c < cases.size(); ++c) {
    SamplingParams& params = cases[c];
    params.seed = 11 + c;
    // Drafts: row 0's best token, then row 1's best, or with top-k 4 its worst (never kept).
    const std::vector<int32_t> drafts = {0, params.top_k == 4 ? 5 : 3};
    Sampler verifying(params), plain(params);
    std::vector<std::vector<int64_t>> counts(3, std::vector<int64_t>(size_t(vocab), 0));
    for (int64_t t = 0; t < trials; ++t) {
      const std::vector<SampleResult> got = verify_drafts(
          drafts, [&](size_t row) { return verifying.sample(rows[row].data(), vocab); });
      ASSERT_LE(got.size(), 3u);
      for (size_t row = 0; row < got.size(); ++row) {
        ++counts[row][size_t(got[row].token)];
        EXPECT_EQ(got[row].token, plain.sample(rows[row].data(), vocab).token) << "trial " << t;
        if (row + 1 < got.size()) {
          EXPECT_EQ(got[row].token, drafts[row]);
        }
      }
      if (got.size() < 3) {
        EXPECT_NE(got.back().token, drafts[got.size() - 1]);
      }
    }
    const bool second_kept = target_distribution(rows[1], params)[size_t(drafts[1])] > 0.0;
    EXPECT_EQ(second_kept, params.top_k != 4);
    for (size_t row = 0; row < 3; ++row) {
      const std::vector<double> probs = target_distribution(rows[row], params);
      if (row == 2 && !second_kept) {
        EXPECT_EQ(std::accumulate(counts[2].begin(), counts[2].end(), int64_t(0)), 0) << "a dropped draft was accepted";
        continue;
      }
      expect_distribution(counts[row], probs, "case " + std::to_string(c) + ", row " + std::to_string(row));
    }
  }
}

TEST(SpeculativeSampling, GreedyKeepsTheLongestMatchingPrefix) {
  const std::vector<std::vector<float>> rows = {{0.5f, 2.0f, 1.0f}, {3.0f, 0.0f, 1.0f}, {0.0f, 0.1f, 0.2f}};
  Sampler sampler(SamplingParams{});
  const auto greedy = [&](std::vector<int32_t> drafts) {
    std::vector<int32_t> tokens;
    for (const SampleResult& r : verify_drafts(drafts, [&](size_t i) { return sampler.sample(rows[i].data(), 3); }))
      tokens.push_back(r.token);
    return tokens;
  };
  EXPECT_EQ(greedy({1, 0}), (std::vector<int32_t>{1, 0, 2}));  // both accepted, then the bonus
  EXPECT_EQ(greedy({1, 2}), (std::vector<int32_t>{1, 0}));     // the second rejected
  EXPECT_EQ(greedy({2, 0}), (std::vector<int32_t>{1}));        // the first rejected
  EXPECT_EQ(greedy({}), (std::vector<int32_t>{1}));
}

// ---------------------------------------------------------------------------------- scheduler

TEST(SpeculativeScheduler, DraftsAreScheduledWithLookaheadAndDroppedOnPreemption) {
  KvBlockPool pool(4, 4);
  Scheduler scheduler({8, 64, 3, {}}, pool);
  Sequence a, b;
  a.id = 1;
  a.tokens = {1, 2, 3, 4, 5};
  a.prompt_len = 5;
  b.id = 2;
  b.tokens = {6, 7, 8};
  b.prompt_len = 3;
  scheduler.add(&a);
  scheduler.add(&b);
  StepPlan plan = scheduler.schedule();
  ASSERT_EQ(plan.chunks.size(), 2u);
  EXPECT_EQ(a.blocks.size(), 2u);  // 5 tokens + 3 lookahead slots
  EXPECT_EQ(b.blocks.size(), 2u);  // 3 + 3: the pool is now empty
  scheduler.complete(plan);
  // b samples a token and gets two drafts: its next chunk is the three of them.
  b.tokens.insert(b.tokens.end(), {9, 10, 11});
  b.num_draft_tokens = 2;
  a.tokens.push_back(12);
  // a needs a third block (6 tokens + 3): b, admitted last, is preempted and loses its drafts.
  plan = scheduler.schedule();
  ASSERT_EQ(plan.preempted, std::vector<int64_t>{2});
  EXPECT_EQ(b.tokens, (std::vector<int32_t>{6, 7, 8, 9}));
  EXPECT_EQ(b.num_draft_tokens, 0);
  EXPECT_EQ(b.num_computed, 0);
  ASSERT_EQ(plan.chunks.size(), 1u);
  EXPECT_EQ(plan.chunks[0].count, 1);
  EXPECT_EQ(a.blocks.size(), 3u);
  scheduler.complete(plan);
  // With drafts, a's chunk is [last token, drafts], all of them verified in one step.
  a.tokens.insert(a.tokens.end(), {13, 14, 15});
  a.num_draft_tokens = 2;
  plan = scheduler.schedule();
  ASSERT_GE(plan.chunks.size(), 1u);
  EXPECT_EQ(plan.chunks[0].begin, 6);
  EXPECT_EQ(plan.chunks[0].count, 3);
  EXPECT_TRUE(plan.chunks[0].samples());
  EXPECT_EQ(a.blocks.size(), 3u);  // 9 tokens + 3 lookahead
}

// ---------------------------------------------------------------------------------- engine

struct Loaded {
  Checkpoint checkpoint;
  std::unique_ptr<Backend> backend = cpu_backend_create({2, test_cpu_isa()});
  std::unique_ptr<Model> model;
  Loaded(const std::filesystem::path& dir, bool mtp, std::optional<Fp4TierConfig> tier = std::nullopt)
      : checkpoint(Checkpoint::open(dir)) {
    ModelLoadOptions options;
    options.load_mtp = mtp;
    options.fp4_tier = std::move(tier);
    model = model_load(checkpoint, *backend, nullptr, options);
  }
};

Loaded& tiny() {
  static Loaded l(kSource / "models" / "tiny", true);
  return l;
}

Loaded& fixture(const std::string& name, bool mtp) {
  static std::map<std::string, std::unique_ptr<Loaded>> loaded;
  auto& slot = loaded[name];
  if (!slot) slot = std::make_unique<Loaded>(kSource / "tests" / "fixtures" / name, mtp);
  return *slot;
}

struct Collected {
  std::vector<int32_t> tokens;
  std::vector<float> logprobs;
  std::string text, finish_reason;
  int64_t outputs = 0;
};

std::map<int64_t, Collected> run(EngineCore& engine, const std::vector<RequestParams>& requests) {
  std::map<int64_t, Collected> out;
  for (size_t i = 0; i < requests.size(); ++i) {
    engine.add(int64_t(i), requests[i], [&out, i](RequestOutput&& o) {
      Collected& c = out[int64_t(i)];
      c.tokens.insert(c.tokens.end(), o.token_ids.begin(), o.token_ids.end());
      for (const SampleResult& s : o.logprobs) c.logprobs.push_back(s.logprob);
      c.text += o.text;
      ++c.outputs;
      if (o.finished) c.finish_reason = o.finish_reason;
    });
  }
  while (engine.has_work()) engine.step();
  return out;
}

EngineConfig engine_config(int64_t budget, int64_t blocks, bool caching, const std::string& speculative) {
  EngineConfig c;
  c.max_num_batched_tokens = budget;
  c.block_size = 4;
  c.num_blocks = blocks;
  c.enable_prefix_caching = caching;
  c.max_model_len = 128;
  c.speculative = speculative_config_parse(speculative);
  return c;
}

std::string mtp_config(int64_t k) {
  return R"({"method":"mtp","num_speculative_tokens":)" + std::to_string(k) + "}";
}

// Sixteen prompts of real text through the tiny model's tokenizer, greedy, with logprobs.
std::vector<RequestParams> tiny_requests(int64_t max_tokens) {
  const Tokenizer tokenizer = Tokenizer::from_dir(kSource / "models" / "tiny");
  const char* texts[] = {"def fibonacci(n):\n",     "The history of the English language",
                         "import os\ndef list_files(path):\n", "It was a cold morning when",
                         "for i in range(10):\n",    "The committee decided that",
                         "#include <stdio.h>\nint main(void) {\n", "The server listens on port",
                         "class Stack:\n    def __init__(self):\n", "Water \\Wa\"ter\\, n.",
                         "with open(path) as f:\n",  "The options are as follows:",
                         "func main() {\n",          "If the file does not exist,",
                         "x = [i * i for i in",      "The word is derived from"};
  std::vector<RequestParams> requests;
  for (const char* text : texts) {
    RequestParams p;
    p.prompt = tokenizer.encode(text);
    p.max_tokens = max_tokens;
    p.sampling.logprobs = 0;
    requests.push_back(p);
  }
  return requests;
}

void expect_same_outputs(const std::map<int64_t, Collected>& got, const std::map<int64_t, Collected>& expected,
                         const std::string& what) {
  ASSERT_EQ(got.size(), expected.size());
  for (const auto& [i, e] : expected) {
    const Collected& g = got.at(i);
    EXPECT_EQ(g.tokens, e.tokens) << what << ", request " << i;
    EXPECT_EQ(g.finish_reason, e.finish_reason) << what << ", request " << i;
    ASSERT_EQ(g.logprobs.size(), e.logprobs.size()) << what << ", request " << i;
    EXPECT_TRUE(e.logprobs.empty() ||
                std::memcmp(g.logprobs.data(), e.logprobs.data(), e.logprobs.size() * sizeof(float)) == 0)
        << what << ", request " << i << ": logprobs differ";
  }
}

TEST(SpeculativeEngine, GreedyMtpOutputIsUnchangedOnTheTinyModel) {
  const auto requests = tiny_requests(20);
  EngineCore plain(*tiny().model, std::nullopt, engine_config(48, 512, false, ""));
  const auto expected = run(plain, requests);
  for (int64_t k : {1, 2, 3}) {
    EngineCore engine(*tiny().model, std::nullopt, engine_config(48, 512, false, mtp_config(k)));
    const auto got = run(engine, requests);
    expect_same_outputs(got, expected, "k = " + std::to_string(k));
    const SpeculativeStats stats = *engine.stats().speculative;
    EXPECT_GT(stats.accepted_tokens, 0) << "k = " << k;
    EXPECT_LT(stats.accepted_tokens, stats.draft_tokens) << "k = " << k;  // rejections happened too
    EXPECT_GT(stats.acceptance_length(), 1.3) << "k = " << k;  // the MTP layer predicts real text
    int64_t outputs = 0, tokens = 0;
    for (const auto& [i, c] : got) outputs += c.outputs, tokens += int64_t(c.tokens.size());
    EXPECT_LT(outputs, tokens) << "k = " << k;  // several tokens per output (streaming chunks)
  }
}

TEST(SpeculativeEngine, GreedyOutputIsUnchangedWithPreemptionAndPrefixCaching) {
  Model& model = *fixture("deepseek_v3", true).model;
  std::vector<RequestParams> requests;
  for (int i = 0; i < 16; ++i) {
    RequestParams p;
    p.prompt = {5, 6, 7, 8, 9, 10, 11, 12};  // a shared prefix of two blocks
    for (int k = 0; k < 3 + i % 5; ++k) p.prompt.push_back(int32_t((i * 37 + k * 11) % 500 + 3));
    p.max_tokens = 12;
    p.sampling.logprobs = 0;
    requests.push_back(p);
  }
  EngineCore plain(model, std::nullopt, engine_config(2048, 512, false, ""));
  const auto expected = run(plain, requests);
  for (int64_t k : {1, 2, 3}) {
    EngineCore tight(model, std::nullopt, engine_config(64, 48, true, mtp_config(k)));
    expect_same_outputs(run(tight, requests), expected, "k = " + std::to_string(k));
    const EngineStats stats = tight.stats();
    EXPECT_GT(stats.preemptions, 0);
    EXPECT_GT(stats.kv.prefix_hits, 0);
    EXPECT_EQ(stats.kv.used, 0);
    EXPECT_GT(stats.speculative->draft_tokens, 0);
  }
}

TEST(SpeculativeEngine, GreedyNgramOutputIsUnchanged) {
  Model& model = *fixture("qwen3_moe", false).model;
  std::vector<RequestParams> requests;
  for (int i = 0; i < 8; ++i) {
    RequestParams p;
    for (int rep = 0; rep < 3; ++rep)
      for (int k = 0; k < 4; ++k) p.prompt.push_back(int32_t((i * 31 + k * 17) % 500 + 3));
    p.max_tokens = 16;
    p.sampling.logprobs = 0;
    requests.push_back(p);
  }
  EngineCore plain(model, std::nullopt, engine_config(2048, 512, false, ""));
  const auto expected = run(plain, requests);
  const std::string ngram = R"({"method":"ngram","num_speculative_tokens":3,"prompt_lookup_max":3})";
  EngineCore engine(model, std::nullopt, engine_config(24, 512, true, ngram));
  expect_same_outputs(run(engine, requests), expected, "ngram");
  EXPECT_GT(engine.stats().speculative->draft_tokens, 0);
}

TEST(SpeculativeEngine, StopsAndLengthCutInsideAnAcceptedRun) {
  const Tokenizer tokenizer = Tokenizer::from_dir(kSource / "models" / "tiny");
  RequestParams base = tiny_requests(24)[0];
  EngineCore plain(*tiny().model, tokenizer, engine_config(2048, 512, false, ""));
  const Collected full = run(plain, {base}).at(0);
  ASSERT_EQ(full.tokens.size(), 24u);
  EngineCore engine(*tiny().model, tokenizer, engine_config(2048, 512, false, mtp_config(3)));
  for (int64_t max_tokens = 1; max_tokens <= 9; ++max_tokens) {
    RequestParams p = base;
    p.max_tokens = max_tokens;
    const Collected got = run(engine, {p}).at(0);
    EXPECT_EQ(got.tokens, std::vector<int32_t>(full.tokens.begin(), full.tokens.begin() + max_tokens));
    EXPECT_EQ(got.finish_reason, "length");
  }
  // A stop id: the first occurrence of a token the output has after its fourth token.
  const size_t at = 4;
  const int32_t stop = full.tokens[at];
  const size_t first = size_t(std::find(full.tokens.begin(), full.tokens.end(), stop) - full.tokens.begin());
  RequestParams with_id = base;
  with_id.stop_ids = {stop};
  const Collected stopped = run(engine, {with_id}).at(0);
  EXPECT_EQ(stopped.tokens, std::vector<int32_t>(full.tokens.begin(), full.tokens.begin() + long(first) + 1));
  EXPECT_EQ(stopped.finish_reason, "stop");
  // A stop string: a piece of the text of tokens 5 .. 6.
  const std::string tail = tokenizer.decode(std::vector<int32_t>(full.tokens.begin() + 5, full.tokens.begin() + 7));
  ASSERT_FALSE(tail.empty());
  RequestParams with_string = base;
  with_string.stop = {tail};
  RequestParams plain_string = with_string;
  const Collected expected = run(plain, {plain_string}).at(0);
  const Collected got = run(engine, {with_string}).at(0);
  EXPECT_EQ(got.tokens, expected.tokens);
  EXPECT_EQ(got.text, expected.text);
  EXPECT_EQ(got.finish_reason, "stop");
  EXPECT_LT(got.tokens.size(), full.tokens.size());
}

TEST(SpeculativeEngine, SeededSamplingDrawsTheTokensOfARunWithoutSpeculation) {
  std::vector<RequestParams> requests = tiny_requests(16);
  for (size_t i = 0; i < requests.size(); ++i) {
    requests[i].sampling.temperature = 0.8f;
    requests[i].sampling.top_p = i % 2 ? 0.95f : 1.0f;
    requests[i].sampling.top_k = i % 3 ? 0 : 40;
    requests[i].sampling.repetition_penalty = i % 4 ? 1.0f : 1.2f;
    requests[i].sampling.seed = uint64_t(i / 2);
  }
  EngineCore plain(*tiny().model, std::nullopt, engine_config(2048, 512, false, ""));
  const auto expected = run(plain, requests);
  EngineCore engine(*tiny().model, std::nullopt, engine_config(24, 512, true, mtp_config(2)));
  expect_same_outputs(run(engine, requests), expected, "seeded sampling");
  EXPECT_GT(engine.stats().speculative->accepted_tokens, 0);
}

TEST(SpeculativeEngine, PrefixHitsGiveTheDraftsOfAnUncachedRun) {
  // B shares A's first 8 tokens (two blocks of 4) and differs right after them: the MTP layer's
  // entry at position 7 was computed with A's token 8, so B may take only A's first block.
  const Tokenizer tokenizer = Tokenizer::from_dir(kSource / "models" / "tiny");
  RequestParams a;
  a.prompt = tokenizer.encode("The history of the English language begins with the arrival of three tribes");
  ASSERT_GE(a.prompt.size(), 9u);
  a.prompt.resize(9);
  a.max_tokens = 12;
  RequestParams b = a;
  b.prompt[8] = a.prompt[8] == 13 ? 14 : 13;
  b.prompt.insert(b.prompt.end(), {200, 300, 400});
  EngineCore alone(*tiny().model, std::nullopt, engine_config(2048, 512, false, mtp_config(2)));
  const auto expected_b = run(alone, {b}).at(0);
  const SpeculativeStats b_alone = *alone.stats().speculative;
  EngineCore cached(*tiny().model, std::nullopt, engine_config(2048, 512, true, mtp_config(2)));
  run(cached, {a});
  const SpeculativeStats after_a = *cached.stats().speculative;
  const auto got_b = run(cached, {b}).at(0);
  EXPECT_EQ(got_b.tokens, expected_b.tokens);
  EXPECT_EQ(cached.stats().kv.prefix_hits, 4);  // the first block; the second was refused
  const SpeculativeStats total = *cached.stats().speculative;
  EXPECT_EQ(total.draft_tokens - after_a.draft_tokens, b_alone.draft_tokens);
  EXPECT_EQ(total.accepted_tokens - after_a.accepted_tokens, b_alone.accepted_tokens);
  for (size_t i = 0; i < b_alone.accepted_per_position.size(); ++i)
    EXPECT_EQ(total.accepted_per_position[i] - after_a.accepted_per_position[i], b_alone.accepted_per_position[i]);
}

// ---------------------------------------------------------------------------------- decode-like steps

// Two sequences of 40 known tokens and a step of one chunk each, ending at the last token: rows_a
// rows of `a` returning logits_a, rows_b rows of `b` returning its last row's.
struct TwoSequences {
  Sequence a, b;
  TwoSequences() {
    a.tokens.assign(40, 5);
    b.tokens.assign(40, 5);
  }
  StepPlan plan(int64_t rows_a, int64_t rows_b, ChunkRows logits_a = ChunkRows::last) {
    StepPlan p;
    p.chunks.push_back({&a, 40 - rows_a, rows_a, logits_a});
    p.chunks.push_back({&b, 40 - rows_b, rows_b, ChunkRows::last});
    return p;
  }
};

// The rule (engine/step_runner.h): a step is row-invariant when every chunk has at most
// kRowInvariantMaxRun rows (the verify chunk of the largest k), whatever else the step holds.
TEST(RowInvariantSteps, EveryChunkAtMostTheLongestVerifyChunk) {
  TwoSequences two;
  const auto plan = [&](int64_t rows_a, int64_t rows_b) { return two.plan(rows_a, rows_b); };
  EXPECT_TRUE(row_invariant_step(plan(1, 1)));                                        // decode
  EXPECT_TRUE(row_invariant_step(plan(4, 1)));                                        // a verify chunk, k = 3
  EXPECT_TRUE(row_invariant_step(plan(kRowInvariantMaxRun, kRowInvariantMaxRun)));   // k = 15
  EXPECT_FALSE(row_invariant_step(plan(1, kRowInvariantMaxRun + 1)));                // a prompt chunk beside
  EXPECT_FALSE(row_invariant_step(plan(40, 40)));
}

// Which steps of an MTP run the runner marks, told apart by what they are (not by their size):
// every verify, decode and chained draft step, and the MTP catch-up after a verify step; never the
// prompts of 20 tokens nor the MTP catch-up over them. Also which of them the runner would capture
// as CUDA graphs (StepHook::before_pass's `recurring`).
class StepKinds final : public StepHook {
 public:
  explicit StepKinds(const StepRunner& runner) : runner_(runner) {}
  struct Count {
    int64_t marked = 0, unmarked = 0, recurring = 0;
  };
  static const char* kind_of(const StepPlan& plan) {
    bool prompt = false, drafts = false, multi_row = false;
    for (const ScheduledChunk& chunk : plan.chunks) {
      prompt = prompt || chunk.begin == 0;
      drafts = drafts || chunk.seq->num_draft_tokens > 0;
      multi_row = multi_row || chunk.count > 1;
    }
    return plan.mtp_hidden ? (prompt ? "catch-up over prompts" : multi_row ? "catch-up" : "draft")
           : prompt        ? "prompt"
           : drafts        ? "verify"
                           : "decode";
  }
  bool before_pass(const StepPlan& plan, int64_t pass, bool recurring) override {
    if (pass == 0 && recurring) ++counts[kind_of(plan)].recurring;
    return true;
  }
  StepDecision after_pass(const StepPlan& plan, const StepOutput&, int64_t pass) override {
    if (pass > 0) return StepDecision::done;
    Count& count = counts[kind_of(plan)];
    ++(runner_.marks_row_invariant(plan) ? count.marked : count.unmarked);
    return StepDecision::done;
  }
  std::map<std::string, Count> counts;

 private:
  const StepRunner& runner_;
};

std::vector<RequestParams> twenty_token_prompts() {
  std::vector<RequestParams> requests(4);
  for (size_t i = 0; i < requests.size(); ++i) {
    for (int32_t t = 0; t < 20; ++t) requests[i].prompt.push_back(int32_t((i * 37 + size_t(t) * 11) % 500 + 3));
    requests[i].max_tokens = 12;
  }
  return requests;
}

TEST(RowInvariantSteps, VerifyDecodeAndDraftStepsAreMarkedPromptsAreNot) {
  EngineCore engine(*tiny().model, std::nullopt, engine_config(2048, 512, false, mtp_config(3)));
  StepKinds kinds(engine.runner());
  engine.runner().add_hook(&kinds);
  run(engine, twenty_token_prompts());
  auto& counts = kinds.counts;
  EXPECT_EQ(counts["prompt"].marked, 0);
  EXPECT_EQ(counts["prompt"].unmarked, 1);  // the four prompts in one step
  EXPECT_EQ(counts["catch-up over prompts"].marked, 0);
  EXPECT_EQ(counts["catch-up over prompts"].unmarked, 1);
  EXPECT_GT(counts["verify"].marked, 0);
  EXPECT_GT(counts["draft"].marked, 0);
  for (const char* kind : {"verify", "draft", "catch-up", "decode"}) EXPECT_EQ(counts[kind].unmarked, 0) << kind;
}

// With SpeculativeConfig::graph_steps, verify steps and chained draft steps recur (CUDA graphs)
// like decode steps; the catch-up draft steps (several rows a chunk, logits of the last) and
// prompts never do. Without it only the decode steps recur.
TEST(RowInvariantSteps, VerifyAndChainedDraftStepsRecurWithGraphSteps) {
  for (const bool graph_steps : {true, false}) {
    EngineConfig config = engine_config(2048, 512, false, mtp_config(3));
    config.speculative.graph_steps = graph_steps;
    EngineCore engine(*tiny().model, std::nullopt, config);
    StepKinds kinds(engine.runner());
    engine.runner().add_hook(&kinds);
    run(engine, twenty_token_prompts());
    auto& counts = kinds.counts;
    for (const char* kind : {"verify", "draft"}) {
      EXPECT_GT(counts[kind].marked, 0) << kind;
      EXPECT_EQ(counts[kind].recurring, graph_steps ? counts[kind].marked : 0) << kind << " " << graph_steps;
    }
    EXPECT_EQ(counts["decode"].recurring, counts["decode"].marked);
    EXPECT_GT(counts["catch-up"].marked, 0);
    for (const char* kind : {"catch-up", "catch-up over prompts", "prompt"}) EXPECT_EQ(counts[kind].recurring, 0) << kind;
  }
}

// The rule itself: a multi-row chunk recurs only in a row-invariant step and only when it returns
// every row's logits.
TEST(RowInvariantSteps, MultiRowChunksRecurOnlyRowInvariantWithEveryRowsLogits) {
  TwoSequences two;
  const auto plan = [&](int64_t rows_a, ChunkRows logits_a) { return two.plan(rows_a, 1, logits_a); };
  EXPECT_TRUE(step_recurs(plan(1, ChunkRows::last), false));  // decode
  EXPECT_TRUE(step_recurs(plan(1, ChunkRows::if_sampling), false));
  EXPECT_FALSE(step_recurs(plan(1, ChunkRows::none), false));
  EXPECT_TRUE(step_recurs(plan(4, ChunkRows::all), true));  // verify, k = 3
  EXPECT_FALSE(step_recurs(plan(4, ChunkRows::all), false));
  EXPECT_FALSE(step_recurs(plan(4, ChunkRows::last), true));  // a draft catch-up or a short prompt
}

// Without speculative decoding no step is marked: decode steps keep the kernels sized to their rows.
TEST(RowInvariantSteps, NothingIsMarkedWithoutSpeculation) {
  EngineCore engine(*tiny().model, std::nullopt, engine_config(2048, 512, false, ""));
  StepKinds kinds(engine.runner());
  engine.runner().add_hook(&kinds);
  run(engine, twenty_token_prompts());
  EXPECT_GT(kinds.counts["decode"].unmarked, 0);
  for (const auto& [kind, count] : kinds.counts) EXPECT_EQ(count.marked, 0) << kind;
}

// The FP4 confidence gate judges every row a step samples (ARCHITECTURE.md section 6): in a
// verify step the last known token's row and each draft's, so the forward returns the confidence
// of 1 + drafts rows per sampling chunk.
class SampledRows final : public StepHook {
 public:
  StepDecision after_pass(const StepPlan& plan, const StepOutput& output, int64_t) override {
    int64_t sampled = 0;
    for (const ScheduledChunk& chunk : plan.chunks)
      if (chunk.samples()) sampled += 1 + chunk.seq->num_draft_tokens;
    EXPECT_EQ(output.confidence.size(), size_t(2 * sampled));
    verify_rows += sampled - int64_t(plan.chunks.size());
    return StepDecision::done;
  }
  int64_t verify_rows = 0;  // beyond one per chunk
};

TEST(SpeculativeEngine, ConfidenceGateJudgesEveryVerifyRow) {
  Fp4TierConfig tier;
  tier.tier.slots = 8;
  tier.tier.promote_per_step = 0;
  tier.tier.kpi_every = 0;
  tier.gate.tau = 1e-30;  // judged, never unsure
  Loaded gated(kSource / "models" / "tiny", false, tier);
  RequestParams request;
  request.prompt = {5, 6, 7, 5, 6, 7, 5, 6, 7, 5, 6};
  request.max_tokens = 16;
  EngineCore engine(*gated.model, std::nullopt,
                    engine_config(2048, 512, false, R"({"method":"ngram","num_speculative_tokens":3})"));
  SampledRows rows;
  engine.runner().add_hook(&rows);
  run(engine, {request});
  EXPECT_GT(rows.verify_rows, 0);
}

}  // namespace
}  // namespace moet
