// ImatrixCollector implementation (see imatrix_collector.h).
#include "experts/imatrix_collector.h"

#include "core/error.h"

#include <algorithm>
#include <cstring>

namespace moet {
namespace {

// Adds x^2 per column of every row (n rows of k) to `squares`.
void add_squares(const float* rows, int64_t n, int64_t k, std::vector<double>& squares) {
  for (int64_t r = 0; r < n; ++r)
    for (int64_t i = 0; i < k; ++i) squares[size_t(i)] += double(rows[r * k + i]) * double(rows[r * k + i]);
}

// Adds weight_r x_r x_r^T (weights null: 1) of the rows in order to the lower triangle of `outer`
// [k, k]; matrix rows in parallel (rows t and k - 1 - t together, for even work), each summed in
// row order. The diagonal with weight 1 takes the same operations as add_squares.
void add_outer(const std::vector<const float*>& rows, const double* weights, int64_t k, std::vector<double>& outer,
               ThreadPool& pool) {
  if (outer.empty() || rows.empty()) return;
  const auto add = [&](int64_t i) {
    double* row = outer.data() + i * k;
    for (size_t r = 0; r < rows.size(); ++r) {
      const float* x = rows[r];
      const double xi = weights ? double(x[i]) * weights[r] : double(x[i]);
      for (int64_t j = 0; j <= i; ++j) row[j] += xi * double(x[j]);
    }
  };
  const int64_t work = k * int64_t(rows.size());
  pool.parallel_for(size_t((k + 1) / 2), [&](size_t begin, size_t end) {
    for (int64_t t = int64_t(begin); t < int64_t(end); ++t) {
      add(t);
      if (k - 1 - t != t) add(k - 1 - t);
    }
  }, size_t(std::max<int64_t>(1, 65536 / work)));
}

// Row pointers of a contiguous [n, k] matrix.
std::vector<const float*> row_pointers(const std::vector<float>& m, int64_t k) {
  std::vector<const float*> rows;
  for (size_t r = 0; r < m.size() / size_t(k); ++r) rows.push_back(m.data() + int64_t(r) * k);
  return rows;
}

// sum += other; an empty `other` adds nothing, an empty `sum` starts at zero.
void add_to(std::vector<double>& sum, const std::vector<double>& other) {
  if (other.empty()) return;
  if (sum.empty()) sum.assign(other.size(), 0.0);
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

bool MomentExperts::contains(int64_t layer, int64_t expert) const {
  if (every) return true;
  const auto it = chosen.find(layer);
  return it != chosen.end() && std::binary_search(it->second.begin(), it->second.end(), expert);
}

MomentExperts hottest_experts(const Imatrix& imatrix, int64_t n, int64_t min_tokens) {
  MomentExperts hottest;
  for (const auto& [layer, layer_counts] : imatrix.expert_tokens) {
    const auto& counts = layer_counts;  // a structured binding cannot be captured before clang 16
    std::vector<int64_t> order(counts.size());
    for (size_t e = 0; e < order.size(); ++e) order[e] = int64_t(e);
    std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return counts[size_t(a)] > counts[size_t(b)]; });
    std::vector<int64_t>& chosen = hottest.chosen[layer];
    for (const int64_t e : order)
      if (int64_t(chosen.size()) < n && counts[size_t(e)] >= std::max<int64_t>(min_tokens, 1)) chosen.push_back(e);
    std::sort(chosen.begin(), chosen.end());
  }
  return hottest;
}

ImatrixCollector::ImatrixCollector(const ModelConfig& config, MomentExperts second_moments, bool layer_moments)
    : hidden_(config.hidden_size),
      inner_(config.moe_intermediate_size),
      experts_(config.n_routed_experts),
      second_moments_(std::move(second_moments)),
      layer_moments_(layer_moments),
      pool_(second_moments_.any() || layer_moments ? 0 : 1) {}

void ImatrixCollector::Sums::add(const Sums& other) {
  add_to(gate_up_in, other.gate_up_in), add_to(down_in, other.down_in);
  add_to(gate_up_xx, other.gate_up_xx), add_to(down_xx, other.down_xx);
  tokens += other.tokens;
}

ImatrixCollector::Sums ImatrixCollector::zero_sums(bool with_moments) const {
  Sums s;
  s.gate_up_in.assign(size_t(hidden_), 0.0), s.down_in.assign(size_t(inner_), 0.0);
  if (with_moments) {
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
  for (int64_t e = int64_t(sums.size()); e < experts_; ++e)
    sums.push_back(zero_sums(second_moments_.contains(layer, e)));
  // Rows per expert, each (row, expert) once, in row order.
  std::vector<std::vector<int64_t>> routed(static_cast<size_t>(experts_));
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t s = 0; s < top_k; ++s) {
      const int32_t e = ids[size_t(r * top_k + s)];
      if (e < 0 || e >= experts_ || (!routed[size_t(e)].empty() && routed[size_t(e)].back() == r)) continue;
      routed[size_t(e)].push_back(r);
    }
  }
  std::vector<std::vector<float>> acts(static_cast<size_t>(experts_));  // per expert: its rows' a [n, inner]
  for (int64_t e = 0; e < experts_; ++e) {
    const std::vector<int64_t>& mine = routed[size_t(e)];
    if (mine.empty()) continue;
    const ExpertWeights& w = set.experts[size_t(e)];
    MOET_CHECK(w.present(), "imatrix: expert {} of layer {} is not in memory", e, layer);
    const int64_t n = int64_t(mine.size());
    std::vector<float> gathered(size_t(n * hidden_));
    std::vector<float>& act = acts[size_t(e)];
    act.resize(size_t(n * inner_));
    for (int64_t i = 0; i < n; ++i)
      std::memcpy(gathered.data() + i * hidden_, xs.data() + mine[size_t(i)] * hidden_,
                  sizeof(float) * size_t(hidden_));
    Tensor g = backend.alloc({n, hidden_}), gate_up = backend.alloc({n, 2 * inner_}), a = backend.alloc({n, inner_});
    backend.from_host(gathered.data(), g);
    backend.matmul(g, w.gate_up, nullptr, gate_up);
    backend.silu_mul(gate_up, a);
    backend.to_host(a, act.data());
    Sums& s = sums[size_t(e)];
    add_squares(gathered.data(), n, hidden_, s.gate_up_in);
    add_squares(act.data(), n, inner_, s.down_in);
    add_outer(row_pointers(gathered, hidden_), nullptr, hidden_, s.gate_up_xx, pool_);
    add_outer(row_pointers(act, inner_), nullptr, inner_, s.down_xx, pool_);
    s.tokens += n;
  }
  if (layer_moments_) add_layer_pairs(layer, xs, ids, top_k, routed, acts);
}

