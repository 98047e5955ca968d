// Tiered expert residency on the CPU backend (the protocol CUDA runs too): the logits of a tiered
// model over a prefill and 200 greedy decode steps are memcmp-equal to the fully resident model's,
// for every store (ram, pack, arena) and for a cold start, a warm pool, a reboot from the pack,
// a pool so small that steps evict (replays every step) and a pool smaller than a step's routed
// set (layer by layer, the prefill in chunks), on models/tiny and the fixtures; the stores serve
// the bytes a resident load uploads; a miss tolerance K replays only steps that missed more than
// K; bad settings and packs give clear errors or a rebuild, never wrong weights.
#include "../cpu_isa_env.h"
#include "../temp_dir.h"
#include "backend/cpu/cpu_backend.h"
#include "core/error.h"
#include "engine/sampler.h"
#include "engine/sequence_batch.h"
#include "experts/expert_kpis.h"
#include "io/checkpoint.h"

#include <gtest/gtest.h>

#include <cstring>
#include <fstream>
#include <map>

namespace moet {
namespace {

const std::filesystem::path kSource = std::filesystem::path(MOET_SOURCE_DIR);

struct Decoded {
  std::vector<std::vector<float>> logits;  // the prefill's last row, then every decode step's
  std::vector<int64_t> passes;             // per step
};

// The prefill of `prompt`, then `steps` greedy decode steps, through a step runner.
Decoded greedy(Model& model, const std::vector<int32_t>& prompt, int64_t steps) {
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

void expect_same(const Decoded& a, const Decoded& b, const std::string& what) {
  ASSERT_EQ(a.logits.size(), b.logits.size()) << what;
  for (size_t i = 0; i < a.logits.size(); ++i)
    ASSERT_EQ(0, std::memcmp(a.logits[i].data(), b.logits[i].data(), a.logits[i].size() * sizeof(float)))
        << what << ": step " << i << " differs";
}

TieringConfig tiering(ExpertStoreKind store, int64_t slots) {
  TieringConfig t;
  t.residency.slots = slots;
  t.residency.kpi_every = 0;
  t.store.kind = store;
  t.store.max_batch = 8;  // several fetches per step
  return t;
}

struct Loaded {
  std::unique_ptr<Backend> backend = cpu_backend_create({2, test_cpu_isa()});
  std::unique_ptr<Model> model;
};

Loaded load(const Checkpoint& checkpoint, const std::filesystem::path& pack_dir,
            std::optional<TieringConfig> config) {
  Loaded l;
  ModelLoadOptions options;
  options.pack_dir = pack_dir;
  options.tiering = std::move(config);
  l.model = model_load(checkpoint, *l.backend, nullptr, options);
  return l;
}

std::vector<int32_t> prompt_for(const Model& model, int64_t n, int64_t salt) {
  std::vector<int32_t> p;
  for (int64_t i = 0; i < n; ++i) p.push_back(int32_t((i * 37 + salt * 101 + 3) % model.config().vocab_size));
  return p;
}

struct Case {
  std::string model;  // a folder under the source tree
  ExpertStoreKind store;
  int64_t steps;
};

class Residency : public ::testing::TestWithParam<Case> {};

// Every scenario of one store on one model against the resident model's logits.
TEST_P(Residency, BitIdenticalToResident) {
  const Case c = GetParam();
  const Checkpoint checkpoint = Checkpoint::open(kSource / c.model);
  TempDir dir;
  Loaded resident = load(checkpoint, {}, std::nullopt);
  const ModelConfig& mc = resident.model->config();
  int64_t moe_layers = 0;
  for (bool moe : mc.layer_is_moe) moe_layers += moe;
  const int64_t total = moe_layers * mc.n_routed_experts, top_k = mc.num_experts_per_tok;
  const std::vector<int32_t> a = prompt_for(*resident.model, 9, 1), b = prompt_for(*resident.model, 6, 2);
  const Decoded want_a = greedy(*resident.model, a, c.steps), want_b = greedy(*resident.model, b, c.steps);
  const std::string name = c.model + "/" + expert_store_name(c.store);

  const int64_t third = std::max(moe_layers * top_k, total / 3);
  {  // cold start (the first boot builds the pack), then a warm pool
    Loaded tiered = load(checkpoint, dir.path(), tiering(c.store, third));
    expect_same(greedy(*tiered.model, a, c.steps), want_a, name + " cold");
    const ExpertKpis cold = tiered.model->experts().residency()->kpis();
    EXPECT_GT(cold.replayed_steps, 0) << name;
    EXPECT_GT(cold.fetched_rows, 0) << name;
    expect_same(greedy(*tiered.model, b, c.steps), want_b, name + " warm");
  }
  {  // reboot: the pack reused (and the arena's saved hot set read back)
    Loaded tiered = load(checkpoint, dir.path(), tiering(c.store, third));
    expect_same(greedy(*tiered.model, a, c.steps), want_a, name + " reboot");
  }
  {  // the smallest pool that holds a decode step whole: steps evict and replay
    Loaded tiered = load(checkpoint, dir.path(), tiering(c.store, moe_layers * top_k));
    const Decoded got = greedy(*tiered.model, a, c.steps);
    expect_same(got, want_a, name + " evicting");
    const ExpertKpis k = tiered.model->experts().residency()->kpis();
    EXPECT_GT(k.replayed_steps, c.steps / 4) << name;
    EXPECT_EQ(k.layerwise_steps, 1) << name << ": only the prefill";
  }
  {  // a pool smaller than a step's routed set: layer by layer, the prefill's layers in chunks
    Loaded tiered = load(checkpoint, dir.path(), tiering(c.store, top_k));
    expect_same(greedy(*tiered.model, a, c.steps), want_a, name + " smaller than a step");
    const ExpertKpis k = tiered.model->experts().residency()->kpis();
    EXPECT_EQ(k.layerwise_steps, c.steps + 1) << name;
    EXPECT_EQ(k.replayed_steps, 0) << name;
  }
}

std::vector<Case> cases() {
  std::vector<Case> out;
  for (ExpertStoreKind store : {ExpertStoreKind::ram, ExpertStoreKind::pack, ExpertStoreKind::arena})
    out.push_back({"models/tiny", store, 200});
  for (const char* fixture : {"qwen3_moe", "deepseek_v3", "glm4_moe", "mixtral"})
    for (ExpertStoreKind store : {ExpertStoreKind::ram, ExpertStoreKind::arena})
      out.push_back({std::string("tests/fixtures/") + fixture, store, 200});
  return out;
}

INSTANTIATE_TEST_SUITE_P(Stores, Residency, ::testing::ValuesIn(cases()), [](const ::testing::TestParamInfo<Case>& info) {
  std::string name = info.param.model.substr(info.param.model.rfind('/') + 1) + "_" + expert_store_name(info.param.store);
  return name;
});

// Each store serves, for every expert, exactly the bytes a resident load uploads.
TEST(ExpertStores, ServeTheResidentBytes) {
  const Checkpoint checkpoint = Checkpoint::open(kSource / "tests/fixtures/qwen3_moe");
  TempDir dir;
  Loaded resident = load(checkpoint, {}, std::nullopt);
  for (ExpertStoreKind store : {ExpertStoreKind::ram, ExpertStoreKind::pack, ExpertStoreKind::arena}) {
    Loaded tiered = load(checkpoint, dir.path(), tiering(store, 8));
    ExpertPool& pool = tiered.model->experts();
    const ExpertStore& s = pool.residency()->store();
    ExpertStore& mutable_store = const_cast<ExpertStore&>(s);
    const int64_t hidden = resident.model->config().hidden_size, inner = resident.model->config().moe_intermediate_size;
    for (int64_t layer = 0; layer < pool.layers(); ++layer) {
      if (!pool.has_layer(layer)) continue;
      EXPECT_FALSE(pool.present(layer, 0)) << "tiered tables start empty";
      for (int64_t e = 0; e < pool.experts_per_layer(); ++e) {
        const ExpertKey key{layer, e};
        const uint8_t* row = mutable_store.fetch({&key, 1})[0];
        const ExpertWeights& w = resident.model->experts().layer(layer).experts[size_t(e)];
        // The W2 row is [codes13 | scales13 | codes2 | scales2], the four planes the resident upload holds.
        size_t offset = 0;
        for (const Tensor* plane : {&w.gate_up, &w.gate_up_scales, &w.down, &w.down_scales}) {
          ASSERT_EQ(0, std::memcmp(row + offset, plane->data, plane->bytes()))
              << expert_store_name(store) << " layer " << layer << " expert " << e;
          offset += plane->bytes();
        }
        EXPECT_EQ(offset, size_t(2 * inner * hidden / 4 + 2 * inner * hidden / 32 + hidden * inner / 4 + hidden * inner / 32));
      }
    }
  }
}

// With a miss tolerance K a step runs again exactly when its first pass missed more than K
// (layer, expert) pairs; a large K never replays.
TEST(ResidencyProtocol, ReplaysOnlyAboveTheTolerance) {
  const Checkpoint checkpoint = Checkpoint::open(kSource / "models/tiny");
  for (const int64_t k : {int64_t(2), int64_t(1000)}) {
    TieringConfig t = tiering(ExpertStoreKind::ram, 16);
    t.residency.miss_tolerance = k;
    Loaded tiered = load(checkpoint, {}, t);
    ExpertResidency& r = *tiered.model->experts().residency();
    SequenceBatch batch(*tiered.model, 1, 80, 4);
    Sequence& seq = batch.sequence(0);
    seq.tokens = prompt_for(*tiered.model, 8, 3);
    std::vector<float> logits = batch.run_rows(0, 0, 8, ChunkRows::last).output.logits;
    int64_t replays = 0, quiet = 0;
    for (int64_t i = 0; i < 60; ++i) {
      seq.tokens.push_back(argmax(logits.data(), tiered.model->config().vocab_size));
      const int64_t misses_before = r.stats().missing_pairs;
      const StepOutcome out = batch.decode(int64_t(seq.tokens.size()) - 1);
      const int64_t first_pass_and_more = r.stats().missing_pairs - misses_before;
      if (out.passes > 1) {
        EXPECT_GT(first_pass_and_more, k) << "step " << i;
        ++replays;
      } else {
        EXPECT_LE(first_pass_and_more, k) << "step " << i;
        quiet += first_pass_and_more > 0;
      }
      logits = out.output.logits;
    }
    if (k == 2) {
      EXPECT_GT(replays, 0);
      EXPECT_GT(quiet, 0) << "some steps missed 1 or 2 pairs and were accepted";
    } else {
      EXPECT_EQ(replays, 0);
    }
  }
}

// A pool below one decode step's largest layer is refused when the runner is made, naming the minimum.
TEST(ResidencyErrors, PoolBelowTheMinimumIsRefused) {
  const Checkpoint checkpoint = Checkpoint::open(kSource / "models/tiny");
  Loaded tiered = load(checkpoint, {}, tiering(ExpertStoreKind::ram, 3));
  try {
    SequenceBatch batch(*tiered.model, 1, 8, 4);
    ADD_FAILURE() << "a 3-slot pool was accepted for top-4 routing";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("at least 4 slots"), std::string::npos) << e.what();
  }
}

// A pack store without a pack directory, or a pack directory that cannot be made, is a clear error.
TEST(ResidencyErrors, PackStoreNeedsAUsablePackDir) {
  const Checkpoint checkpoint = Checkpoint::open(kSource / "tests/fixtures/qwen3_moe");
  EXPECT_THROW(load(checkpoint, {}, tiering(ExpertStoreKind::pack, 8)), Error);
  TempDir dir;
  std::ofstream(dir.path() / "file") << "not a directory";
  try {
    load(checkpoint, dir.path() / "file" / "packs", tiering(ExpertStoreKind::pack, 8));
    ADD_FAILURE() << "a pack dir under a file was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("pack directory"), std::string::npos) << e.what();
  }
}

// A truncated or stale pack is rebuilt before any store reads it: the logits stay the resident ones.
TEST(ResidencyErrors, TruncatedPackIsRebuilt) {
  const Checkpoint checkpoint = Checkpoint::open(kSource / "tests/fixtures/qwen3_moe");
  TempDir dir;
  Loaded resident = load(checkpoint, {}, std::nullopt);
  const std::vector<int32_t> p = prompt_for(*resident.model, 7, 4);
  const Decoded want = greedy(*resident.model, p, 40);
  { Loaded first = load(checkpoint, dir.path(), tiering(ExpertStoreKind::arena, 8)); }
  std::filesystem::path pack;
  for (const auto& entry : std::filesystem::directory_iterator(dir.path()))
    if (entry.path().extension() == ".pack") pack = entry.path();
  ASSERT_FALSE(pack.empty());
  std::filesystem::resize_file(pack, std::filesystem::file_size(pack) / 2);
  Loaded again = load(checkpoint, dir.path(), tiering(ExpertStoreKind::pack, 8));
  expect_same(greedy(*again.model, p, 40), want, "after rebuilding a truncated pack");
}

}  // namespace
}  // namespace moet
