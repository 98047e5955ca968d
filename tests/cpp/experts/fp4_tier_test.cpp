// The FP4 tier and the confidence gate on the CPU backend: the scenarios of
// tests/cpp/fp4_tier_scenarios.h (tau = 1 gives the all-FP4 model, tau = 0 the W2 model, moves of a
// tier of the base's rows change nothing), and on the CPU alone: the manager promotes at most
// --fp4-promote-per-step experts a step, never over-fills the pool, counts FP4 routings and runs
// deterministically; a pool below one layer's need, tau outside [0, 1] and the tier over
// --experts fp4 are clear errors; the tau file is re-read when it changes.
#include "../cpu_isa_env.h"
#include "../fp4_tier_scenarios.h"
#include "backend/cpu/cpu_backend.h"

#include <fstream>
#include <thread>

namespace moet {
namespace {

using namespace fp4_tier_test;

BackendFactory cpu() {
  return [] { return cpu_backend_create({2, test_cpu_isa()}); };
}

Loaded load_cpu(ExpertMode mode, std::optional<Fp4TierConfig> tier) {
  return load_model(cpu(), tiny().checkpoint, mode, std::move(tier));
}

TEST(Fp4Tier, TauOneWithRoomForEveryExpertGivesTheFp4Model) { check_tau_one_gives_the_fp4_model(cpu(), "cpu"); }
TEST(Fp4Tier, TopLogitsStepsAreJudgedToo) { check_top_logits_steps_are_judged(cpu()); }
TEST(Fp4Tier, TauZeroWithoutManagerGivesTheW2Model) { check_tau_zero_gives_the_w2_model(cpu(), "cpu"); }
TEST(Fp4Tier, MovesOfATierOfTheBaseRowsChangeNothing) { check_base_row_tier_changes_nothing(cpu(), "cpu"); }
TEST(Fp4Tier, TheExpertCacheUnderTheTierChangesNothing) { check_expert_cache_under_the_tier(cpu(), 2); }

TEST(Fp4Tier, TheManagerPromotesAtMostPPerStep) {
  const auto run = [](std::vector<std::vector<float>>& logits) {
    Loaded l = load_cpu(ExpertMode::w2, tier_config(8, 2, 0.0));
    Fp4Tier& tier = *l.model->experts().fp4_tier();
    SequenceBatch batch(*l.model, 1, int64_t(tiny().prompt.size()) + kSteps, 4);
    Sequence& seq = batch.sequence(0);
    seq.tokens = tiny().prompt;
    logits.push_back(batch.run_rows(0, 0, int64_t(seq.tokens.size()), ChunkRows::last).output.logits);
    for (int64_t i = 0; i < kSteps; ++i) {
      seq.tokens.push_back(argmax(logits.back().data(), l.model->config().vocab_size));
      const Fp4TierStats before = tier.stats();
      logits.push_back(batch.decode(int64_t(seq.tokens.size()) - 1).output.logits);
      const Fp4TierStats after = tier.stats();
      EXPECT_LE(after.promotions - before.promotions, 2) << "step " << i;
      EXPECT_LE(after.held, 8);
    }
    return tier.stats();
  };
  std::vector<std::vector<float>> a, b;
  const Fp4TierStats s = run(a);
  run(b);
  EXPECT_GE(s.promotions, 8) << "the pool fills";
  EXPECT_EQ(s.held, 8);
  EXPECT_GT(s.fp4_items, 0);
  EXPECT_LT(s.fp4_items, s.routed_items);
  EXPECT_EQ(s.forced_promotions, 0);
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i)
    ASSERT_EQ(0, std::memcmp(a[i].data(), b[i].data(), a[i].size() * sizeof(float))) << "step " << i << ": run to run";
  const Decoded& w2 = reference(cpu(), "cpu", ExpertMode::w2);
  bool differs = false;
  for (size_t i = 0; i < a.size(); ++i)
    differs = differs || std::memcmp(a[i].data(), w2.logits[i].data(), a[i].size() * sizeof(float)) != 0;
  EXPECT_TRUE(differs) << "FP4 experts change the logits";
  const Fp4Kpis k = fp4_kpis(s, {});
  EXPECT_DOUBLE_EQ(k.coverage, 8.0 / double(tiny().total));
  EXPECT_GT(k.hit_rate, 0.0);
}

TEST(Fp4TierErrors, PoolBelowOneLayersNeed) {
  Loaded l = load_cpu(ExpertMode::w2, tier_config(3, 0, 0.5));
  try {
    SequenceBatch batch(*l.model, 1, 8, 4);
    ADD_FAILURE() << "a 3-slot FP4 pool was accepted for top-4 routing";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("at least 4 slots"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("--fp4-pool"), std::string::npos) << e.what();
  }
}

TEST(Fp4TierErrors, BadSettings) {
  try {
    load_cpu(ExpertMode::w2, tier_config(8, 0, 1.5));
    ADD_FAILURE() << "tau 1.5 was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("--gate-tau must be in [0, 1]"), std::string::npos) << e.what();
  }
  try {
    load_cpu(ExpertMode::fp4, tier_config(8, 0, 0.5));
    ADD_FAILURE() << "an FP4 tier over FP4 experts was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("over W2 experts"), std::string::npos) << e.what();
  }
}

TEST(GateControl, TheTauFileIsReadAgainWhenItChanges) {
  TempDir dir;
  const std::filesystem::path file = dir.path() / "tau";
  std::ofstream(file) << "0.25\n";
  GateOptions o;
  o.tau = 0.9;
  o.tau_file = file.string();
  GateControl gate(o);
  EXPECT_EQ(gate.tau(), 0.25) << "the file overrides --gate-tau";
  std::ofstream(file) << "0.75";
  std::filesystem::last_write_time(file, std::filesystem::last_write_time(file) + std::chrono::seconds(1));
  std::this_thread::sleep_for(std::chrono::duration<double>(GateControl::kTauFilePollSeconds + 0.05));
  gate.poll_file();
  EXPECT_EQ(gate.tau(), 0.75);
  std::ofstream(file) << "2";  // not in [0, 1]: ignored
  std::filesystem::last_write_time(file, std::filesystem::last_write_time(file) + std::chrono::seconds(2));
  std::this_thread::sleep_for(std::chrono::duration<double>(GateControl::kTauFilePollSeconds + 0.05));
  gate.poll_file();
  EXPECT_EQ(gate.tau(), 0.75);
  EXPECT_THROW(gate.set_tau(-0.1), Error);
  std::ofstream(file) << "nope";
  EXPECT_THROW(GateControl{o}, Error) << "a tau file must hold a tau at start";
}

}  // namespace
}  // namespace moet
