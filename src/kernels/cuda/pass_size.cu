// best_pass_items (pass_size.h): the expected passes of each option under binomial item counts.
#include "kernels/cuda/pass_size.h"

#include <algorithm>
#include <cmath>
#include <vector>

namespace moet::cuda {

namespace {

// Time of an expert's second and later passes relative to its first: the kernels run them right
// after the first, when much of the expert is still in L2. Fitted to the MXFP4 op on Qwen3-235B's
// experts at batch 8 (one row per pass 446 us, two rows 480 us, against 1 : 1.14 at batch 1;
// bench/results/cuda_h200_session6_pairs.txt).
constexpr double kRepeatPassCost = 0.3;

}  // namespace

int best_pass_items(int64_t rows, int64_t top_k, int64_t experts, const PassSize* options, int count) {
  const double p = std::min(1.0, double(top_k) / double(std::max<int64_t>(experts, 1)));
  if (double(rows) * p >= 32) return options[count - 1].items;
  std::vector<double> passes(size_t(count), 0.0);  // E[first pass + kRepeatPassCost * later passes]
  // P(n = 0) = (1 - p)^rows does not underflow: 1 - p >= 1 / experts and rows < 32 / p.
  double pmf = p >= 1 ? 0 : std::pow(1 - p, double(rows));
  for (int64_t n = 0; n <= rows; ++n) {
    const double weight = p >= 1 ? (n == rows ? 1 : 0) : pmf;
    for (int i = 0; i < count; ++i) {
      const int64_t k = (n + options[i].items - 1) / options[i].items;  // passes over an expert of n items
      passes[size_t(i)] += weight * (k > 0 ? 1.0 + kRepeatPassCost * double(k - 1) : 0.0);
    }
    if (p < 1) pmf *= double(rows - n) / double(n + 1) * p / (1 - p);
  }
  int best = 0;
  for (int i = 1; i < count; ++i)
    if (passes[size_t(i)] * options[i].cost < passes[size_t(best)] * options[best].cost) best = i;
  return options[best].items;
}

}  // namespace moet::cuda
