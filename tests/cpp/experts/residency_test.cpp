// Tiered expert residency on the CPU backend (the protocol CUDA runs too): the logits of a tiered
// model over a prefill and 200 greedy decode steps are memcmp-equal to the fully resident model's,
// for every store (ram, pack, arena) and for a cold start, a warm pool, a reboot from the pack,
// a pool so small that steps evict (replays every step) and a pool smaller than a step's routed
// set (layer by layer, the prefill in chunks), on models/tiny and the fixtures; the stores serve
// the bytes a resident load uploads; a miss tolerance K replays only steps that missed more than
// K; bad settings and packs give clear errors or a rebuild, never wrong weights.
#include "../cpu_isa_env.h"
#include "../residency_scenarios.h"
#include "backend/cpu/cpu_backend.h"

#include <fstream>

namespace moet {
namespace {

using namespace residency_test;

BackendFactory cpu() {
  return [] { return cpu_backend_create({2, test_cpu_isa()}); };
}

Loaded load(const Checkpoint& checkpoint, const std::filesystem::path& pack_dir, std::optional<TieringConfig> config) {
  return residency_test::load(cpu(), checkpoint, pack_dir, std::move(config));
}

class Residency : public ::testing::TestWithParam<Case> {};

TEST_P(Residency, BitIdenticalToResident) { check_residency_scenarios(cpu(), GetParam()); }

std::vector<Case> cases() {
  std::vector<Case> out;
  for (ExpertStoreKind store : {ExpertStoreKind::ram, ExpertStoreKind::pack, ExpertStoreKind::arena})
    out.push_back({"models/tiny", store, 200});
  // W2K pack rows through the slots
  out.push_back({"models/tiny", ExpertStoreKind::pack, 64, "", {}, ExpertMode::w2k});
  for (const char* fixture : {"qwen3_moe", "deepseek_v3", "glm4_moe", "mixtral"})
    for (ExpertStoreKind store : {ExpertStoreKind::ram, ExpertStoreKind::arena})
      out.push_back({std::string("tests/fixtures/") + fixture, store, 200});
  return out;
}

INSTANTIATE_TEST_SUITE_P(Stores, Residency, ::testing::ValuesIn(cases()), [](const ::testing::TestParamInfo<Case>& info) {
  std::string name = info.param.model.substr(info.param.model.rfind('/') + 1) + "_" + expert_store_name(info.param.store);
  if (info.param.experts != ExpertMode::w2) name += std::string("_") + expert_mode_name(info.param.experts);
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
    TieringConfig t = tiering(ExpertStoreKind::ram, 40);  // few misses a step: decode stays in graphs
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
      const int64_t misses_before = r.stats().missing_pairs, layerwise_before = r.stats().layerwise_steps;
      const StepOutcome out = batch.decode(int64_t(seq.tokens.size()) - 1);
      const int64_t first_pass_and_more = r.stats().missing_pairs - misses_before;
      if (out.passes == 1 && r.stats().layerwise_steps > layerwise_before) {  // ran layer by layer: nothing missed
        logits = out.output.logits;
        continue;
      }
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
