// Token sampling from one row of logits. Processing order (as vLLM): logit_bias, then penalties
// (repetition over prompt + output, presence and frequency over the output), then greedy
// (temperature 0) or temperature -> top-k -> top-p -> min-p truncation and one draw from a
// generator seeded per request, so a given seed reproduces the same tokens regardless of which
// other requests share the batch. Logprobs are those of the raw model distribution
// (log_softmax of the unprocessed logits), as vLLM and OpenAI report them.
// With a constraint (structured output), the tokens it does not allow are set to -inf after the
// penalties, and the sampled token is passed to its matcher; such a row needs the whole logits
// (top_width() is 0).
// Only as much of the vocabulary is sorted as the truncation and the draw reach (most of the
// mass sits in a few tokens), and the weights' exponential is vectorised: a temperature draw over
// a 152k vocabulary takes 0.25-0.32 ms on the dev machine, where a full sort took 17
// (bench/sampler_bench.cpp). Tokens are sorted by processed logit in
// the order of kernels/cpu/top_logits.h (ties by id; NaN last), which is also by probability.
// A row that needs only its best logits (top_width() > 0: no logit_bias, penalties or logprobs;
// greedy, or top_k below the vocabulary) can be sampled with sample_top() from the row's
// top_width() best logits as Backend::top_logits writes them: the same token and the same use
// of the generator as sample() on the whole row (the top_k best hold everything temperature,
// top-p and min-p read after top-k, and they are the first top_k of the order sample() sorts).
#pragma once

#include "core/cpu_isa.h"

#include <cstdint>
#include <memory>
#include <random>
#include <span>
#include <unordered_map>
#include <vector>

namespace moet {

// Structured output: which tokens a request may sample next. The engine knows only this interface
// (server/token_mask.h implements it with grammars). A TokenConstraint is shared and immutable to
// its users; start() gives each request its own TokenMatcher. allowed() returns a bitmap over the
// vocabulary (token i allowed when bit i % 64 of word i / 64 is set) valid until the next call;
// accept() advances past the sampled token.
class TokenMatcher {
 public:
  virtual ~TokenMatcher() = default;
  virtual const uint64_t* allowed(int64_t vocab) = 0;
  virtual void accept(int32_t token) = 0;
};

class TokenConstraint {
 public:
  virtual ~TokenConstraint() = default;
  virtual std::unique_ptr<TokenMatcher> start() const = 0;
};

struct SamplingParams {
  float temperature = 0.0f;  // 0 = greedy
  float top_p = 1.0f;
  int64_t top_k = 0;         // 0 = all
  uint64_t seed = 0;
  float min_p = 0.0f;               // drop tokens with p < min_p * p_max
  float repetition_penalty = 1.0f;  // > 1 discourages tokens seen in prompt or output
  float presence_penalty = 0.0f;    // subtracted once per token present in the output
  float frequency_penalty = 0.0f;   // subtracted per occurrence in the output
  std::unordered_map<int32_t, float> logit_bias;
  int64_t logprobs = -1;            // -1: none; else top alternatives to return (0..20)
  // Structured output: tokens outside its mask get -inf before truncation (whole rows only).
  std::shared_ptr<const TokenConstraint> constraint;

  // Throws moet::Error naming the first out-of-range field; vocab checks logit_bias ids.
  void validate(int64_t vocab) const;
};

struct TokenLogprob {
  int32_t id = 0;
  float logprob = 0.0f;
};

struct SampleResult {
  int32_t token = 0;
  float logprob = 0.0f;                // of the chosen token (when logprobs >= 0)
  std::vector<TokenLogprob> top;       // the `logprobs` most likely tokens, best first
};

class Sampler {
 public:
  // `isa`: the code path of the softmax weights (kernels/cpu/softmax_weights.h); the results do
  // not depend on it, only the speed.
  explicit Sampler(const SamplingParams& params, CpuIsa isa = cpu_isa_best());
  // `prompt` and `output` are the request's tokens so far (for the penalties).
  SampleResult sample(const float* logits, int64_t vocab, std::span<const int32_t> prompt = {},
                      std::span<const int32_t> output = {});
  // How many best logits of a row sample_top() needs for these parameters: 1 (greedy), top_k, or
  // 0 when only the whole row will do.
  static int64_t top_width(const SamplingParams& params, int64_t vocab);
  // Samples from a row's n best logits (values, ids), best first in the order of
  // kernels/cpu/top_logits.h; throws moet::Error unless 1 <= top_width() <= n.
  SampleResult sample_top(const float* values, const int32_t* ids, int64_t n, int64_t vocab);

 private:
  void apply_penalties(std::span<const int32_t> prompt, std::span<const int32_t> output);
  // A temperature draw over the pool work_ (processed logits of the tokens ids_, or of tokens
  // 0.. when ids_ is empty) out of a vocabulary of `vocab`; `sorted`: the pool is in order.
  int32_t draw(int64_t vocab, bool sorted);
  // Makes order_[0, n) (at least; n <= pool) the n best pool entries, sorted.
  void sort_prefix(size_t n);
  void fill_logprobs(const float* logits, int64_t vocab, SampleResult& result);
  // Sets the logits of the tokens the constraint does not allow to -inf (work_ holds the row).
  void apply_constraint(int64_t vocab);

  SamplingParams params_;
  CpuIsa isa_;
  std::unique_ptr<TokenMatcher> matcher_;  // from params_.constraint
  std::mt19937_64 rng_;
  std::vector<float> work_;
  std::vector<int32_t> ids_;
  std::vector<int32_t> order_;  // pool entries, best first, sorted up to order_.size()
  uint64_t prefix_floor_ = 0;   // order_ holds the entries whose rank key is at least this
  std::vector<float> probs_;    // the pool's softmax weights (kernels/cpu/softmax_weights.h)
  std::vector<uint64_t> keys_;  // scratch of sort_prefix()
};

// Index of the largest value (the lowest index among equals).
int32_t argmax(const float* values, int64_t n);

}  // namespace moet