// The layer sums: each row's x x^T weighted by its number of experts, and every pair's a a^T in
// row order (a row's experts in routing order).
void ImatrixCollector::add_layer_pairs(int64_t layer, const std::vector<float>& xs, const std::vector<int32_t>& ids,
                                       int64_t top_k, const std::vector<std::vector<int64_t>>& routed,
                                       const std::vector<std::vector<float>>& acts) {
  LayerSums& sums = layer_sums_[layer];
  if (sums.gate_up_xx.empty()) {
    sums.gate_up_xx.assign(size_t(hidden_ * hidden_), 0.0);
    sums.down_xx.assign(size_t(inner_ * inner_), 0.0);
  }
  const int64_t rows = int64_t(xs.size()) / hidden_;
  std::vector<size_t> next(size_t(experts_), 0);  // each expert's next row in routed / acts
  std::vector<const float*> x_rows, a_rows;
  std::vector<double> counts;
  for (int64_t r = 0; r < rows; ++r) {
    int64_t count = 0;
    for (int64_t s = 0; s < top_k; ++s) {
      const int32_t e = ids[size_t(r * top_k + s)];
      if (e < 0 || e >= experts_) continue;
      size_t& i = next[size_t(e)];
      if (i >= routed[size_t(e)].size() || routed[size_t(e)][i] != r) continue;  // a repeat of this row
      a_rows.push_back(acts[size_t(e)].data() + int64_t(i) * inner_);
      ++i, ++count;
    }
    if (count == 0) continue;
    x_rows.push_back(xs.data() + r * hidden_);
    counts.push_back(double(count));
    sums.pairs += count;
  }
  add_outer(x_rows, counts.data(), hidden_, sums.gate_up_xx, pool_);
  add_outer(a_rows, nullptr, inner_, sums.down_xx, pool_);
}

Imatrix ImatrixCollector::result(int64_t min_tokens, int64_t tokens, const std::string& checkpoint_identity) const {
  MOET_CHECK(!layers_.empty(), "imatrix: no MoE layer ran (no tokens observed)");
  Imatrix m;
  m.checkpoint_identity = checkpoint_identity;
  m.tokens = tokens;
  m.min_tokens = min_tokens;
  for (const auto& [layer, sums] : layers_) {
    Sums total = zero_sums(false);
    std::vector<int32_t>& counts = m.expert_tokens[layer];
    for (const Sums& s : sums) {
      total.add(s);
      counts.push_back(int32_t(s.tokens));
    }
    MOET_CHECK(total.tokens > 0, "imatrix: layer {} saw no routed token", layer);
    std::vector<ImatrixExpert>& experts = m.layers[layer];
    for (const Sums& s : sums) {
      const Sums& from = s.tokens >= min_tokens && s.tokens > 0 ? s : total;
      // Matrices: the chosen experts' only; the layer's average needs every expert's (`total`).
      const Sums& moments = second_moments_.every ? from : s;
      experts.push_back({mean(from.gate_up_in, from.tokens), mean(from.down_in, from.tokens),
                         symmetric_mean(moments.gate_up_xx, hidden_, moments.tokens),
                         symmetric_mean(moments.down_xx, inner_, moments.tokens)});
    }
  }
  return m;
}

LayerMomentsData ImatrixCollector::layer_moments(int64_t tokens, const std::string& checkpoint_identity) const {
  MOET_CHECK(layer_moments_ && !layer_sums_.empty(), "imatrix: no layer moments collected");
  LayerMomentsData m;
  m.hidden = hidden_;
  m.inner = inner_;
  m.tokens = tokens;
  m.checkpoint_identity = checkpoint_identity;
  for (const auto& [layer, sums] : layer_sums_) {
    MOET_CHECK(sums.pairs > 0, "imatrix: layer {} saw no routed token", layer);
    m.layers[layer] = {symmetric_mean(sums.gate_up_xx, hidden_, sums.pairs),
                       symmetric_mean(sums.down_xx, inner_, sums.pairs)};
    m.pairs += sums.pairs;
  }
  return m;
}

}  // namespace moet
