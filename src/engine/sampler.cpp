// Sampler implementation (see sampler.h). Weights e^((logit - max) / T) in float
// (kernels/cpu/softmax_weights.h), sums of them in double; truncation over the pool (the whole
// row, or sample_top()'s best logits) sorted by rank key (kernels/cpu/top_logits.h: by processed
// logit, ties by id, so by probability too), then one uniform draw. The sorted order is built as
// far as it is read: the k best entries (append_best_keys), sorted; k grows fourfold when more
// is needed, the new entries sorted after the old, and from a quarter of the pool on all the rest
// at once (a nearly flat distribution costs about one full sort). The whole vocabulary's mass
// (the top-p normaliser without top-k) is the weights' sum as softmax_weights() takes it.
#include "engine/sampler.h"

#include "core/error.h"
#include "kernels/cpu/softmax_weights.h"
#include "kernels/cpu/top_logits.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <unordered_map>

namespace moet {

namespace {

// The largest value (NaNs skipped; -inf when there is none), eight independent lanes so that the
// compiler can keep them in vector registers.
float max_value(const float* values, int64_t n) {
  constexpr int kLanes = 8;
  float lane[kLanes];
  std::fill(lane, lane + kLanes, -INFINITY);
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes)
    for (int j = 0; j < kLanes; ++j) lane[j] = values[i + j] > lane[j] ? values[i + j] : lane[j];
  float best = -INFINITY;
  for (int j = 0; j < kLanes; ++j) best = lane[j] > best ? lane[j] : best;
  for (; i < n; ++i) best = values[i] > best ? values[i] : best;
  return best;
}

// Nothing changes the logits before truncation.
bool raw_logits(const SamplingParams& p) {
  return p.logit_bias.empty() && p.repetition_penalty == 1.0f && p.presence_penalty == 0.0f &&
         p.frequency_penalty == 0.0f;
}

}  // namespace

int32_t argmax(const float* values, int64_t n) {
  const float best = max_value(values, n);
  for (int64_t i = 0; i < n; ++i)
    if (values[i] == best) return int32_t(i);
  return 0;
}

void SamplingParams::validate(int64_t vocab) const {
  MOET_CHECK(std::isfinite(temperature) && temperature >= 0.0f, "temperature must be >= 0 (got {})", temperature);
  MOET_CHECK(top_p > 0.0f && top_p <= 1.0f, "top_p must be in (0, 1] (got {})", top_p);
  MOET_CHECK(top_k >= 0, "top_k must be >= 0 (got {})", top_k);
  MOET_CHECK(min_p >= 0.0f && min_p <= 1.0f, "min_p must be in [0, 1] (got {})", min_p);
  MOET_CHECK(repetition_penalty > 0.0f, "repetition_penalty must be > 0 (got {})", repetition_penalty);
  MOET_CHECK(presence_penalty >= -2.0f && presence_penalty <= 2.0f, "presence_penalty must be in [-2, 2] (got {})",
             presence_penalty);
  MOET_CHECK(frequency_penalty >= -2.0f && frequency_penalty <= 2.0f,
             "frequency_penalty must be in [-2, 2] (got {})", frequency_penalty);
  MOET_CHECK(logprobs <= 20, "logprobs must be at most 20 (got {})", logprobs);
  for (const auto& [id, bias] : logit_bias) {
    MOET_CHECK(id >= 0 && id < vocab, "logit_bias token id {} is outside the vocabulary [0, {})", id, vocab);
    MOET_CHECK(bias >= -100.0f && bias <= 100.0f, "logit_bias value for token {} must be in [-100, 100] (got {})",
               id, bias);
  }
}

Sampler::Sampler(const SamplingParams& params, CpuIsa isa) : params_(params), isa_(isa), rng_(params.seed) {
  params.validate(INT64_MAX);
  if (params_.constraint) matcher_ = params_.constraint->start();
}

void Sampler::apply_constraint(int64_t vocab) {
  const uint64_t* allowed = matcher_->allowed(vocab);
  bool any = false;
  for (int64_t i = 0; i < vocab; ++i) {
    if ((allowed[i >> 6] >> (i & 63)) & 1) any = true;
    else work_[size_t(i)] = -INFINITY;
  }
  MOET_CHECK(any, "structured output: no token can continue the constrained text");
}

void Sampler::apply_penalties(std::span<const int32_t> prompt, std::span<const int32_t> output) {
  const int64_t vocab = int64_t(work_.size());
  auto in_vocab = [&](int32_t id) { return id >= 0 && id < vocab; };
  if (params_.repetition_penalty != 1.0f) {
    std::vector<bool> seen(size_t(vocab), false);
    for (auto ids : {prompt, output})
      for (int32_t id : ids)
        if (in_vocab(id)) seen[size_t(id)] = true;
    for (int64_t i = 0; i < vocab; ++i) {
      if (!seen[size_t(i)]) continue;
      float& v = work_[size_t(i)];
      v = v > 0.0f ? v / params_.repetition_penalty : v * params_.repetition_penalty;
    }
  }
  if (params_.presence_penalty != 0.0f || params_.frequency_penalty != 0.0f) {
    std::unordered_map<int32_t, int64_t> counts;
    for (int32_t id : output)
      if (in_vocab(id)) ++counts[id];
    for (const auto& [id, count] : counts)
      work_[size_t(id)] -= params_.presence_penalty + params_.frequency_penalty * float(count);
  }
}

