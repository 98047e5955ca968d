// Tiered expert residency on the GPU with CUDA graphs on: the scenarios of the CPU suite
// (tests/cpp/residency_scenarios.h: cold, warm, reboot from the pack, a pool that evicts every
// step, a pool smaller than a step's routed set) memcmp-equal to the resident model, for every
// store, on models/tiny and the fixtures; decode steps replay captured graphs while experts move
// (the kernels read the tables and record misses inside the graph). Skips without a GPU.
#include "gpu_test_util.h"

#include "../residency_scenarios.h"

namespace moet::test {
namespace {

using namespace residency_test;

BackendFactory gpu() {
  return [] { return cuda_backend_create({0, 0.9, 0.0, true}); };
}

class CudaResidency : public ::testing::TestWithParam<Case> {};

TEST_P(CudaResidency, BitIdenticalToResident) {
  MOET_SKIP_WITHOUT_GPU();
  check_residency_scenarios(gpu(), GetParam());
}

std::vector<Case> cuda_cases() {
  std::vector<Case> out;
  for (ExpertStoreKind store : {ExpertStoreKind::ram, ExpertStoreKind::pack, ExpertStoreKind::arena})
    out.push_back({"models/tiny", store, 200});
  for (const char* fixture : {"qwen3_moe", "deepseek_v3", "glm4_moe", "mixtral"})
    out.push_back({std::string("tests/fixtures/") + fixture, ExpertStoreKind::ram, 200});
  // W2K rows through the slots
  out.push_back({"models/tiny", ExpertStoreKind::pack, 64, "", {}, ExpertMode::w2k});
  return out;
}

INSTANTIATE_TEST_SUITE_P(Stores, CudaResidency, ::testing::ValuesIn(cuda_cases()),
                         [](const ::testing::TestParamInfo<Case>& info) {
                           const std::string& m = info.param.model;
                           std::string name = m.substr(m.rfind('/') + 1) + "_" + expert_store_name(info.param.store);
                           if (info.param.experts != ExpertMode::w2)
                             name += std::string("_") + expert_mode_name(info.param.experts);
                           return name;
                         });

// The decode steps of a tiered model run as CUDA graphs, replayed while the cache changes.
TEST(CudaResidencyGraphs, DecodeStepsReplayGraphs) {
  MOET_SKIP_WITHOUT_GPU();
  const Checkpoint checkpoint = Checkpoint::open(kSource / "models/tiny");
  Loaded tiered = load(gpu(), checkpoint, {}, tiering(ExpertStoreKind::ram, 12));
  const Decoded run = greedy(*tiered.model, prompt_for(*tiered.model, 8, 5), 40);
  const GraphStats graphs = tiered.backend->graph_stats();
  EXPECT_EQ(graphs.failures, 0);
  EXPECT_GT(graphs.replays, 0) << "decode passes relaunch their graphs while experts move";
  const ExpertKpis k = tiered.model->experts().residency()->kpis();
  EXPECT_GT(k.replayed_steps, 0);
  EXPECT_GT(k.missing_pairs, 0);
}

}  // namespace
}  // namespace moet::test
