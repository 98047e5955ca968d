// Top-k expert selection (see router.h).
#include "kernels/cpu/router.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

namespace moet {
namespace {

// Indices of the k largest values (descending, ties to the lower index) among `allowed`.
void top_indices(const std::vector<float>& values, int64_t k, std::vector<int32_t>& out) {
  out.resize(values.size());
  std::iota(out.begin(), out.end(), 0);
  std::partial_sort(out.begin(), out.begin() + k, out.end(), [&](int32_t a, int32_t b) {
    return values[size_t(a)] > values[size_t(b)] || (values[size_t(a)] == values[size_t(b)] && a < b);
  });
  out.resize(size_t(k));
}

}  // namespace

float sqrt_softplus(float x) { return std::sqrt(x > 20.0f ? x : std::log1p(std::exp(x))); }

void router_topk(const RouterParams& p, const float* logits, int64_t rows, int32_t* expert_ids,
                 float* weights) {
  const size_t n = size_t(p.experts);
  std::vector<float> scores(n), choice(n), group_scores(size_t(p.groups));
  std::vector<int32_t> chosen, groups_kept, in_group;
  for (int64_t t = 0; t < rows; ++t) {
    const float* row = logits + t * p.experts;
    if (p.sqrtsoftplus) {
      for (size_t e = 0; e < n; ++e) scores[e] = sqrt_softplus(row[e]);
    } else if (p.sigmoid) {
      for (size_t e = 0; e < n; ++e) scores[e] = 1.0f / (1.0f + std::exp(-row[e]));
    } else {
      const float max_logit = *std::max_element(row, row + n);
      float sum = 0.0f;
      for (size_t e = 0; e < n; ++e) sum += (scores[e] = std::exp(row[e] - max_logit));
      for (size_t e = 0; e < n; ++e) scores[e] /= sum;
    }
    for (size_t e = 0; e < n; ++e) choice[e] = scores[e] + (p.correction_bias ? p.correction_bias[e] : 0.0f);
    if (p.groups > 1) {
      const size_t per_group = n / size_t(p.groups);
      std::vector<float> members(per_group);
      for (size_t g = 0; g < size_t(p.groups); ++g) {
        std::copy(choice.begin() + long(g * per_group), choice.begin() + long((g + 1) * per_group), members.begin());
        top_indices(members, std::min<int64_t>(2, int64_t(per_group)), in_group);
        group_scores[g] = 0.0f;
        for (int32_t i : in_group) group_scores[g] += members[size_t(i)];
      }
      top_indices(group_scores, p.top_groups, groups_kept);
      std::vector<bool> keep(size_t(p.groups), false);
      for (int32_t g : groups_kept) keep[size_t(g)] = true;
      for (size_t e = 0; e < n; ++e)
        if (!keep[e / per_group]) choice[e] = -INFINITY;
    }
    top_indices(choice, p.top_k, chosen);
    float total = 0.0f;
    for (int64_t i = 0; i < p.top_k; ++i) total += scores[size_t(chosen[size_t(i)])];
    const float denom = p.sigmoid || p.sqrtsoftplus ? total + 1e-20f : total;
    for (int64_t i = 0; i < p.top_k; ++i) {
      const float w = scores[size_t(chosen[size_t(i)])];
      expert_ids[t * p.top_k + i] = chosen[size_t(i)];
      weights[t * p.top_k + i] = (p.normalize ? w / denom : w) * p.scaling;
    }
  }
}

void router_hash(const RouterParams& p, const float* logits, int64_t rows, const int32_t* tokens, const int32_t* table,
                 int64_t vocab, int32_t* expert_ids, float* weights) {
  for (int64_t t = 0; t < rows; ++t) {
    const float* row = logits + t * p.experts;
    const int32_t token = tokens[t];
    float total = 0.0f;
    for (int64_t i = 0; i < p.top_k; ++i) {
      const int32_t e = token >= 0 && token < vocab ? table[int64_t(token) * p.top_k + i] : -1;
      expert_ids[t * p.top_k + i] = e;
      weights[t * p.top_k + i] = e >= 0 && e < p.experts ? sqrt_softplus(row[e]) : 0.0f;
      total += weights[t * p.top_k + i];
    }
    for (int64_t i = 0; i < p.top_k; ++i) {
      float& w = weights[t * p.top_k + i];
      w = (p.normalize ? w / (total + 1e-20f) : w) * p.scaling;
    }
  }
}

}  // namespace moet