void Sampler::sort_prefix(size_t n) {
  if (n <= order_.size()) return;
  // Only a row's pool is sorted here (sample_top()'s arrives sorted), so a key's id is its index.
  // order_ holds every entry with a rank key >= prefix_floor_, sorted; the next ones are below it.
  const size_t pool = work_.size(), want = std::max({n, 4 * order_.size(), size_t(256)});
  const int64_t k = 4 * want < pool ? int64_t(want) : int64_t(pool);  // a quarter or more: all the rest
  keys_.clear();
  prefix_floor_ = append_best_keys(work_.data(), int64_t(pool), k, prefix_floor_, keys_);
  for (uint64_t key : keys_) order_.push_back(int32_t(~uint32_t(key)));
}

int32_t Sampler::draw(int64_t vocab, bool sorted) {
  const size_t pool = work_.size();
  const float max_logit = max_value(work_.data(), int64_t(pool));
  probs_.resize(pool);
  const double pool_mass = softmax_weights(work_.data(), int64_t(pool), max_logit, 1.0f / params_.temperature,
                                           probs_.data(), isa_);
  order_.resize(sorted ? pool : 0);
  std::iota(order_.begin(), order_.end(), 0);
  prefix_floor_ = sorted ? 0 : UINT64_MAX;
  const auto prob = [&](size_t rank) {
    sort_prefix(rank + 1);
    return probs_[size_t(order_[rank])];
  };
  auto mass = [&](size_t n) {
    double total = 0.0;
    for (size_t i = 0; i < n; ++i) total += prob(i);
    return total;
  };
  // keep == vocab only where the pool is the whole vocabulary (sample_top() has top_k < vocab).
  size_t keep = params_.top_k > 0 ? std::min<size_t>(size_t(params_.top_k), size_t(vocab)) : size_t(vocab);
  double total = keep == size_t(vocab) ? pool_mass : mass(keep);
  if (params_.top_p < 1.0f) {
    double cumulative = 0.0;
    for (size_t i = 0; i < keep; ++i) {
      cumulative += prob(i) / total;
      if (cumulative >= params_.top_p) {
        keep = i + 1;
        break;
      }
    }
    total = mass(keep);
  }
  if (params_.min_p > 0.0f) {  // sorted, so the kept tokens are those at or above the threshold
    // Counted over the pool: where it is the best top_k only, the count is min(top_k, the count
    // over the row), as probability does not fall with rank, and keep <= top_k.
    const double threshold = params_.min_p * prob(0);
    const size_t above = size_t(count_at_least(probs_.data(), int64_t(probs_.size()), threshold));
    keep = std::max<size_t>(1, std::min(keep, above));
    total = mass(keep);
  }
  const auto token = [&](size_t rank) { return ids_.empty() ? order_[rank] : ids_[size_t(order_[rank])]; };
  double u = std::uniform_real_distribution<double>(0.0, total)(rng_);
  for (size_t i = 0; i < keep; ++i) {
    u -= prob(i);
    if (u <= 0.0) return token(i);
  }
  return token(keep - 1);
}

void Sampler::fill_logprobs(const float* logits, int64_t vocab, SampleResult& result) {
  const float max_logit = max_value(logits, vocab);
  probs_.resize(size_t(vocab));
  const double log_z = double(max_logit) + std::log(softmax_weights(logits, vocab, max_logit, 1.0f, probs_.data(), isa_));
  result.logprob = float(double(logits[result.token]) - log_z);
  if (params_.logprobs <= 0) return;
  const int64_t k = std::min(params_.logprobs, vocab);
  std::vector<float> values(static_cast<size_t>(k));
  std::vector<int32_t> ids(static_cast<size_t>(k));
  top_logits(logits, 1, vocab, k, values.data(), ids.data());
  for (int64_t i = 0; i < k; ++i) result.top.push_back({ids[size_t(i)], float(double(values[size_t(i)]) - log_z)});
}

SampleResult Sampler::sample(const float* logits, int64_t vocab, std::span<const int32_t> prompt,
                             std::span<const int32_t> output) {
  SampleResult result;
  if (raw_logits(params_) && params_.temperature == 0.0f && !matcher_) {
    result.token = argmax(logits, vocab);  // nothing to apply: no copy
  } else {
    work_.assign(logits, logits + vocab);
    ids_.clear();
    for (const auto& [id, bias] : params_.logit_bias)
      if (id >= 0 && id < vocab) work_[size_t(id)] += bias;
    apply_penalties(prompt, output);
    if (matcher_) apply_constraint(vocab);
    result.token = params_.temperature == 0.0f ? argmax(work_.data(), vocab) : draw(vocab, false);
  }
  if (matcher_) matcher_->accept(result.token);
  if (params_.logprobs >= 0) fill_logprobs(logits, vocab, result);
  return result;
}

int64_t Sampler::top_width(const SamplingParams& params, int64_t vocab) {
  if (!raw_logits(params) || params.logprobs >= 0 || params.constraint) return 0;
  if (params.temperature == 0.0f) return 1;
  return params.top_k >= 1 && params.top_k < vocab ? params.top_k : 0;
}

SampleResult Sampler::sample_top(const float* values, const int32_t* ids, int64_t n, int64_t vocab) {
  const int64_t width = top_width(params_, vocab);
  MOET_CHECK(width >= 1 && width <= n,
             "sample_top: these sampling parameters need the {} best logits of the row (0: all of it), {} given",
             width, n);
  SampleResult result;
  if (params_.temperature == 0.0f) {
    result.token = ids[0];  // argmax() of the row
    return result;
  }
  work_.assign(values, values + width);
  ids_.assign(ids, ids + width);
  result.token = draw(vocab, true);
  return result;
}

}  // namespace moet
