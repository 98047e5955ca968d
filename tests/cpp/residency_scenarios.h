// The tiered-residency scenarios both the CPU suite (tests/cpp/experts) and the CUDA suite run
// (included as "../residency_scenarios.h"): a prefill and greedy decode steps through a step
// runner, compared bit for bit (memcmp) with the fully resident model, for a cold start, a warm
// pool, a reboot from the pack, a pool so small that steps evict (and, missing much, run layer
// by layer), and a pool smaller than one step's routed set (layer by layer, the prefill's layers
// in chunks). A Case may adjust every tiered configuration (the modes past the cache: exclusive
// tiering, host experts, prefetch) and then asserts what that mode must have done.
#pragma once

#include "temp_dir.h"
#include "core/error.h"
#include "engine/sampler.h"
#include "engine/sequence_batch.h"
#include "experts/expert_kpis.h"
#include "experts/expert_loader.h"
#include "experts/expert_store.h"
#include "io/checkpoint.h"

#include <gtest/gtest.h>

#include <cstring>
#include <functional>
#include <optional>
#include <ostream>
#include <string>
#include <vector>

namespace moet::residency_test {

inline const std::filesystem::path kSource = std::filesystem::path(MOET_SOURCE_DIR);

struct Decoded {
  std::vector<std::vector<float>> logits;  // the prefill's last row, then every decode step's
  std::vector<int64_t> passes;             // per step
};

// The prefill of `prompt`, then `steps` greedy decode steps, through a step runner.
inline Decoded greedy(Model& model, const std::vector<int32_t>& prompt, int64_t steps) {
  SequenceBatch batch(model, 1, int64_t(prompt.size()) + steps, 4);
  Sequence& seq = batch.sequence(0);
  seq.tokens = prompt;
  Decoded run;
  StepOutcome out = batch.run_rows(0, 0, int64_t(prompt.size()), ChunkRows::last);
  run.logits.push_back(out.output.logits);
  run.passes.push_back(out.passes);
  const int64_t vocab = model.config().vocab_size;
  for (int64_t i = 0; i < steps; ++i) {
    seq.tokens.push_back(argmax(run.logits.back().data(), vocab));
    out = batch.decode(int64_t(seq.tokens.size()) - 1);
    run.logits.push_back(out.output.logits);
    run.passes.push_back(out.passes);
  }
  return run;
}

inline void expect_same(const Decoded& a, const Decoded& b, const std::string& what) {
  ASSERT_EQ(a.logits.size(), b.logits.size()) << what;
  for (size_t i = 0; i < a.logits.size(); ++i)
    ASSERT_EQ(0, std::memcmp(a.logits[i].data(), b.logits[i].data(), a.logits[i].size() * sizeof(float)))
        << what << ": step " << i << " differs";
}

inline TieringConfig tiering(ExpertStoreKind store, int64_t slots) {
  TieringConfig t;
  t.residency.slots = slots;
  t.residency.kpi_every = 0;
  t.store.kind = store;
  t.store.max_batch = 8;  // several fetches per step
  return t;
}

struct Loaded {
  std::unique_ptr<Backend> backend;
  std::unique_ptr<Model> model;
};

using BackendFactory = std::function<std::unique_ptr<Backend>()>;

inline Loaded load(const BackendFactory& make_backend, const Checkpoint& checkpoint,
                   const std::filesystem::path& pack_dir, std::optional<TieringConfig> config,
                   ExpertMode experts = ExpertMode::w2) {
  Loaded l;
  l.backend = make_backend();
  ModelLoadOptions options;
  options.experts = experts;
  options.pack_dir = pack_dir;
  options.tiering = std::move(config);
  l.model = model_load(checkpoint, *l.backend, nullptr, options);
  return l;
}

inline std::vector<int32_t> prompt_for(const Model& model, int64_t n, int64_t salt) {
  std::vector<int32_t> p;
  for (int64_t i = 0; i < n; ++i) p.push_back(int32_t((i * 37 + salt * 101 + 3) % model.config().vocab_size));
  return p;
}

struct Case {
  std::string model;  // a folder under the source tree
  ExpertStoreKind store;
  int64_t steps;
  std::string mode = "";                          // names the adjustment (test names)
  std::function<void(TieringConfig&)> adjust = {};  // applied to every tiered configuration
  ExpertMode experts = ExpertMode::w2;            // the stored format (w2 or w2k: rows of the same size)
};

// How gtest names a Case in its output (instead of a dump of its bytes).
inline void PrintTo(const Case& c, std::ostream* os) {
  *os << c.model << " " << expert_store_name(c.store) << " " << expert_mode_name(c.experts) << " " << c.steps
      << " steps" << (c.mode.empty() ? "" : " " + c.mode);
}

// What the mode of `t` must have done in a run whose KPIs are `k`, when the pool was too small to
// hold every expert (`evicting`: steps evicted).
inline void expect_mode_did_its_work(const TieringConfig& t, const ExpertKpis& k, bool evicting,
                                     const std::string& what) {
  if (t.residency.tiering == ExpertTiering::exclusive && evicting) {
    EXPECT_GT(k.written_back_rows, 0) << what << ": exclusive evictions write their rows back";
  }
  if (t.residency.cpu_experts != CpuExperts::off) {
    EXPECT_GT(k.host_pairs + k.chose_fetch, 0) << what << ": misses were served by the host or chosen for a fetch";
  }
  if (t.residency.prefetch == ExpertPrefetch::next_layer) {
    EXPECT_GE(k.prefetch_hit_rate, 0.0) << what;
  }
}

// Every scenario of one store on one model against the resident model's logits, on the backends
// make_backend() makes.
inline void check_residency_scenarios(const BackendFactory& make_backend, const Case& c) {
  const Checkpoint checkpoint = Checkpoint::open(kSource / c.model);
  TempDir dir;
  // W2K quantizes ~100x slower than W2: its resident model builds the pack the tiered loads read,
  // so the case quantizes once (W2's resident model quantizes at load, checking the pack's bytes).
  Loaded resident = load(make_backend, checkpoint, c.experts == ExpertMode::w2k ? dir.path() : std::filesystem::path(),
                         std::nullopt, c.experts);
  const ModelConfig& mc = resident.model->config();
  int64_t moe_layers = 0;
  for (bool moe : mc.layer_is_moe) moe_layers += moe;
  const int64_t total = moe_layers * mc.n_routed_experts, top_k = mc.num_experts_per_tok;
  const std::vector<int32_t> a = prompt_for(*resident.model, 9, 1), b = prompt_for(*resident.model, 6, 2);
  const Decoded want_a = greedy(*resident.model, a, c.steps), want_b = greedy(*resident.model, b, c.steps);
  const std::string name = c.model + "/" + expert_store_name(c.store) + "/" + expert_mode_name(c.experts) +
                           (c.mode.empty() ? "" : "/" + c.mode);
  const auto config = [&](int64_t slots) {
    TieringConfig t = tiering(c.store, slots);
    if (c.adjust) c.adjust(t);
    return t;
  };
  // The expert cache's own protocol (fetch and replay) is what a plain case checks for.
  const bool fetches = !c.adjust || config(1).residency.cpu_experts == CpuExperts::off;
  const bool graphs = !c.adjust || config(1).residency.prefetch == ExpertPrefetch::off;

  const int64_t third = std::max(moe_layers * top_k, total / 3);
  {  // cold start (the first boot builds the pack), then a warm pool
    Loaded tiered = load(make_backend, checkpoint, dir.path(), config(third), c.experts);
    expect_same(greedy(*tiered.model, a, c.steps), want_a, name + " cold");
    const ExpertKpis cold = tiered.model->experts().residency()->kpis();
    if (fetches && graphs) {
      EXPECT_GT(cold.replayed_steps, 0) << name;
    }
    if (fetches) {
      EXPECT_GT(cold.fetched_rows, 0) << name;
    }
    expect_mode_did_its_work(config(third), cold, false, name + " cold");
    expect_same(greedy(*tiered.model, b, c.steps), want_b, name + " warm");
  }
  {  // reboot: the pack reused (and the arena's saved hot set read back)
    Loaded tiered = load(make_backend, checkpoint, dir.path(), config(third), c.experts);
    expect_same(greedy(*tiered.model, a, c.steps), want_a, name + " reboot");
  }
  {  // the smallest pool that holds a decode step whole: steps evict and replay
    Loaded tiered = load(make_backend, checkpoint, dir.path(), config(moe_layers * top_k), c.experts);
    const Decoded got = greedy(*tiered.model, a, c.steps);
    expect_same(got, want_a, name + " evicting");
    const ExpertKpis k = tiered.model->experts().residency()->kpis();
    if (fetches && graphs) {
      EXPECT_GT(k.replayed_steps, 0) << name;
    }
    if (fetches) {
      EXPECT_GT(k.fetched_rows, c.steps) << name << ": the steps evict";
    }
    expect_mode_did_its_work(config(moe_layers * top_k), k, fetches, name + " evicting");
  }
  {  // a pool smaller than a step's routed set: layer by layer, the prefill's layers in chunks
    Loaded tiered = load(make_backend, checkpoint, dir.path(), config(top_k), c.experts);
    expect_same(greedy(*tiered.model, a, c.steps), want_a, name + " smaller than a step");
    const ExpertKpis k = tiered.model->experts().residency()->kpis();
    if (fetches) {
      EXPECT_EQ(k.layerwise_steps, c.steps + 1) << name;
    }
    EXPECT_EQ(k.replayed_steps, 0) << name;
    expect_mode_did_its_work(config(top_k), k, fetches, name + " smaller than a step");
  }
}

}  // namespace moet::residency_test
