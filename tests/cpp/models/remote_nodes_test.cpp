// A model split over two nodes (models/remote_nodes.h) without GPUs or a network: one CpuCommGroup of
// two ranks cut into two "nodes" of one rank (CpuCommGroup::node), node 0's ParallelModel telling
// node 1's every KV cache and forward over a socket pair (NodeLink::pair), node 1 following on its
// own thread as a follower process does (follow_node0). Node 0's results are the bits (memcmp) of the
// same split run in one process, for tensor and expert parallelism (MLA, DeepSeek-V4's compressed and
// GLM-5's sparse attention), through generate() and through an engine batching sequences of
// different lengths (several block tables per step); node 1 stops when node 0's model goes and when
// its link closes; a malformed message is refused. The TCP links themselves (two processes) are
// tested in tests/cpp/backend/rendezvous_test.cpp.
#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/cpu_communicator.h"
#include "core/error.h"
#include "engine/engine_core.h"
#include "engine/generator.h"
#include "io/checkpoint.h"
#include "models/arch/arch.h"
#include "models/parallel_model.h"
#include "models/remote_nodes.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <cstring>
#include <functional>
#include <map>
#include <thread>

namespace moet {
namespace {

const std::filesystem::path kFixtures = std::filesystem::path(MOET_SOURCE_DIR) / "tests" / "fixtures";

// The ranks of `group` as one split model (remote: node 0 of several).
std::unique_ptr<Model> load_ranks(const Checkpoint& checkpoint, CommGroup& group, bool expert_parallel,
                                  std::shared_ptr<RemoteNodes> remote = nullptr) {
  const ParallelLoad ranks{&group, expert_parallel, [](int) { return cpu_backend_create({1, cpu_isa_best()}); },
                           [&](Backend& backend, const ModelLoadOptions& own) {
                             return model_load(checkpoint, backend, nullptr, own);
                           },
                           std::move(remote)};
  return parallel_model_load(model_config_parse(checkpoint.config()), ranks, ModelLoadOptions{ExpertMode::native});
}

// `work` on node 0 of a two-node split (one rank per node) while node 1 follows on its own thread;
// node 0's model is released before node 1 is joined (it then stops).
template <typename Result>
Result on_two_nodes(const Checkpoint& checkpoint, bool expert_parallel, const std::function<Result(Model&)>& work) {
  CpuCommGroup all(2);
  const std::unique_ptr<CommGroup> node0 = all.node(0, 1), node1 = all.node(1, 1);
  auto [link0, link1] = NodeLink::pair();
  std::string follower_error;
  std::thread follower([&, link = std::move(link1)]() mutable {
    try {
      std::unique_ptr<Model> model = load_ranks(checkpoint, *node1, expert_parallel);
      follow_node0(*model, link);
    } catch (const std::exception& e) {
      follower_error = e.what();
    }
  });
  std::vector<NodeLink> links;
  links.push_back(std::move(link0));
  Result result;
  {
    std::unique_ptr<Model> model =
        load_ranks(checkpoint, *node0, expert_parallel, std::make_shared<RemoteNodes>(std::move(links)));
    result = work(*model);
  }
  follower.join();
  EXPECT_EQ(follower_error, "");
  return result;
}

GenerateResult greedy(Model& model, const nlohmann::json& golden) {
  GenerateOptions options;
  options.max_tokens = int64_t(golden["greedy_ids"].size());
  options.block_size = 4;
  return generate(model, golden["prompt_ids"].get<std::vector<int32_t>>(), options);
}

TEST(RemoteNodes, TwoNodesGiveTheBitsOfOneProcess) {
  // MLA with shared experts, DeepSeek-V4's compressed attention, GLM-5's sparse attention; TP and EP.
  for (const auto& [fixture, expert_parallel] :
       {std::pair{"deepseek_v3", false}, {"deepseek_v3", true}, {"deepseek_v4", false}, {"glm_moe_dsa", true}}) {
    const nlohmann::json golden = json_read_file(kFixtures / fixture / "golden.json");
    const Checkpoint checkpoint = Checkpoint::open(kFixtures / fixture);
    CpuCommGroup one_process(2);
    const GenerateResult local = greedy(*load_ranks(checkpoint, one_process, expert_parallel), golden);
    const GenerateResult nodes = on_two_nodes<GenerateResult>(
        checkpoint, expert_parallel, [&](Model& model) { return greedy(model, golden); });
    const std::string name = std::string(fixture) + (expert_parallel ? " ep2" : " tp2");
    ASSERT_EQ(nodes.prompt_logits.size(), local.prompt_logits.size()) << name;
    EXPECT_EQ(std::memcmp(nodes.prompt_logits.data(), local.prompt_logits.data(), local.prompt_logits.size() * 4), 0)
        << name;
    EXPECT_EQ(nodes.output_ids, local.output_ids) << name;
  }
}

using Tokens = std::map<int64_t, std::vector<int32_t>>;

// Five requests of different lengths through one engine: prefill chunks and decode rows of several
// sequences per step.
Tokens batched(Model& model) {
  EngineConfig config;
  config.max_num_batched_tokens = 24;
  config.block_size = 4;
  config.num_blocks = 96;
  config.max_model_len = 64;
  EngineCore engine(model, std::nullopt, config);
  Tokens tokens;
  for (int i = 0; i < 5; ++i) {
    RequestParams p;
    for (int k = 0; k < 3 + 4 * i; ++k) p.prompt.push_back(int32_t((i * 37 + k * 11) % 500 + 3));
    p.max_tokens = 6;
    engine.add(i, p, [&tokens, i](RequestOutput&& o) {
      tokens[i].insert(tokens[i].end(), o.token_ids.begin(), o.token_ids.end());
    });
  }
  while (engine.has_work()) engine.step();
  return tokens;
}

TEST(RemoteNodes, AnEngineOnNode0BatchesLikeOneProcess) {
  const Checkpoint checkpoint = Checkpoint::open(kFixtures / "glm4_moe");
  CpuCommGroup one_process(2);
  const Tokens local = batched(*load_ranks(checkpoint, one_process, false));
  ASSERT_EQ(local.size(), 5u);
  EXPECT_EQ(on_two_nodes<Tokens>(checkpoint, false, batched), local);
}

TEST(RemoteNodes, AFollowerStopsWhenItsLinkClosesAndRefusesGarbage) {
  const Checkpoint checkpoint = Checkpoint::open(kFixtures / "mixtral");
  auto backend = cpu_backend_create({1, cpu_isa_best()});
  const std::unique_ptr<Model> model = model_load(checkpoint, *backend);
  {
    auto [node0, node1] = NodeLink::pair();
    { NodeLink gone = std::move(node0); }  // node 0 dies without a word
    follow_node0(*model, node1);            // returns
  }
  auto [node0, node1] = NodeLink::pair();
  const std::vector<uint8_t> garbage = {0x7f, 1, 2};
  node0.send(garbage);
  try {
    follow_node0(*model, node1);
    FAIL() << "a malformed message was followed";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("unknown message from node 0"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace moet
