// Sampler implementation (see sampler.h). Probabilities in double; truncation over tokens sorted
// by probability (ties by id), then one uniform draw.
#include "engine/sampler.h"

#include "core/error.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <unordered_map>

namespace moet {

int32_t argmax(const float* values, int64_t n) {
  return int32_t(std::max_element(values, values + n) - values);
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

Sampler::Sampler(const SamplingParams& params) : params_(params), rng_(params.seed) {
  params.validate(INT64_MAX);
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

int32_t Sampler::draw() {
  const int64_t vocab = int64_t(work_.size());
  const double max_logit = *std::max_element(work_.begin(), work_.end());
  order_.resize(size_t(vocab));
  std::iota(order_.begin(), order_.end(), 0);
  probs_.resize(size_t(vocab));
  for (int64_t i = 0; i < vocab; ++i)
    probs_[size_t(i)] = std::exp((double(work_[size_t(i)]) - max_logit) / params_.temperature);
  std::sort(order_.begin(), order_.end(), [&](int32_t a, int32_t b) {
    return probs_[size_t(a)] > probs_[size_t(b)] || (probs_[size_t(a)] == probs_[size_t(b)] && a < b);
  });
  size_t keep = params_.top_k > 0 ? std::min<size_t>(size_t(params_.top_k), order_.size()) : order_.size();
  auto mass = [&](size_t n) {
    double total = 0.0;
    for (size_t i = 0; i < n; ++i) total += probs_[size_t(order_[i])];
    return total;
  };
  double total = mass(keep);
  if (params_.top_p < 1.0f) {
    double cumulative = 0.0;
    for (size_t i = 0; i < keep; ++i) {
      cumulative += probs_[size_t(order_[i])] / total;
      if (cumulative >= params_.top_p) {
        keep = i + 1;
        break;
      }
    }
    total = mass(keep);
  }
  if (params_.min_p > 0.0f) {
    const double threshold = params_.min_p * probs_[size_t(order_[0])];
    while (keep > 1 && probs_[size_t(order_[keep - 1])] < threshold) --keep;
    total = mass(keep);
  }
  double u = std::uniform_real_distribution<double>(0.0, total)(rng_);
  for (size_t i = 0; i < keep; ++i) {
    u -= probs_[size_t(order_[i])];
    if (u <= 0.0) return order_[i];
  }
  return order_[keep - 1];
}

void Sampler::fill_logprobs(const float* logits, int64_t vocab, SampleResult& result) const {
  const double max_logit = *std::max_element(logits, logits + vocab);
  double sum = 0.0;
  for (int64_t i = 0; i < vocab; ++i) sum += std::exp(double(logits[i]) - max_logit);
  const double log_z = max_logit + std::log(sum);
  result.logprob = float(double(logits[result.token]) - log_z);
  if (params_.logprobs <= 0) return;
  std::vector<int32_t> ids(static_cast<size_t>(vocab));
  std::iota(ids.begin(), ids.end(), 0);
  const size_t k = std::min<size_t>(size_t(params_.logprobs), ids.size());
  std::partial_sort(ids.begin(), ids.begin() + ptrdiff_t(k), ids.end(), [&](int32_t a, int32_t b) {
    return logits[a] > logits[b] || (logits[a] == logits[b] && a < b);
  });
  for (size_t i = 0; i < k; ++i) result.top.push_back({ids[i], float(double(logits[ids[i]]) - log_z)});
}

SampleResult Sampler::sample(const float* logits, int64_t vocab, std::span<const int32_t> prompt,
                             std::span<const int32_t> output) {
  work_.assign(logits, logits + vocab);
  for (const auto& [id, bias] : params_.logit_bias)
    if (id >= 0 && id < vocab) work_[size_t(id)] += bias;
  apply_penalties(prompt, output);
  SampleResult result;
  result.token = params_.temperature == 0.0f ? argmax(work_.data(), vocab) : draw();
  if (params_.logprobs >= 0) fill_logprobs(logits, vocab, result);
  return result;
}

}  // namespace moet
