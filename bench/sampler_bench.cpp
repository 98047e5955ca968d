// Host sampling of one token from a Qwen3-size vocabulary (151936 logits), per sampling setting:
// greedy, temperature alone, with top-p, top-k and min-p, and greedy or temperature with the 5
// best logprobs (their normaliser is a sum over the whole vocabulary). Logit shapes: "peaked" (a few
// likely tokens over a long tail, as a trained model's next-token distribution mostly is) and
// "flat" (normal logits of spread 3: the truncations reach deeper into the sorted order), and
// "uniform" (spread 1 at temperature 5: nearly flat, the draw walks half the vocabulary, the
// worst case: about one full sort). The time is per token of one sequence; a decode step of a batch pays it
// once per row. The reference cost is the full sort the sampler did before: a full-sort
// "temperature 0.7" case is printed next to the others (full_sort).
#include "engine/sampler.h"

#include <benchmark/benchmark.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
#include <vector>

namespace {

constexpr int64_t kVocab = 151936;

std::vector<float> logits(bool peaked, float spread = 3.0f) {
  std::mt19937 rng(11);
  std::normal_distribution<float> normal(0.0f, peaked ? 1.5f : spread);
  std::vector<float> v(static_cast<size_t>(kVocab));
  for (float& x : v) x = normal(rng);
  if (peaked)
    for (int i = 0; i < 8; ++i) v[size_t(i * 9973)] = 14.0f - float(i);  // the head
  return v;
}

void sample(benchmark::State& state, bool peaked, float temperature, float top_p, int64_t top_k, float min_p,
            float spread = 3.0f, int64_t logprobs = -1) {
  const std::vector<float> values = logits(peaked, spread);
  moet::SamplingParams params;
  params.temperature = temperature;
  params.top_p = top_p;
  params.top_k = top_k;
  params.min_p = min_p;
  params.logprobs = logprobs;
  params.seed = 3;
  moet::Sampler sampler(params);
  for (auto _ : state) benchmark::DoNotOptimize(sampler.sample(values.data(), kVocab).token);
  state.SetItemsProcessed(state.iterations());
}

// What one temperature draw cost with the whole vocabulary sorted (the sampler before it sorted
// only what it reads): probabilities, a full sort by probability, the mass, one draw.
void full_sort(benchmark::State& state, bool peaked) {
  const std::vector<float> values = logits(peaked);
  std::vector<double> probs(static_cast<size_t>(kVocab));
  std::vector<int32_t> order(static_cast<size_t>(kVocab));
  std::mt19937_64 rng(3);
  for (auto _ : state) {
    const double top = *std::max_element(values.begin(), values.end());
    for (size_t i = 0; i < probs.size(); ++i) probs[i] = std::exp((double(values[i]) - top) / 0.7);
    std::iota(order.begin(), order.end(), 0);
    std::sort(order.begin(), order.end(), [&](int32_t a, int32_t b) {
      return probs[size_t(a)] > probs[size_t(b)] || (probs[size_t(a)] == probs[size_t(b)] && a < b);
    });
    double total = 0.0;
    for (int32_t id : order) total += probs[size_t(id)];
    double u = std::uniform_real_distribution<double>(0.0, total)(rng);
    int32_t token = order.back();
    for (int32_t id : order)
      if ((u -= probs[size_t(id)]) <= 0.0) {
        token = id;
        break;
      }
    benchmark::DoNotOptimize(token);
  }
  state.SetItemsProcessed(state.iterations());
}

}  // namespace

BENCHMARK_CAPTURE(sample, greedy_peaked, true, 0.0f, 1.0f, 0, 0.0f)->Unit(benchmark::kMicrosecond);
BENCHMARK_CAPTURE(sample, t07_peaked, true, 0.7f, 1.0f, 0, 0.0f)->Unit(benchmark::kMicrosecond);
BENCHMARK_CAPTURE(sample, t07_top_p09_peaked, true, 0.7f, 0.9f, 0, 0.0f)->Unit(benchmark::kMicrosecond);
BENCHMARK_CAPTURE(sample, t07_top_k40_peaked, true, 0.7f, 1.0f, 40, 0.0f)->Unit(benchmark::kMicrosecond);
BENCHMARK_CAPTURE(sample, t10_min_p005_peaked, true, 1.0f, 1.0f, 0, 0.05f)->Unit(benchmark::kMicrosecond);
BENCHMARK_CAPTURE(sample, t07_flat, false, 0.7f, 1.0f, 0, 0.0f)->Unit(benchmark::kMicrosecond);
BENCHMARK_CAPTURE(sample, t07_top_p09_flat, false, 0.7f, 0.9f, 0, 0.0f)->Unit(benchmark::kMicrosecond);
BENCHMARK_CAPTURE(sample, t50_uniform, false, 5.0f, 1.0f, 0, 0.0f, 1.0f)->Unit(benchmark::kMicrosecond);
BENCHMARK_CAPTURE(sample, greedy_logprobs5_peaked, true, 0.0f, 1.0f, 0, 0.0f, 3.0f, 5)->Unit(benchmark::kMicrosecond);
BENCHMARK_CAPTURE(sample, t07_logprobs5_peaked, true, 0.7f, 1.0f, 0, 0.0f, 3.0f, 5)->Unit(benchmark::kMicrosecond);
BENCHMARK_CAPTURE(full_sort, t07_peaked, true)->Unit(benchmark::kMicrosecond);
BENCHMARK_CAPTURE(full_sort, t07_flat, false)->Unit(benchmark::kMicrosecond);
BENCHMARK_MAIN();
