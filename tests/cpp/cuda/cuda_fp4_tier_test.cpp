// The FP4 tier and the confidence gate on the GPU with CUDA graphs on: the scenarios of the CPU
// suite (tests/cpp/fp4_tier_scenarios.h: tau = 1 with room for every expert gives the all-FP4
// model bit for bit, also over the expert cache and with top-logits steps; tau = 0 the W2 model;
// moves of a tier of the base's rows change nothing), the decode steps replaying their graphs
// while the tier's tables change; the confidence kernel against the CPU's; FP4 rows loaded
// without waiting (expert_slots_load_async) land in their slots. Skips without a GPU.
#include "gpu_test_util.h"

#include "../fp4_tier_scenarios.h"
#include "kernels/cpu/logit_confidence.h"

namespace moet::test {
namespace {

using namespace fp4_tier_test;

BackendFactory gpu() {
  return [] { return cuda_backend_create({0, 0.9, 0.0, true}); };
}

TEST(CudaFp4Tier, TauOneWithRoomForEveryExpertGivesTheFp4Model) {
  MOET_SKIP_WITHOUT_GPU();
  check_tau_one_gives_the_fp4_model(gpu(), "cuda");
}

TEST(CudaFp4Tier, TopLogitsStepsAreJudgedToo) {
  MOET_SKIP_WITHOUT_GPU();
  check_top_logits_steps_are_judged(gpu());
}

TEST(CudaFp4Tier, TauZeroWithoutManagerGivesTheW2Model) {
  MOET_SKIP_WITHOUT_GPU();
  check_tau_zero_gives_the_w2_model(gpu(), "cuda");
}

TEST(CudaFp4Tier, MovesOfATierOfTheBaseRowsChangeNothing) {
  MOET_SKIP_WITHOUT_GPU();
  check_base_row_tier_changes_nothing(gpu(), "cuda");
}

TEST(CudaFp4Tier, TheExpertCacheUnderTheTierChangesNothing) {
  MOET_SKIP_WITHOUT_GPU();
  check_expert_cache_under_the_tier(gpu(), 0);
}

// The manager's copies run on the copy stream while decode steps replay their graphs; every
// promotion becomes visible at a later step boundary and the graphs are never captured again.
TEST(CudaFp4Tier, ManagerPromotesWhileGraphsReplay) {
  MOET_SKIP_WITHOUT_GPU();
  Loaded l = load_model(gpu(), tiny().checkpoint, ExpertMode::w2, tier_config(8, 2, 0.0));
  greedy(*l.model, tiny().prompt, kSteps);
  const Fp4TierStats s = tier_stats(l);
  EXPECT_GE(s.promotions, 8);
  EXPECT_EQ(s.held, 8);
  EXPECT_GT(s.fp4_items, 0);
  const GraphStats graphs = l.backend->graph_stats();
  EXPECT_EQ(graphs.failures, 0);
  EXPECT_GT(graphs.replays, kSteps / 2);
  EXPECT_LE(graphs.captures, 4) << "table changes need no new capture";
}

TEST(CudaLogitConfidence, MatchesCpu) {
  MOET_SKIP_WITHOUT_GPU();
  BackendPair p;
  for (int64_t vocab : {1, 2, 100, 8192, 151936}) {
    const int64_t rows = 5;
    std::vector<float> logits = awkward_logits(rows, vocab, uint64_t(vocab));
    const auto in = p.activation(logits, {rows, vocab});
    auto out = p.alloc({rows, 2});
    p.cpu->logit_confidence(in.first, out.first);
    p.gpu->logit_confidence(in.second, out.second);
    const auto a = host(*p.cpu, out.first), b = host(*p.gpu, out.second);
    for (size_t i = 0; i < a.size(); ++i)  // float sums over up to 152k terms against a double sum
      EXPECT_NEAR(a[i], b[i], 2e-6 + 1e-4 * std::fabs(a[i])) << "vocab " << vocab << " value " << i;
  }
}

// A W2 layer with an FP4 tier (two tables, two passes of the MoE op): with no tier entries it
// gives the plain W2 layer's bits, with every expert in the tier the plain FP4 layer's, and with
// some of each the CPU's mixed layer within FP32 rounding.
TEST(CudaFp4Tier, TierLayersMatchThePlainLayersAndTheCpu) {
  MOET_SKIP_WITHOUT_GPU();
  const int64_t experts = 16, top_k = 4, hidden = 256, inner = 96;
  const auto random_planes = [](BackendPair& p, ExpertFormat format, int64_t e) {
    const int64_t bits = format == ExpertFormat::w2 ? 2 : 4;
    std::mt19937_64 rng(uint64_t(e * 10 + bits));
    const auto plane = [&](int64_t n, std::vector<int64_t> shape, bool scales) {
      std::vector<uint8_t> bytes(static_cast<size_t>(n));
      for (auto& b : bytes) b = scales ? uint8_t(119 + rng() % 6) : uint8_t(rng());
      HostTensor info{"plane", DType::u8, std::move(shape), bytes.data(), bytes.size(), "test"};
      return std::make_pair(p.cpu->upload(info), p.gpu->upload(info));
    };
    const auto gu = plane(2 * inner * hidden * bits / 8, {2 * inner, hidden * bits / 8}, false);
    const auto gus = plane(2 * inner * hidden / 32, {2 * inner, hidden / 32}, true);
    const auto dn = plane(hidden * inner * bits / 8, {hidden, inner * bits / 8}, false);
    const auto dns = plane(hidden * inner / 32, {hidden, inner / 32}, true);
    return std::make_pair(ExpertWeights{gu.first, dn.first, format, gus.first, dns.first},
                          ExpertWeights{gu.second, dn.second, format, gus.second, dns.second});
  };
  for (const int64_t rows : {int64_t(1), int64_t(8), int64_t(300)}) {
    BackendPair p;
    std::vector<ExpertWeights> cpu_w2, gpu_w2, cpu_fp4, gpu_fp4;
    for (int64_t e = 0; e < experts; ++e) {
      const auto w = random_planes(p, ExpertFormat::w2, e), f = random_planes(p, ExpertFormat::fp4, e);
      cpu_w2.push_back(w.first);
      gpu_w2.push_back(w.second);
      cpu_fp4.push_back(f.first);
      gpu_fp4.push_back(f.second);
    }
    const ExpertSet gpu_plain_w2 = p.gpu->expert_set({ExpertFormat::w2, hidden, inner}, gpu_w2);
    const ExpertSet gpu_plain_fp4 = p.gpu->expert_set({ExpertFormat::fp4, hidden, inner}, gpu_fp4);
    ExpertSet cpu_mixed = p.cpu->expert_set({ExpertFormat::w2, hidden, inner}, cpu_w2);
    ExpertSet gpu_mixed = p.gpu->expert_set({ExpertFormat::w2, hidden, inner}, gpu_w2);
    p.cpu->expert_set_add_tier(cpu_mixed, ExpertFormat::fp4);
    p.gpu->expert_set_add_tier(gpu_mixed, ExpertFormat::fp4);
    const auto in = p.moe_inputs(rows, experts, top_k, hidden, uint64_t(rows + 5));
    const auto run = [&](const ExpertSet& set) {
      Tensor out = p.gpu->alloc({rows, hidden});
      p.gpu->moe_experts(in.x.second, set, in.ids.second, in.weights.second, out);
      return host(*p.gpu, out);
    };
    const auto same = [](const std::vector<float>& a, const std::vector<float>& b) {
      return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
    };
    EXPECT_TRUE(same(run(gpu_mixed), run(gpu_plain_w2))) << "an empty tier, rows " << rows;
    std::vector<int64_t> all(static_cast<size_t>(experts));
    std::iota(all.begin(), all.end(), 0);
    p.gpu->expert_set_update(gpu_mixed, all, gpu_plain_fp4.experts);
    EXPECT_TRUE(same(run(gpu_mixed), run(gpu_plain_fp4))) << "every expert in the tier, rows " << rows;
    // Even experts back to W2, odd ones at FP4, in both backends.
    std::vector<int64_t> even, odd;
    std::vector<ExpertWeights> gpu_even, cpu_odd;
    for (int64_t e = 0; e < experts; ++e) {
      (e % 2 ? odd : even).push_back(e);
      if (e % 2 == 0) gpu_even.push_back(gpu_plain_w2.experts[size_t(e)]);
      if (e % 2 == 1) cpu_odd.push_back(cpu_fp4[size_t(e)]);
    }
    p.gpu->expert_set_update(gpu_mixed, even, gpu_even);
    p.cpu->expert_set_update(cpu_mixed, odd, cpu_odd);
    auto out = p.alloc({rows, hidden});
    p.cpu->moe_experts(in.x.first, cpu_mixed, in.ids.first, in.weights.first, out.first);
    p.gpu->moe_experts(in.x.second, gpu_mixed, in.ids.second, in.weights.second, out.second);
    EXPECT_LT(max_rel_diff(p, out), 2e-5) << "half in the tier, rows " << rows;
  }
}

// FP4 rows loaded without waiting reach their slots once the fence is ready.
TEST(CudaFp4Tier, AsyncSlotLoadsLandInTheirSlots) {
  MOET_SKIP_WITHOUT_GPU();
  auto backend = cuda_backend_create({});
  const int64_t hidden = 64, inner = 32;
  // [codes13 | scales13 | codes2 | scales2] of MXFP4 planes.
  const uint64_t codes13 = 2 * inner * hidden / 2, scales13 = 2 * inner * hidden / 32, codes2 = hidden * inner / 2;
  const ExpertRowLayout row{0, codes13, codes13 + scales13, codes13 + scales13 + codes2,
                            codes13 + scales13 + codes2 + uint64_t(hidden * inner / 32)};
  ExpertSlots slots = backend->alloc_expert_slots({ExpertFormat::fp4, hidden, inner}, row, 3);
  std::shared_ptr<uint8_t> rows = backend->alloc_pinned(size_t(2 * row.bytes));
  for (uint64_t i = 0; i < 2 * row.bytes; ++i) rows.get()[i] = uint8_t(i * 7 + 1);
  const std::vector<int64_t> ids = {2, 0};
  const std::vector<const uint8_t*> sources = {rows.get(), rows.get() + row.bytes};
  const ExpertLoadFence fence = backend->expert_slots_load_async(slots, ids, sources);
  backend->expert_slots_wait(fence);
  EXPECT_TRUE(backend->expert_slots_ready(fence));
  for (size_t i = 0; i < ids.size(); ++i) {
    std::vector<uint8_t> got(size_t(row.bytes));
    Tensor whole{DType::u8, {int64_t(row.bytes)}, slots.memory, slots.weights[size_t(ids[i])].gate_up.data};
    backend->to_host(whole, got.data());
    EXPECT_EQ(0, std::memcmp(got.data(), sources[i], size_t(row.bytes))) << "slot " << ids[i];
  }
}

}  // namespace
}  // namespace moet::test
