// How many of an expert's items one pass over its weights serves, for the routed-expert kernels
// compiled for a few such sizes (moe_w2.cu: 2, 4 or 8 items; moe.cu's MXFP4 path: 1 to 8). A
// larger pass reads an expert's weights fewer times but does more arithmetic per weight, for
// every pass, whether or not its items fill it; which size is faster depends on how many items
// the active experts get. Host code: the choice depends only on the shapes, so a captured graph
// keeps it.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>

namespace moet::cuda {

struct PassSize {
  int items;    // items one pass serves
  double cost;  // measured time of one pass relative to the other options
};

// Time of an expert's second and later passes relative to its first: the kernels run them right
// after the first, when much of the expert is still in L2. Fitted to the MXFP4 op on Qwen3-235B's
// experts at batch 8 (one row per pass 446 us, two rows 480 us, against 1 : 1.14 at batch 1;
// bench/results/cuda_h200_session6_pairs.txt).
inline constexpr double kRepeatPassCost = 0.3;

// The option with the least expected time for a batch of `rows` whose rows each send an item to
// top_k of `experts` uniformly at random: an expert's item count n is Binomial(rows, top_k /
// experts) and it takes ceil(n / items) passes, the later ones at kRepeatPassCost. Options in
// ascending size; ties go to the smaller. With 32 or more items per expert on average the largest
// option is taken.
template <int N>
int best_pass_items(int64_t rows, int64_t top_k, int64_t experts, const PassSize (&options)[N]) {
  const double p = std::min(1.0, double(top_k) / double(std::max<int64_t>(experts, 1)));
  if (double(rows) * p >= 32) return options[N - 1].items;
  double expected[N] = {};  // per option: E[first pass + kRepeatPassCost * later passes]
  // P(n = 0) = (1 - p)^rows does not underflow: 1 - p >= 1 / experts and rows < 32 / p.
  double pmf = p >= 1 ? 0 : std::pow(1 - p, double(rows));
  for (int64_t n = 0; n <= rows; ++n) {
    const double weight = p >= 1 ? (n == rows ? 1 : 0) : pmf;
    for (int i = 0; i < N; ++i) {
      const int64_t k = (n + options[i].items - 1) / options[i].items;  // passes over an expert of n items
      expected[i] += weight * (k > 0 ? 1.0 + kRepeatPassCost * double(k - 1) : 0.0);
    }
    if (p < 1) pmf *= double(rows - n) / double(n + 1) * p / (1 - p);
  }
  int best = 0;
  for (int i = 1; i < N; ++i)
    if (expected[i] * options[i].cost < expected[best] * options[best].cost) best = i;
  return options[best].items;
}

}  // namespace moet::cuda
