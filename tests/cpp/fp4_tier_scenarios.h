// The FP4 tier's and the confidence gate's scenarios both the CPU suite (tests/cpp/experts) and the
// CUDA suite run (included as "../fp4_tier_scenarios.h"), on models/tiny (3 MoE layers of 16
// experts, top-4), every comparison memcmp over a prefill and greedy decode steps:
//   - tau = 1 with a pool that can hold every expert: each step's last pass runs only FP4
//     experts, so the logits are the all-FP4 model's (--experts fp4), over a resident W2 base and
//     over the expert cache (FP4 slot > W2 slot > miss), and with only the best logits returned;
//   - tau = 0 and no manager: the W2 model's;
//   - a tier of the base's own W2 rows, a pool smaller than a step's routed set, the manager and a
//     gate that fires on every step: promotions, evictions and replays happen and change nothing;
//   - the expert cache (replays, or layer by layer with chunked prefill layers) under an FP4 tier
//     with the manager and the gate: the logits of resident W2 experts under the same tier.
#pragma once

#include "residency_scenarios.h"
#include "experts/fp4_kpis.h"

#include <map>

namespace moet::fp4_tier_test {

using namespace residency_test;

constexpr int64_t kSteps = 40;

inline Fp4TierConfig tier_config(int64_t slots, int64_t promote, double tau, int64_t rounds = 8,
                                 int64_t budget = 1000) {
  Fp4TierConfig c;
  c.tier.slots = slots;
  c.tier.promote_per_step = promote;
  c.tier.kpi_every = 0;
  c.gate.tau = tau;
  c.gate.rounds = rounds;
  c.gate.budget = budget;
  return c;
}

inline Loaded load_model(const BackendFactory& make_backend, const Checkpoint& checkpoint, ExpertMode mode,
                         std::optional<Fp4TierConfig> tier, std::optional<TieringConfig> tiering = std::nullopt) {
  Loaded l;
  l.backend = make_backend();
  ModelLoadOptions options;
  options.experts = mode;
  options.fp4_tier = std::move(tier);
  options.tiering = std::move(tiering);
  l.model = model_load(checkpoint, *l.backend, nullptr, options);
  return l;
}

struct Tiny {
  Checkpoint checkpoint = Checkpoint::open(kSource / "models/tiny");
  std::vector<int32_t> prompt = {3, 140, 277, 414, 551, 688, 825, 962, 1099};
  int64_t total = 48;  // routed experts of the model
};

inline Tiny& tiny() {
  static Tiny t;
  return t;
}

// The model with every expert stored as `mode`, no tier: its greedy run (once per backend kind).
inline const Decoded& reference(const BackendFactory& make_backend, const std::string& backend, ExpertMode mode) {
  static std::map<std::pair<std::string, ExpertMode>, Decoded> runs;
  auto it = runs.find({backend, mode});
  if (it == runs.end()) {
    Loaded l = load_model(make_backend, tiny().checkpoint, mode, std::nullopt);
    it = runs.emplace(std::make_pair(backend, mode), greedy(*l.model, tiny().prompt, kSteps)).first;
  }
  return it->second;
}

inline Fp4TierStats tier_stats(Loaded& l) { return l.model->experts().fp4_tier()->stats(); }

inline void check_tau_one_gives_the_fp4_model(const BackendFactory& make_backend, const std::string& backend) {
  const Decoded& fp4 = reference(make_backend, backend, ExpertMode::fp4);
  const Decoded& w2 = reference(make_backend, backend, ExpertMode::w2);
  ASSERT_NE(0, std::memcmp(fp4.logits.back().data(), w2.logits.back().data(), fp4.logits.back().size() * sizeof(float)))
      << "the two formats must differ for this test to mean anything";
  for (const bool cached : {false, true}) {
    std::optional<TieringConfig> cache;
    if (cached) cache = tiering(ExpertStoreKind::ram, 12);  // the smallest W2 cache for one decode step
    Loaded l = load_model(make_backend, tiny().checkpoint, ExpertMode::w2, tier_config(tiny().total, 0, 1.0), cache);
    expect_same(greedy(*l.model, tiny().prompt, kSteps), fp4, cached ? "over the W2 cache" : "over resident W2");
    const Fp4TierStats s = tier_stats(l);
    EXPECT_EQ(s.judged_steps, kSteps + 1);
    EXPECT_EQ(s.gated_steps, kSteps + 1);
    EXPECT_GT(s.gate_passes, 0);
    EXPECT_EQ(s.fp4_items, s.routed_items) << "every routing of the passes that stood was served at FP4";
  }
}

// Steps that return only their best logits are judged from the whole rows: the same tokens and
// best values as the all-FP4 model's.
inline void check_top_logits_steps_are_judged(const BackendFactory& make_backend) {
  const auto run = [](Model& model, std::vector<float>& values) {
    SequenceBatch batch(model, 1, int64_t(tiny().prompt.size()) + 20, 4);
    Sequence& seq = batch.sequence(0);
    seq.tokens = tiny().prompt;
    StepOutcome out = batch.run_rows(0, 0, int64_t(seq.tokens.size()), ChunkRows::last, 8);
    for (int i = 0; i < 20; ++i) {
      values.insert(values.end(), out.output.top.values.begin(), out.output.top.values.end());
      seq.tokens.push_back(out.output.top.ids[0]);
      out = batch.decode(int64_t(seq.tokens.size()) - 1, 8);
    }
    return seq.tokens;
  };
  Loaded fp4 = load_model(make_backend, tiny().checkpoint, ExpertMode::fp4, std::nullopt);
  Loaded gated = load_model(make_backend, tiny().checkpoint, ExpertMode::w2, tier_config(tiny().total, 0, 1.0));
  std::vector<float> want, got;
  EXPECT_EQ(run(*fp4.model, want), run(*gated.model, got));
  ASSERT_EQ(want.size(), got.size());
  EXPECT_EQ(0, std::memcmp(want.data(), got.data(), want.size() * sizeof(float)));
  EXPECT_EQ(tier_stats(gated).gated_steps, 21);
}

inline void check_tau_zero_gives_the_w2_model(const BackendFactory& make_backend, const std::string& backend) {
  Loaded l = load_model(make_backend, tiny().checkpoint, ExpertMode::w2, tier_config(8, 0, 0.0));
  expect_same(greedy(*l.model, tiny().prompt, kSteps), reference(make_backend, backend, ExpertMode::w2), "tau 0");
  const Fp4TierStats s = tier_stats(l);
  EXPECT_EQ(s.held, 0);
  EXPECT_EQ(s.judged_steps, 0);
}

// A tier holding the base's own rows: whatever moves in and out, nothing changes, bit for bit
// (the manager and the gate at work with a pool smaller than a step's routed set, over resident W2
// and over the cache).
inline void check_base_row_tier_changes_nothing(const BackendFactory& make_backend, const std::string& backend) {
  for (const bool cached : {false, true}) {
    std::optional<TieringConfig> cache;
    if (cached) cache = tiering(ExpertStoreKind::ram, 12);
    Fp4TierConfig c = tier_config(8, 2, 1.0, 2, 2);  // 8 slots for 12 routed experts a step
    c.format = ExpertFormat::w2;
    Loaded l = load_model(make_backend, tiny().checkpoint, ExpertMode::w2, c, cache);
    expect_same(greedy(*l.model, tiny().prompt, kSteps), reference(make_backend, backend, ExpertMode::w2),
                cached ? "cached" : "resident");
    const Fp4TierStats s = tier_stats(l);
    EXPECT_GT(s.promotions, 0);
    EXPECT_GT(s.forced_promotions, 0);
    EXPECT_GT(s.evictions + s.forced_evictions, 0);
    EXPECT_GT(s.gate_passes, 0);
  }
}

// The expert cache under a tier with the manager and the gate at work changes nothing either: the
// FP4 tier's experts resolve before the cache's slots, whether steps replay after fetching (a
// cache of one step's experts) or run layer by layer with the prefill's layers in chunks and the
// tier's experts after them (a cache of top_k slots; a second prompt, prefilled with the tier
// filled): the logits are those over resident W2 experts with the same tier. `promote`: the
// manager's promotions per step (0 on CUDA, whose manager's copies land when they are done).
inline void check_expert_cache_under_the_tier(const BackendFactory& make_backend, int64_t promote) {
  const Fp4TierConfig c = tier_config(8, promote, 0.5, 1, 64);
  const std::vector<int32_t> second = {7, 77, 777, 7777, 70, 700, 7000, 17, 170, 1700, 71};
  const auto two_prompts = [&](Model& model) {
    Decoded run = greedy(model, tiny().prompt, kSteps);
    const Decoded more = greedy(model, second, 8);
    run.logits.insert(run.logits.end(), more.logits.begin(), more.logits.end());
    return run;
  };
  Loaded resident = load_model(make_backend, tiny().checkpoint, ExpertMode::w2, c);
  const Decoded want = two_prompts(*resident.model);
  const Fp4TierStats s = tier_stats(resident);
  EXPECT_EQ(s.promotions > 0, promote > 0);
  EXPECT_GT(s.gate_passes, 0);
  EXPECT_GT(s.gated_steps, 0);
  for (const int64_t slots : {int64_t(12), int64_t(4)}) {
    Loaded cached =
        load_model(make_backend, tiny().checkpoint, ExpertMode::w2, c, tiering(ExpertStoreKind::ram, slots));
    expect_same(two_prompts(*cached.model), want, "a W2 cache of " + std::to_string(slots));
    const ExpertKpis k = cached.model->experts().residency()->kpis();
    EXPECT_GT(k.fetched_rows, 0);
    if (slots == 4) {
      EXPECT_EQ(k.layerwise_steps, kSteps + 1 + 9);
    }
    EXPECT_EQ(tier_stats(cached).forced_promotions, s.forced_promotions);
    EXPECT_EQ(tier_stats(cached).promotions, s.promotions);
  }
}

}  // namespace moet::fp4_tier_test
