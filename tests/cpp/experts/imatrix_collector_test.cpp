// The importance-matrix collector (experts/imatrix_collector.h) on a fixture run through the
// step runner: its means equal a float64 recomputation from the rows and routing the MoE layers
// saw (x^2 for gate_up's input; SiLU(x gate^T) * (x up^T), squared, for down's), token counts are
// the routings, experts below min_tokens take the layer average, cutting the text into other
// steps gives the same file, and a forward without the observer runs as before. With second
// moments, the matrices' diagonals are the imatrix's vectors, gate_up's matrix is the mean of the
// routed rows' x x^T, and the file holds them as [K, K]; collected for each layer's hottest experts
// only, those are the same bits and the others have none (nor does the file). Layer moments are the per-expert second
// moments' mean weighted by the experts' tokens, the same for any cut into steps.
#include "../cpu_isa_env.h"
#include "backend/cpu/cpu_backend.h"
#include "core/dtype.h"
#include "engine/scorer.h"
#include "experts/imatrix_collector.h"
#include "io/checkpoint.h"
#include "io/safetensors.h"
#include "models/model.h"
#include "../temp_dir.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>

namespace moet {
namespace {

const std::filesystem::path kSource = std::filesystem::path(MOET_SOURCE_DIR);

// Records what the MoE layers saw, then lets the collector see it too.
class Recorder final : public ExpertObserver {
 public:
  explicit Recorder(ImatrixCollector& collector) : collector_(collector) {}
  void observe(Backend& backend, int64_t layer, const Tensor& x, const Tensor& ids, const ExpertSet& set) override {
    std::vector<float> xs(size_t(x.numel()));
    std::vector<int32_t> is(size_t(ids.numel()));
    backend.to_host(x, xs.data());
    backend.to_host(ids, is.data());
    seen[layer].push_back({xs, is, ids.cols()});
    sets[layer] = &set;
    collector_.observe(backend, layer, x, ids, set);
  }
  struct Step {
    std::vector<float> x;
    std::vector<int32_t> ids;
    int64_t top_k;
  };
  std::map<int64_t, std::vector<Step>> seen;
  std::map<int64_t, const ExpertSet*> sets;

