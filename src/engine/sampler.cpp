// Sampler implementation (see sampler.h). Probabilities in double; top-k then top-p truncation
// over tokens sorted by probability (ties by id), then one uniform draw.
#include "engine/sampler.h"

#include "core/error.h"

#include <algorithm>
#include <cmath>
#include <numeric>

namespace moet {

int32_t argmax(const float* values, int64_t n) {
  return int32_t(std::max_element(values, values + n) - values);
}

Sampler::Sampler(const SamplingParams& params) : params_(params), rng_(params.seed) {
  MOET_CHECK(params.temperature >= 0.0f, "temperature must be >= 0 (got {})", params.temperature);
  MOET_CHECK(params.top_p > 0.0f && params.top_p <= 1.0f, "top_p must be in (0, 1] (got {})", params.top_p);
  MOET_CHECK(params.top_k >= 0, "top_k must be >= 0 (got {})", params.top_k);
}

int32_t Sampler::sample(const float* logits, int64_t vocab) {
  if (params_.temperature == 0.0f) return argmax(logits, vocab);
  const double max_logit = *std::max_element(logits, logits + vocab);
  order_.resize(size_t(vocab));
  std::iota(order_.begin(), order_.end(), 0);
  probs_.resize(size_t(vocab));
  for (int64_t i = 0; i < vocab; ++i)
    probs_[size_t(i)] = std::exp((double(logits[i]) - max_logit) / params_.temperature);
  std::sort(order_.begin(), order_.end(), [&](int32_t a, int32_t b) {
    return probs_[size_t(a)] > probs_[size_t(b)] || (probs_[size_t(a)] == probs_[size_t(b)] && a < b);
  });
  size_t keep = params_.top_k > 0 ? std::min<size_t>(size_t(params_.top_k), order_.size()) : order_.size();
  double total = 0.0;
  for (size_t i = 0; i < keep; ++i) total += probs_[size_t(order_[i])];
  if (params_.top_p < 1.0f) {
    double cumulative = 0.0;
    for (size_t i = 0; i < keep; ++i) {
      cumulative += probs_[size_t(order_[i])] / total;
      if (cumulative >= params_.top_p) {
        keep = i + 1;
        break;
      }
    }
    total = 0.0;
    for (size_t i = 0; i < keep; ++i) total += probs_[size_t(order_[i])];
  }
  double draw = std::uniform_real_distribution<double>(0.0, total)(rng_);
  for (size_t i = 0; i < keep; ++i) {
    draw -= probs_[size_t(order_[i])];
    if (draw <= 0.0) return order_[i];
  }
  return order_[keep - 1];
}

}  // namespace moet
