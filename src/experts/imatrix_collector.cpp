// ImatrixCollector implementation (see imatrix_collector.h).
#include "experts/imatrix_collector.h"

#include "core/error.h"

#include <cstring>

namespace moet {
namespace {

// Adds x^2 per column to `squares` and, when `outer` is not empty, x x^T to its lower triangle.
void add_row(const float* x, int64_t k, std::vector<double>& squares, std::vector<double>& outer) {
  for (int64_t i = 0; i < k; ++i) squares[size_t(i)] += double(x[i]) * double(x[i]);
  if (outer.empty()) return;
  for (int64_t i = 0; i < k; ++i) {
    double* row = outer.data() + i * k;
    const double xi = x[i];
    for (int64_t j = 0; j <= i; ++j) row[j] += xi * double(x[j]);
  }
}

void add_to(std::vector<double>& sum, const std::vector<double>& other) {
  for (size_t i = 0; i < sum.size(); ++i) sum[i] += other[i];
}

std::vector<float> mean(const std::vector<double>& sum, int64_t count) {
  std::vector<float> v(sum.size());
  for (size_t k = 0; k < sum.size(); ++k) v[k] = float(sum[k] / double(count));
  return v;
}

// The mean of a lower-triangle sum of outer products as the full symmetric matrix; empty stays empty.
std::vector<float> symmetric_mean(const std::vector<double>& lower, int64_t k, int64_t count) {
  std::vector<float> m = mean(lower, count);
  if (m.empty()) return m;
  for (int64_t i = 0; i < k; ++i)
    for (int64_t j = 0; j < i; ++j) m[size_t(j * k + i)] = m[size_t(i * k + j)];
  return m;
}

}  // namespace

ImatrixCollector::ImatrixCollector(const ModelConfig& config, bool second_moments)
    : hidden_(config.hidden_size),
      inner_(config.moe_intermediate_size),
      experts_(config.n_routed_experts),
      second_moments_(second_moments) {}

void ImatrixCollector::Sums::add(const Sums& other) {
  add_to(gate_up_in, other.gate_up_in), add_to(down_in, other.down_in);
  add_to(gate_up_xx, other.gate_up_xx), add_to(down_xx, other.down_xx);
  tokens += other.tokens;
}

ImatrixCollector::Sums ImatrixCollector::zero_sums() const {
  Sums s;
  s.gate_up_in.assign(size_t(hidden_), 0.0), s.down_in.assign(size_t(inner_), 0.0);
  if (second_moments_) {
    s.gate_up_xx.assign(size_t(hidden_ * hidden_), 0.0);
    s.down_xx.assign(size_t(inner_ * inner_), 0.0);
  }
  return s;
}

void ImatrixCollector::observe(Backend& backend, int64_t layer, const Tensor& x, const Tensor& expert_ids,
                               const ExpertSet& set) {
  MOET_CHECK(set.layout.format == ExpertFormat::dense,
             "the importance matrix is measured on dense experts (--experts native)");
  const int64_t rows = x.rows(), top_k = expert_ids.cols();
  std::vector<float> xs(size_t(rows * hidden_));
  std::vector<int32_t> ids(size_t(rows * top_k));
  backend.to_host(x, xs.data());
  backend.to_host(expert_ids, ids.data());
  std::vector<Sums>& sums = layers_[layer];
  if (sums.empty()) sums.assign(size_t(experts_), zero_sums());
  // Rows per expert, each (row, expert) once, in row order.
  std::vector<std::vector<int64_t>> routed(static_cast<size_t>(experts_));
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t s = 0; s < top_k; ++s) {
      const int32_t e = ids[size_t(r * top_k + s)];
      if (e < 0 || e >= experts_ || (!routed[size_t(e)].empty() && routed[size_t(e)].back() == r)) continue;
      routed[size_t(e)].push_back(r);
    }
  }
  for (int64_t e = 0; e < experts_; ++e) {
    const std::vector<int64_t>& mine = routed[size_t(e)];
    if (mine.empty()) continue;
    const ExpertWeights& w = set.experts[size_t(e)];
    MOET_CHECK(w.present(), "imatrix: expert {} of layer {} is not in memory", e, layer);
    const int64_t n = int64_t(mine.size());
    std::vector<float> gathered(size_t(n * hidden_)), act(size_t(n * inner_));
    for (int64_t i = 0; i < n; ++i)
      std::memcpy(gathered.data() + i * hidden_, xs.data() + mine[size_t(i)] * hidden_,
                  sizeof(float) * size_t(hidden_));
    Tensor g = backend.alloc({n, hidden_}), gate_up = backend.alloc({n, 2 * inner_}), a = backend.alloc({n, inner_});
    backend.from_host(gathered.data(), g);
    backend.matmul(g, w.gate_up, nullptr, gate_up);
    backend.silu_mul(gate_up, a);
    backend.to_host(a, act.data());
    Sums& s = sums[size_t(e)];
    for (int64_t i = 0; i < n; ++i) {
      add_row(gathered.data() + i * hidden_, hidden_, s.gate_up_in, s.gate_up_xx);
      add_row(act.data() + i * inner_, inner_, s.down_in, s.down_xx);
    }
    s.tokens += n;
  }
}

Imatrix ImatrixCollector::result(int64_t min_tokens, int64_t tokens, const std::string& checkpoint_identity) const {
  MOET_CHECK(!layers_.empty(), "imatrix: no MoE layer ran (no tokens observed)");
  Imatrix m;
  m.checkpoint_identity = checkpoint_identity;
  m.tokens = tokens;
  m.min_tokens = min_tokens;
  for (const auto& [layer, sums] : layers_) {
    Sums total = zero_sums();
    std::vector<int32_t>& counts = m.expert_tokens[layer];
    for (const Sums& s : sums) {
      total.add(s);
      counts.push_back(int32_t(s.tokens));
    }
    MOET_CHECK(total.tokens > 0, "imatrix: layer {} saw no routed token", layer);
    std::vector<ImatrixExpert>& experts = m.layers[layer];
    for (const Sums& s : sums) {
      const Sums& from = s.tokens >= min_tokens && s.tokens > 0 ? s : total;
      experts.push_back({mean(from.gate_up_in, from.tokens), mean(from.down_in, from.tokens),
                         symmetric_mean(from.gate_up_xx, hidden_, from.tokens),
                         symmetric_mean(from.down_xx, inner_, from.tokens)});
    }
  }
  return m;
}

}  // namespace moet