 private:
  ImatrixCollector& collector_;
};

float weight(const Tensor& w, int64_t i) {
  return w.dtype == DType::bf16 ? bf16_to_float(w.as<uint16_t>()[i]) : w.as<float>()[i];
}

struct Loaded {
  std::unique_ptr<Backend> backend;
  std::unique_ptr<Model> model;
};

Loaded load(const Checkpoint& checkpoint) {
  Loaded r;
  r.backend = cpu_backend_create({2, test_cpu_isa()});
  ModelLoadOptions options;
  options.experts = ExpertMode::native;
  r.model = model_load(checkpoint, *r.backend, nullptr, options);
  return r;
}

std::vector<int32_t> tokens(const Model& model, int64_t n) {
  std::vector<int32_t> t;
  for (int64_t i = 0; i < n; ++i) t.push_back(int32_t((i * 53 + 7) % model.config().vocab_size));
  return t;
}

// 40 tokens through `model`, seen by `collector` behind a Recorder.
Recorder record(Model& model, ImatrixCollector& collector) {
  Recorder recorder(collector);
  model.experts().set_observer(&recorder);
  score(model, tokens(model, 40), false, 16);
  model.experts().set_observer(nullptr);
  return recorder;
}

}  // namespace

TEST(ImatrixCollector, MeansOfWhatTheLayersSaw) {
  const Checkpoint checkpoint = Checkpoint::open(kSource / "tests/fixtures/qwen3_moe");
  Loaded run = load(checkpoint);
  const ModelConfig& c = run.model->config();
  ImatrixCollector collector(c);
  const Recorder recorder = record(*run.model, collector);
  const Imatrix m = collector.result(1, 40, checkpoint.identity());
  const int64_t H = c.hidden_size, I = c.moe_intermediate_size;
  ASSERT_EQ(m.layers.size(), recorder.seen.size());
  for (const auto& [layer, steps] : recorder.seen) {
    std::vector<std::vector<double>> gu(size_t(c.n_routed_experts), std::vector<double>(size_t(H)));
    std::vector<std::vector<double>> dn(size_t(c.n_routed_experts), std::vector<double>(size_t(I)));
    std::vector<int64_t> count(size_t(c.n_routed_experts));
    int64_t routings = 0;
    for (const auto& step : steps) {
      const int64_t rows = int64_t(step.x.size()) / H;
      routings += rows * step.top_k;
      for (int64_t r = 0; r < rows; ++r) {
        for (int64_t s = 0; s < step.top_k; ++s) {
          const int32_t e = step.ids[size_t(r * step.top_k + s)];
          const ExpertWeights& w = recorder.sets.at(layer)->experts[size_t(e)];
          const float* x = step.x.data() + r * H;
          ++count[size_t(e)];
          for (int64_t k = 0; k < H; ++k) gu[size_t(e)][size_t(k)] += double(x[k]) * x[k];
          for (int64_t j = 0; j < I; ++j) {
            double g = 0, u = 0;
            for (int64_t k = 0; k < H; ++k) {
              g += double(x[k]) * weight(w.gate_up, j * H + k);
              u += double(x[k]) * weight(w.gate_up, (I + j) * H + k);
            }
            const double a = g / (1 + std::exp(-g)) * u;
            dn[size_t(e)][size_t(j)] += a * a;
          }
        }
      }
    }
    int64_t counted = 0;
    for (int64_t e = 0; e < c.n_routed_experts; ++e) {
      counted += m.expert_tokens.at(layer)[size_t(e)];
      EXPECT_EQ(m.expert_tokens.at(layer)[size_t(e)], count[size_t(e)]);
      if (count[size_t(e)] == 0) continue;
      for (int64_t k = 0; k < H; ++k)
        EXPECT_NEAR(m.input(layer, e, false)[k], gu[size_t(e)][size_t(k)] / double(count[size_t(e)]),
                    1e-5 * gu[size_t(e)][size_t(k)] / double(count[size_t(e)]));
      for (int64_t j = 0; j < I; ++j) {
        const double want = dn[size_t(e)][size_t(j)] / double(count[size_t(e)]);
        EXPECT_NEAR(m.input(layer, e, true)[j], want, 2e-3 * want + 1e-9) << layer << "/" << e << "/" << j;
      }
    }
    EXPECT_EQ(counted, routings) << "each (row, expert) routing counted once";
  }
}

TEST(ImatrixCollector, FewTokensTakeTheLayerAverageAndStepsDoNotMatter) {
  const Checkpoint checkpoint = Checkpoint::open(kSource / "tests/fixtures/qwen3_moe");
  Loaded run = load(checkpoint);
  const std::vector<int32_t> text = tokens(*run.model, 30);
  ImatrixCollector one_step(run.model->config(), {}, true), small_steps(run.model->config(), {}, true);
  run.model->experts().set_observer(&one_step);
  score(*run.model, text, false, 512);
  run.model->experts().set_observer(&small_steps);
  score(*run.model, text, false, 4);
  run.model->experts().set_observer(nullptr);
  const Imatrix a = one_step.result(1, 30, ""), b = small_steps.result(1, 30, "");
  const LayerMomentsData la = one_step.layer_moments(30, ""), lb = small_steps.layer_moments(30, "");
  EXPECT_EQ(la.pairs, lb.pairs);
  for (const auto& [layer, matrices] : la.layers) {
    EXPECT_EQ(matrices.gate_up_in, lb.layers.at(layer).gate_up_in);
    EXPECT_EQ(matrices.down_in, lb.layers.at(layer).down_in);
  }
  EXPECT_TRUE(a.layers.begin()->second[0].gate_up_xx.empty()) << "no second moments unless asked";
  for (const auto& [layer, experts] : a.layers)
    for (size_t e = 0; e < experts.size(); ++e) {
      EXPECT_EQ(experts[e].gate_up_in, b.layers.at(layer)[e].gate_up_in);
      EXPECT_EQ(experts[e].down_in, b.layers.at(layer)[e].down_in);
    }
  const Imatrix average = one_step.result(1 << 30, 30, "");  // every expert below min_tokens
  for (const auto& [layer, experts] : average.layers) {
    std::vector<double> sum(experts[0].gate_up_in.size());
    int64_t total = 0;
    for (size_t e = 0; e < experts.size(); ++e) {
      const int64_t n = a.expert_tokens.at(layer)[e];
      total += n;
      for (size_t k = 0; k < sum.size(); ++k) sum[k] += double(a.layers.at(layer)[e].gate_up_in[k]) * double(n);
      EXPECT_EQ(experts[e].gate_up_in, experts[0].gate_up_in);
      EXPECT_EQ(experts[e].down_in, experts[0].down_in);
    }
    for (size_t k = 0; k < sum.size(); ++k)
      EXPECT_NEAR(experts[0].gate_up_in[k], sum[k] / double(total), 1e-5 * sum[k] / double(total));
  }
}

TEST(ImatrixCollector, SecondMomentsExtendTheImatrix) {
  const Checkpoint checkpoint = Checkpoint::open(kSource / "tests/fixtures/qwen3_moe");
  Loaded run = load(checkpoint);
  const ModelConfig& c = run.model->config();
  ImatrixCollector collector(c, {.every = true});
  const Recorder recorder = record(*run.model, collector);
  const Imatrix m = collector.result(1, 40, checkpoint.identity());
  const int64_t H = c.hidden_size, I = c.moe_intermediate_size;
  for (const auto& [layer, steps] : recorder.seen) {
    // float64 sums of x x^T per expert from what the layer saw
    std::vector<std::vector<double>> xx(size_t(c.n_routed_experts), std::vector<double>(size_t(H * H)));
    for (const auto& step : steps)
      for (int64_t r = 0; r < int64_t(step.x.size()) / H; ++r)
        for (int64_t s = 0; s < step.top_k; ++s) {
          const float* x = step.x.data() + r * H;
          std::vector<double>& sum = xx[size_t(step.ids[size_t(r * step.top_k + s)])];
          for (int64_t i = 0; i < H; ++i)
            for (int64_t j = 0; j < H; ++j) sum[size_t(i * H + j)] += double(x[i]) * x[j];
        }
    for (int64_t e = 0; e < c.n_routed_experts; ++e) {
      const ImatrixExpert& x = m.layers.at(layer)[size_t(e)];
      ASSERT_EQ(int64_t(x.gate_up_xx.size()), H * H);
      ASSERT_EQ(int64_t(x.down_xx.size()), I * I);
      const int32_t count = m.expert_tokens.at(layer)[size_t(e)];
      for (int64_t k = 0; k < H; ++k) EXPECT_FLOAT_EQ(x.gate_up_xx[size_t(k * H + k)], x.gate_up_in[size_t(k)]);
      for (int64_t k = 0; k < I; ++k) EXPECT_FLOAT_EQ(x.down_xx[size_t(k * I + k)], x.down_in[size_t(k)]);
      for (int64_t i = 0; i < I; ++i)
        for (int64_t j = 0; j < i; ++j) {
          const float a = x.down_xx[size_t(i * I + j)];
          EXPECT_EQ(a, x.down_xx[size_t(j * I + i)]);
          EXPECT_LE(double(a) * a, 1.00001 * double(x.down_in[size_t(i)]) * x.down_in[size_t(j)]) << "Cauchy-Schwarz";
        }
      if (count == 0) continue;
      for (int64_t k = 0; k < H * H; ++k) {
        const double want = xx[size_t(e)][size_t(k)] / count;
        EXPECT_NEAR(x.gate_up_xx[size_t(k)], want, 1e-5 * std::abs(want) + 1e-9) << layer << "/" << e << "/" << k;
      }
    }
  }
  TempDir dir;
  imatrix_second_moments_write(dir.path() / "m.safetensors", m);
  const auto file = SafetensorsFile::open(dir.path() / "m.safetensors");
  EXPECT_NE(file->header_json().find(kSecondMomentsFormat), std::string::npos);
  for (const HostTensor& t : file->tensors()) {
    if (t.dtype != DType::f32) continue;
    const int64_t k = t.name.ends_with("down_in") ? I : H;
    EXPECT_EQ(t.shape, (std::vector<int64_t>{k, k})) << t.name;
  }
}

TEST(ImatrixCollector, SecondMomentsOfTheHottestExpertsOnly) {
  const Checkpoint checkpoint = Checkpoint::open(kSource / "tests/fixtures/qwen3_moe");
  Loaded run = load(checkpoint);
  const ModelConfig& c = run.model->config();
  ImatrixCollector every(c, {.every = true});
  record(*run.model, every);
  const Imatrix all = every.result(1, 40, "");
  const MomentExperts hottest = hottest_experts(all, 2, 1);
  ImatrixCollector chosen(c, hottest);
  record(*run.model, chosen);
  const Imatrix some = chosen.result(1, 40, "");
  ASSERT_EQ(hottest.chosen.size(), all.expert_tokens.size());
  TempDir dir;
  imatrix_second_moments_write(dir.path() / "m.safetensors", some);
  const auto file = SafetensorsFile::open(dir.path() / "m.safetensors");
  const auto has = [&](const std::string& name) {
    return std::any_of(file->tensors().begin(), file->tensors().end(), [&](const HostTensor& t) { return t.name == name; });
  };
  for (const auto& [layer, counts] : all.expert_tokens) {
    const std::vector<int64_t>& mine = hottest.chosen.at(layer);
    ASSERT_EQ(mine.size(), 2u);
    int32_t coldest_chosen = 1 << 30, hottest_other = 0;
    for (int64_t e = 0; e < int64_t(counts.size()); ++e) {
      const bool is_chosen = std::find(mine.begin(), mine.end(), e) != mine.end();
      if (is_chosen) coldest_chosen = std::min(coldest_chosen, counts[size_t(e)]);
      if (!is_chosen) hottest_other = std::max(hottest_other, counts[size_t(e)]);
      const ImatrixExpert &x = some.layers.at(layer)[size_t(e)], &want = all.layers.at(layer)[size_t(e)];
      EXPECT_EQ(x.gate_up_in, want.gate_up_in);
      EXPECT_EQ(x.gate_up_xx, is_chosen ? want.gate_up_xx : std::vector<float>{}) << layer << "/" << e;
      EXPECT_EQ(x.down_xx, is_chosen ? want.down_xx : std::vector<float>{}) << layer << "/" << e;
      EXPECT_EQ(has(fmt::format("layers.{}.experts.{}.down_in", layer, e)), is_chosen);
    }
    EXPECT_GE(coldest_chosen, hottest_other) << "the hottest are chosen";
    EXPECT_TRUE(has(fmt::format("layers.{}.expert_tokens", layer))) << "every expert's tokens";
  }
}

TEST(ImatrixCollector, LayerMomentsAreTheRoutedPairsMean) {
  const Checkpoint checkpoint = Checkpoint::open(kSource / "tests/fixtures/qwen3_moe");
  Loaded run = load(checkpoint);
  const ModelConfig& c = run.model->config();
  ImatrixCollector collector(c, {.every = true}, true);
  record(*run.model, collector);
  const Imatrix m = collector.result(1, 40, checkpoint.identity());
  const LayerMomentsData layers = collector.layer_moments(40, checkpoint.identity());
  EXPECT_EQ(layers.hidden, c.hidden_size);
  EXPECT_EQ(layers.inner, c.moe_intermediate_size);
  ASSERT_EQ(layers.layers.size(), m.layers.size());
  int64_t pairs = 0;
  for (const auto& [layer, experts] : m.layers) {
    for (const bool down : {false, true}) {
      const int64_t k = down ? c.moe_intermediate_size : c.hidden_size;
      std::vector<double> sum(size_t(k * k));
      int64_t count = 0;
      for (size_t e = 0; e < experts.size(); ++e) {
        const int32_t n = m.expert_tokens.at(layer)[e];
        const std::vector<float>& xx = down ? experts[e].down_xx : experts[e].gate_up_xx;
        for (size_t i = 0; i < sum.size(); ++i) sum[i] += double(n) * xx[i];
        count += n;
      }
      if (!down) pairs += count;
      const std::vector<float>& got = down ? layers.layers.at(layer).down_in : layers.layers.at(layer).gate_up_in;
      ASSERT_EQ(got.size(), sum.size());
      for (size_t i = 0; i < sum.size(); ++i) {
        const double want = sum[i] / double(count);
        EXPECT_NEAR(got[i], want, 1e-5 * std::abs(want) + 1e-9) << layer << "/" << down << "/" << i;
      }
    }
  }
  EXPECT_EQ(layers.pairs, pairs) << "each (row, expert) routing counted once";
}

TEST(ImatrixCollector, RefusesQuantizedExperts) {
  const Checkpoint checkpoint = Checkpoint::open(kSource / "tests/fixtures/qwen3_moe");
  auto backend = cpu_backend_create({1, test_cpu_isa()});
  auto model = model_load(checkpoint, *backend, nullptr, ModelLoadOptions{});  // W2
  ImatrixCollector collector(model->config());
  model->experts().set_observer(&collector);
  EXPECT_THROW(score(*model, tokens(*model, 8), false), Error);
}

}  // namespace moet
