// Past the expert cache on the CPU backend (docs/experts.md): exclusive tiering, experts computed
// on the host (--cpu-experts on / auto), next-layer prefetch. Each mode runs the residency
// scenarios (tests/cpp/residency_scenarios.h: a prefill and greedy decode steps, cold, warm, after
// a reboot, with an evicting pool and with a pool smaller than a step) and its logits are
// memcmp-equal to the fully resident model's: exclusive tiering moves bytes, not values; the
// host computes a missing expert with the very kernels of the CPU backend's MoE op
// (kernels/cpu/expert_ffn.h) and the op adds its result in the expert's place, so on the CPU
// the host path is bit-identical (on CUDA it is within FP32 rounding: tests/cpp/cuda). Also: the
// exclusive store holds exactly the experts the pool does not, the per-miss policy as a pure
// function, the mailbox poller CUDA's host experts go through, and bad combinations refused.
#include "../cpu_isa_env.h"
#include "../residency_scenarios.h"
#include "backend/cpu/cpu_backend.h"
#include "experts/host_experts.h"
#include "experts/miss_policy.h"

#include <atomic>
#include <thread>

namespace moet {
namespace {

using namespace residency_test;

BackendFactory cpu() {
  return [] { return cpu_backend_create({2, test_cpu_isa()}); };
}

constexpr int64_t kSteps = 40;

std::function<void(TieringConfig&)> mode(ExpertTiering tiering, CpuExperts host, ExpertPrefetch prefetch) {
  return [=](TieringConfig& t) {
    t.residency.tiering = tiering;
    t.residency.cpu_experts = host;
    t.residency.prefetch = prefetch;
    t.residency.host_isa = test_cpu_isa();
    t.residency.cpu_threads = 2;
  };
}

class PastTheCache : public ::testing::TestWithParam<Case> {};

TEST_P(PastTheCache, BitIdenticalToResident) { check_residency_scenarios(cpu(), GetParam()); }

std::vector<Case> cases() {
  using T = ExpertTiering;
  using H = CpuExperts;
  using P = ExpertPrefetch;
  std::vector<Case> out;
  const auto add = [&](const std::string& model, ExpertStoreKind store, const std::string& name, T t, H h, P p) {
    out.push_back({model, store, kSteps, name, mode(t, h, p)});
  };
  for (ExpertStoreKind store : {ExpertStoreKind::ram, ExpertStoreKind::arena})
    add("models/tiny", store, "exclusive", T::exclusive, H::off, P::off);
  add("models/tiny", ExpertStoreKind::ram, "host", T::inclusive, H::on, P::off);
  add("models/tiny", ExpertStoreKind::ram, "auto", T::inclusive, H::automatic, P::off);
  add("models/tiny", ExpertStoreKind::ram, "prefetch", T::inclusive, H::off, P::next_layer);
  add("models/tiny", ExpertStoreKind::arena, "exclusive_host_prefetch", T::exclusive, H::on, P::next_layer);
  for (const char* fixture : {"qwen3_moe", "deepseek_v3", "glm4_moe", "mixtral"}) {
    add(std::string("tests/fixtures/") + fixture, ExpertStoreKind::ram, "exclusive", T::exclusive, H::off, P::off);
    add(std::string("tests/fixtures/") + fixture, ExpertStoreKind::ram, "host", T::inclusive, H::on, P::off);
  }
  return out;
}

INSTANTIATE_TEST_SUITE_P(Modes, PastTheCache, ::testing::ValuesIn(cases()),
                         [](const ::testing::TestParamInfo<Case>& info) {
                           return info.param.model.substr(info.param.model.rfind('/') + 1) + "_" +
                                  expert_store_name(info.param.store) + "_" + info.param.mode;
                         });

Loaded load_cpu(const Checkpoint& checkpoint, const std::filesystem::path& pack_dir, std::optional<TieringConfig> t) {
  return residency_test::load(cpu(), checkpoint, pack_dir, std::move(t));
}

// No pool at all (--cpu-experts on without a cache, as `-ot exps=CPU`): every routed expert runs on
// the host, and the logits are the resident model's.
TEST(HostExperts, EveryExpertOnTheHost) {
  const Checkpoint checkpoint = Checkpoint::open(kSource / "models/tiny");
  Loaded resident = load_cpu(checkpoint, {}, std::nullopt);
  const std::vector<int32_t> p = prompt_for(*resident.model, 9, 5);
  TieringConfig t = tiering(ExpertStoreKind::ram, 0);
  mode(ExpertTiering::inclusive, CpuExperts::on, ExpertPrefetch::off)(t);
  t.residency.host_only = true;
  Loaded host = load_cpu(checkpoint, {}, t);
  expect_same(greedy(*host.model, p, kSteps), greedy(*resident.model, p, kSteps), "every expert on the host");
  const ExpertKpis k = host.model->experts().residency()->kpis();
  EXPECT_EQ(k.host_item_fraction, 1.0);
  EXPECT_EQ(k.fetched_rows, 0);
  EXPECT_EQ(k.replayed_steps, 0);
}

// With host experts the cache keeps learning: the hottest host-computed experts move into slots
// (at most promote_per_step a step), and fewer routings go to the host over time.
TEST(HostExperts, PromotionsMoveHotExpertsIntoTheCache) {
  const Checkpoint checkpoint = Checkpoint::open(kSource / "models/tiny");
  for (const int64_t per_step : {int64_t(0), int64_t(2)}) {
    TieringConfig t = tiering(ExpertStoreKind::ram, 12);
    mode(ExpertTiering::inclusive, CpuExperts::on, ExpertPrefetch::off)(t);
    t.residency.promote_per_step = per_step;
    Loaded host = load_cpu(checkpoint, {}, t);
    const Decoded d = greedy(*host.model, prompt_for(*host.model, 7, 2), kSteps);
    const ExpertKpis k = host.model->experts().residency()->kpis();
    if (per_step == 0) {
      EXPECT_EQ(k.promoted_rows, 0);
      EXPECT_EQ(k.host_item_fraction, 1.0) << "nothing ever enters the cache";
    } else {
      EXPECT_GT(k.promoted_rows, 0);
      EXPECT_LE(k.promoted_rows, per_step * (kSteps + 1));
      EXPECT_LT(k.host_item_fraction, 1.0);
    }
  }
}

// Exclusive tiering: after steps that evicted, the host store holds exactly the experts the pool
// does not, each with the resident load's bytes (the evicted ones were written back intact).
TEST(ExclusiveTiering, TheStoreHoldsWhatThePoolDoesNot) {
  const Checkpoint checkpoint = Checkpoint::open(kSource / "tests/fixtures/qwen3_moe");
  Loaded resident = load_cpu(checkpoint, {}, std::nullopt);
  TieringConfig t = tiering(ExpertStoreKind::ram, 8);
  mode(ExpertTiering::exclusive, CpuExperts::off, ExpertPrefetch::off)(t);
  Loaded tiered = load_cpu(checkpoint, {}, t);
  greedy(*tiered.model, prompt_for(*tiered.model, 7, 1), 20);
  ExpertPool& pool = tiered.model->experts();
  EXPECT_GT(pool.residency()->kpis().written_back_rows, 0);
  ExpertStore& store = const_cast<ExpertStore&>(pool.residency()->store());
  int64_t in_pool = 0;
  for (int64_t layer = 0; layer < pool.layers(); ++layer) {
    if (!pool.has_layer(layer)) continue;
    for (int64_t e = 0; e < pool.experts_per_layer(); ++e) {
      const ExpertKey key{layer, e};
      if (pool.present(layer, e)) {
        ++in_pool;
        EXPECT_THROW(store.fetch({&key, 1}), Error) << "layer " << layer << " expert " << e << " is in both";
        continue;
      }
      const uint8_t* row = store.fetch({&key, 1})[0];
      const ExpertWeights& w = resident.model->experts().layer(layer).experts[size_t(e)];
      size_t offset = 0;
      for (const Tensor* plane : {&w.gate_up, &w.gate_up_scales, &w.down, &w.down_scales}) {
        ASSERT_EQ(0, std::memcmp(row + offset, plane->data, plane->bytes())) << "layer " << layer << " expert " << e;
        offset += plane->bytes();
      }
    }
  }
  EXPECT_EQ(in_pool, 8) << "the exclusive pool stays full";
}

// Combinations that make no sense are refused with one clear line.
TEST(ExclusiveTiering, RefusesWhatMakesNoSense) {
  const Checkpoint checkpoint = Checkpoint::open(kSource / "tests/fixtures/qwen3_moe");
  TempDir dir;
  const auto refused = [&](TieringConfig t, const std::filesystem::path& pack_dir, const std::string& says) {
    try {
      load_cpu(checkpoint, pack_dir, t);
      ADD_FAILURE() << "accepted; expected an error saying '" << says << "'";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(says), std::string::npos) << e.what();
    }
  };
  TieringConfig pack = tiering(ExpertStoreKind::pack, 8);
  pack.residency.tiering = ExpertTiering::exclusive;
  refused(pack, dir.path(), "the pack store keeps no row in RAM");
  TieringConfig sized_later = tiering(ExpertStoreKind::ram, 0);
  sized_later.residency.tiering = ExpertTiering::exclusive;
  refused(sized_later, {}, "not auto");
}

// auto with a tolerance K: each pass leaves out at most K misses (skips), then computes or fetches
// the rest.
TEST(HostExperts, AutoSkipsAtMostTheTolerancePerPass) {
  const Checkpoint checkpoint = Checkpoint::open(kSource / "models/tiny");
  TieringConfig t = tiering(ExpertStoreKind::ram, 12);
  mode(ExpertTiering::inclusive, CpuExperts::automatic, ExpertPrefetch::off)(t);
  t.residency.miss_tolerance = 1;
  Loaded tiered = load_cpu(checkpoint, {}, t);
  greedy(*tiered.model, prompt_for(*tiered.model, 7, 3), kSteps);
  const ExpertKpis k = tiered.model->experts().residency()->kpis();
  EXPECT_GT(k.chose_skip, 0);
  EXPECT_LE(k.chose_skip, k.passes) << "at most one skip a pass";
  EXPECT_GT(k.chose_host + k.chose_fetch, 0);
}

// The per-miss policy, a pure function of costs and the miss's situation.
TEST(MissPolicy, ChoosesByCostAndSituation) {
  MissCosts c;
  c.fetch_seconds = 1e-3;
  c.replay_seconds = 10e-3;
  c.host_fixed_seconds = 0.5e-3;
  c.host_row_seconds = 1e-3;
  const auto choose = [&](MissSituation m) { return choose_miss_action(c, m); };
  MissSituation decode;  // one row in a graph pass: host 1.5 ms against fetch 1 ms + replay 10 ms
  EXPECT_EQ(choose(decode), MissAction::host);
  MissSituation many = decode;  // 20 rows: host 20.5 ms against 11 ms
  many.rows = 20;
  EXPECT_EQ(choose(many), MissAction::fetch);
  MissSituation layerwise = decode;  // no replay to pay: fetch 1 ms against host 1.5 ms
  layerwise.layerwise = true;
  EXPECT_EQ(choose(layerwise), MissAction::fetch);
  MissSituation chosen = decode;  // the pass runs again anyway: a host result would be thrown away
  chosen.replay_chosen = true;
  EXPECT_EQ(choose(chosen), MissAction::fetch);
  chosen.layerwise = true;  // ... unless the layer waits for its fetches (no replay): by cost again
  EXPECT_EQ(choose(chosen), MissAction::fetch);
  MissSituation nowhere = many;  // no slot to fetch into, or no replay left: the host
  nowhere.fetch_possible = false;
  EXPECT_EQ(choose(nowhere), MissAction::host);
  MissSituation tolerated = many;  // within the tolerance: skipped, whatever the costs
  tolerated.skips_left = 1;
  EXPECT_EQ(choose(tolerated), MissAction::skip);
  MissCosts tie = c;  // ties go to the host
  tie.host_fixed_seconds = 0.0;
  tie.host_row_seconds = tie.fetch_seconds + tie.replay_seconds;
  EXPECT_EQ(choose_miss_action(tie, decode), MissAction::host);
  MissCosts unmeasured = c;  // before any decode pass was timed a replay counts as infinite
  unmeasured.replay_seconds = std::numeric_limits<double>::infinity();
  EXPECT_EQ(choose_miss_action(unmeasured, many), MissAction::host);
}

// The mailbox a device-side MoE op goes through (CUDA): a "device" thread writes a layer's rows and
// routing, raises ready and waits for done; the poller answers through the server, which sees
// exactly what was written, and the results come back.
class RecordingServer final : public HostExpertServer {
 public:
  void serve(int64_t layer, const float* x, const int32_t* ids, const float* weights, int64_t rows, int64_t top_k,
             float* results, int32_t* valid) override {
    calls.fetch_add(1);
    for (int64_t i = 0; i < rows * top_k; ++i) {
      valid[i] = ids[i] % 2;
      for (int64_t d = 0; d < hidden; ++d)
        results[i * hidden + d] = float(layer) + x[(i / top_k) * hidden + d] * weights[i];
    }
  }
  int64_t hidden = 0;
  std::atomic<int> calls{0};
};

TEST(HostExperts, MailboxPollerAnswersThroughTheServer) {
  auto backend = cpu_backend_create({1, test_cpu_isa()});
  const ExpertLayout layout{ExpertFormat::w2, 64, 32};
  HostExperts host(*backend, layout, {}, 1, test_cpu_isa());
  RecordingServer server;
  server.hidden = layout.hidden;
  const std::vector<int64_t> layers = {1, 3};
  const int64_t rows = 2, top_k = 2;
  host.open_mailboxes(layers, rows, top_k, server);
  for (const bool announced : {true, false}) {  // an unannounced pass is answered too, only later
    if (announced) host.begin_pass();
    for (int64_t layer : layers) {
      const HostMailbox m = host.mailbox(layer);
      for (int64_t i = 0; i < rows * layout.hidden; ++i) m.x[i] = float(i);
      for (int64_t i = 0; i < rows * top_k; ++i) {
        m.ids[i] = int32_t(i);
        m.weights[i] = 0.5f;
      }
      *m.rows = int32_t(rows);
      std::atomic_ref<uint32_t>(*m.ready).store(1, std::memory_order_release);
      while (std::atomic_ref<uint32_t>(*m.done).load(std::memory_order_acquire) != 1) std::this_thread::yield();
      std::atomic_ref<uint32_t>(*m.done).store(0, std::memory_order_relaxed);
      EXPECT_EQ(*m.ready, 0u) << "the poller clears ready";
      for (int64_t i = 0; i < rows * top_k; ++i) {
        EXPECT_EQ(m.valid[i], int32_t(i % 2));
        EXPECT_EQ(m.results[i * layout.hidden + 5], float(layer) + float((i / top_k) * layout.hidden + 5) * 0.5f);
      }
    }
    if (announced) host.end_pass();
  }
  EXPECT_EQ(server.calls.load(), 4);
}

}  // namespace
}  // namespace moet
