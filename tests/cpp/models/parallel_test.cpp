// Tensor and expert parallelism on the CPU (models/parallel_model.h, docs/parallel.md): for every
// fixture family, the model split over 2 and 4 ranks (threads of this process, CpuCommGroup) and
// with expert parallelism over 2 (and 4) gives last-prompt-position logits within 1e-5 of the
// whole model's and the same greedy continuation, with an FP32 KV cache; the split runs are
// deterministic (memcmp); several sequences batched together (uneven rows per rank) give the tokens
// of one rank; W2 experts go to one pack file per rank; each rank reads only its part of the
// checkpoint (bytes read per tensor); a step that fails leaves the model usable; and impossible
// splits are refused with a one-line error naming the flag.
#include "../temp_dir.h"
#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/cpu_communicator.h"
#include "core/error.h"
#include "engine/engine_core.h"
#include "engine/generator.h"
#include "io/checkpoint.h"
#include "io/pack_format.h"
#include "models/arch/arch.h"
#include "models/parallel_model.h"
#include "models/weight_loader.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <cmath>
#include <cstring>
#include <map>
#include <regex>

namespace moet {
namespace {

const std::filesystem::path kFixtures = std::filesystem::path(MOET_SOURCE_DIR) / "tests" / "fixtures";

struct Split {
  int size = 1;
  bool expert_parallel = false;
};

std::string split_name(Split s) { return (s.expert_parallel ? "ep" : "tp") + std::to_string(s.size); }

// A model and what it runs on (the group outlives the model).
struct Loaded {
  std::unique_ptr<CpuCommGroup> group;
  std::unique_ptr<Backend> backend;
  std::unique_ptr<Model> model;
};

Loaded load(const Checkpoint& checkpoint, Split split, ModelLoadOptions options = {ExpertMode::native}) {
  Loaded l;
  if (split.size == 1 && !split.expert_parallel) {
    l.backend = cpu_backend_create({1, cpu_isa_best()});
    l.model = model_load(checkpoint, *l.backend, nullptr, options);
    return l;
  }
  l.group = std::make_unique<CpuCommGroup>(split.size);
  const ParallelLoad ranks{l.group.get(), split.expert_parallel,
                           [](int) { return cpu_backend_create({1, cpu_isa_best()}); },
                           [&](Backend& backend, const ModelLoadOptions& own) {
                             return model_load(checkpoint, backend, nullptr, own);
                           }};
  l.model = parallel_model_load(model_config_parse(checkpoint.config()), ranks, options);
  return l;
}

GenerateResult greedy(Model& model, const nlohmann::json& golden) {
  GenerateOptions options;
  options.max_tokens = int64_t(golden["greedy_ids"].size());
  options.block_size = 4;
  return generate(model, golden["prompt_ids"].get<std::vector<int32_t>>(), options);
}

double max_abs_diff(const std::vector<float>& a, const std::vector<float>& b) {
  EXPECT_EQ(a.size(), b.size());
  double diff = 0.0;
  for (size_t i = 0; i < std::min(a.size(), b.size()); ++i) diff = std::max(diff, std::fabs(double(a[i]) - b[i]));
  return diff;
}

// The whole model's greedy run of a fixture, once per (fixture, expert mode).
const GenerateResult& reference(const std::string& fixture, ExpertMode mode = ExpertMode::native) {
  static std::map<std::pair<std::string, ExpertMode>, GenerateResult> cache;
  auto it = cache.find({fixture, mode});
  if (it != cache.end()) return it->second;
  const Checkpoint checkpoint = Checkpoint::open(kFixtures / fixture);
  Loaded whole = load(checkpoint, {}, ModelLoadOptions{mode});
  return cache[{fixture, mode}] = greedy(*whole.model, json_read_file(kFixtures / fixture / "golden.json"));
}

struct Case {
  std::string fixture;
  Split split;
};

class SplitParity : public ::testing::TestWithParam<Case> {};

TEST_P(SplitParity, LogitsWithin1e5AndTheSameGreedyTokens) {
  const Case c = GetParam();
  const nlohmann::json golden = json_read_file(kFixtures / c.fixture / "golden.json");
  const GenerateResult& whole = reference(c.fixture);
  const Checkpoint checkpoint = Checkpoint::open(kFixtures / c.fixture);
  Loaded split = load(checkpoint, c.split);
  const GenerateResult result = greedy(*split.model, golden);
  const double diff = max_abs_diff(result.prompt_logits, whole.prompt_logits);
  EXPECT_LT(diff, 1e-5) << c.fixture << " " << split_name(c.split);
  RecordProperty("max_abs_logit_diff", fmt::format("{:.2e}", diff));
  EXPECT_EQ(result.output_ids, whole.output_ids) << c.fixture << " " << split_name(c.split);
  if (golden.value("robust", true)) {
    EXPECT_EQ(result.output_ids, golden["greedy_ids"].get<std::vector<int32_t>>());
  }
}

std::vector<Case> split_cases() {
  std::vector<Case> cases;
  for (const char* fixture : {"qwen3_moe", "deepseek_v3", "deepseek_v3_plainq", "glm4_moe", "mixtral", "glm_moe_dsa",
                              "deepseek_v4"})
    for (Split split : {Split{2, false}, Split{4, false}, Split{2, true}}) cases.push_back({fixture, split});
  // Quantized checkpoints: FP8-block dense parts (whole 128-blocks, or inside one) and decoded NVFP4 / MXFP4.
  for (const char* fixture : {"deepseek_v3_fp8", "qwen3_moe_nvfp4", "mixtral_mxfp4", "deepseek_v4_mxfp4"})
    cases.push_back({fixture, Split{2, false}});
  cases.push_back({"deepseek_v3", Split{4, true}});  // decode rows: ranks with no rows of their own
  // The hub's config styles: GLM-5 with an indexer in every layer, DeepSeek-V4 with hash routing.
  for (const char* fixture : {"glm_moe_dsa_b", "deepseek_v4_b"})
    for (Split split : {Split{2, false}, Split{2, true}}) cases.push_back({fixture, split});
  return cases;
}

INSTANTIATE_TEST_SUITE_P(Fixtures, SplitParity, ::testing::ValuesIn(split_cases()),
                         [](const ::testing::TestParamInfo<Case>& info) {
                           return info.param.fixture + "_" + split_name(info.param.split);
                         });

TEST(Parallel, SplitRunsAreDeterministic) {
  const nlohmann::json golden = json_read_file(kFixtures / "deepseek_v3" / "golden.json");
  const Checkpoint checkpoint = Checkpoint::open(kFixtures / "deepseek_v3");
  for (Split split : {Split{2, false}, Split{4, true}}) {
    Loaded a = load(checkpoint, split), b = load(checkpoint, split);
    const GenerateResult first = greedy(*a.model, golden), again = greedy(*a.model, golden);
    const GenerateResult other = greedy(*b.model, golden);
    for (const GenerateResult* r : {&again, &other}) {
      ASSERT_EQ(r->prompt_logits.size(), first.prompt_logits.size());
      EXPECT_EQ(std::memcmp(r->prompt_logits.data(), first.prompt_logits.data(), first.prompt_logits.size() * 4), 0)
          << split_name(split);
      EXPECT_EQ(r->output_ids, first.output_ids);
    }
  }
}

// Several requests of different lengths batched together: prefill chunks and decode rows whose
// counts do not divide among the ranks.
TEST(Parallel, BatchedSequencesGiveTheTokensOfTheWholeModel) {
  const Checkpoint checkpoint = Checkpoint::open(kFixtures / "glm4_moe");
  const auto run = [&](Split split) {
    Loaded l = load(checkpoint, split);
    EngineConfig config;
    config.max_num_batched_tokens = 24;
    config.block_size = 4;
    config.num_blocks = 96;
    config.max_model_len = 64;
    EngineCore engine(*l.model, std::nullopt, config);
    std::map<int64_t, std::vector<int32_t>> tokens;
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
  };
  const auto whole = run({});
  ASSERT_EQ(whole.size(), 5u);
  for (Split split : {Split{2, false}, Split{4, true}}) EXPECT_EQ(run(split), whole) << split_name(split);
}

TEST(Parallel, W2ExpertsHaveOnePackPerRank) {
  const TempDir dir;
  const nlohmann::json golden = json_read_file(kFixtures / "deepseek_v3" / "golden.json");
  const Checkpoint checkpoint = Checkpoint::open(kFixtures / "deepseek_v3");
  const GenerateResult& whole = reference("deepseek_v3", ExpertMode::w2);
  ModelLoadOptions options{ExpertMode::w2};
  options.pack_dir = dir.path();
  std::vector<float> first_logits;
  for (int load_round = 0; load_round < 2; ++load_round) {  // builds the packs, then reuses them
    Loaded split = load(checkpoint, {2, false}, options);
    const GenerateResult result = greedy(*split.model, golden);
    EXPECT_LT(max_abs_diff(result.prompt_logits, whole.prompt_logits), 1e-5);
    EXPECT_EQ(result.output_ids, whole.output_ids);
    if (load_round == 0) first_logits = result.prompt_logits;
    EXPECT_EQ(std::memcmp(first_logits.data(), result.prompt_logits.data(), first_logits.size() * 4), 0);
  }
  for (int r = 0; r < 2; ++r) {
    const PackPaths paths = pack_paths(dir.path(), StoreFormat::w2, r, 2);
    const PackSpec spec = pack_sidecar_read(paths.sidecar);
    EXPECT_EQ(spec.rank, r);
    EXPECT_EQ(spec.world, 2);
    EXPECT_EQ(spec.expert_begin(), 4 * r);
    EXPECT_EQ(spec.expert_count(), 4);
    EXPECT_EQ(std::filesystem::file_size(paths.pack), spec.file_bytes());
  }
  EXPECT_FALSE(std::filesystem::exists(pack_paths(dir.path(), StoreFormat::w2, 0, 1).pack));
}

// Per tensor: the bytes each rank of a 2-way split read from the checkpoint (--experts native, every
// tensor through the weight loader).
std::vector<LoadStats> rank_reads(const Checkpoint& checkpoint, int size) {
  std::vector<LoadStats> stats(static_cast<size_t>(size));
  for (int r = 0; r < size; ++r) {
    auto backend = cpu_backend_create({1, cpu_isa_best()});
    ModelLoadOptions options{ExpertMode::native};
    options.shard = {r, size, false, nullptr};  // loading only: no step runs
    model_load(checkpoint, *backend, &stats[size_t(r)], options);
  }
  return stats;
}

TEST(Parallel, EachRankReadsOnlyItsPartOfTheCheckpoint) {
  for (const char* fixture : {"qwen3_moe", "deepseek_v3", "deepseek_v4"}) {
    const Checkpoint checkpoint = Checkpoint::open(kFixtures / fixture);
    const LoadStats whole = rank_reads(checkpoint, 1)[0];
    const std::vector<LoadStats> ranks = rank_reads(checkpoint, 2);
    const std::regex expert(R"(\.experts\.(\d+)\.)");
    int partitioned = 0, replicated = 0;
    for (const auto& [name, bytes] : whole.read_by_tensor) {
      const HostTensor* tensor = checkpoint.find(name);
      ASSERT_NE(tensor, nullptr) << name;
      EXPECT_EQ(bytes, tensor->bytes) << fixture << ": the whole model reads " << name << " once, whole";
      const uint64_t r0 = ranks[0].read_by_tensor.count(name) ? ranks[0].read_by_tensor.at(name) : 0;
      const uint64_t r1 = ranks[1].read_by_tensor.count(name) ? ranks[1].read_by_tensor.at(name) : 0;
      std::smatch m;
      if (std::regex_search(name, m, expert)) {  // routed experts 0-3 on rank 0, 4-7 on rank 1
        const bool first = std::stoi(m[1]) < 4;
        EXPECT_EQ(r0, first ? bytes : 0) << name;
        EXPECT_EQ(r1, first ? 0 : bytes) << name;
        ++partitioned;
      } else if (r0 == bytes && r1 == bytes) {  // norms, routers, MLA's latent projections, ...
        EXPECT_TRUE(name.find("proj") == std::string::npos || name.find("_a_") != std::string::npos ||
                    name.find("wkv") != std::string::npos || name.find("wq_a") != std::string::npos ||
                    name.find("indexer") != std::string::npos || name.find("compressor") != std::string::npos ||
                    name.find("mtp") != std::string::npos)
            << fixture << ": " << name << " is read whole by both ranks";
        ++replicated;
      } else {
        EXPECT_EQ(r0 + r1, bytes) << fixture << ": " << name << " is split";
        EXPECT_TRUE(r0 > 0 && r1 > 0 && r0 < bytes) << name;
        ++partitioned;
      }
    }
    EXPECT_GT(partitioned, 10) << fixture;
    EXPECT_GT(replicated, 3) << fixture;
    // What stays whole (norms, routers, latent projections; DeepSeek-V4's compressors, indexers and
    // hyper-connections) is a large share of these tiny models: each rank reads 55-65% of them.
    for (const LoadStats& rank : ranks) EXPECT_LT(double(rank.bytes_read), 0.66 * double(whole.bytes_read)) << fixture;
    RecordProperty(std::string(fixture) + "_bytes_read", fmt::format("{} whole, {} and {} per rank", whole.bytes_read,
                                                                     ranks[0].bytes_read, ranks[1].bytes_read));
  }
}

// A forward whose token is outside the vocabulary fails on every rank inside the step (some ranks
// may already wait in a collective); the error is the step's own, and the next steps run.
TEST(Parallel, AFailedStepLeavesTheModelUsable) {
  const nlohmann::json golden = json_read_file(kFixtures / "mixtral" / "golden.json");
  const Checkpoint checkpoint = Checkpoint::open(kFixtures / "mixtral");
  Loaded split = load(checkpoint, {2, true});
  const KvLayerSpec spec = split.model->kv_layer_specs().front();
  KvCache cache = split.model->kv_cache_create(split.model->kv_layer_specs(), 4, 4);
  ASSERT_EQ(cache.ranks.size(), 1u);
  EXPECT_EQ(cache.ranks[0].layers.size(), cache.layers.size());
  EXPECT_EQ(spec.heads, 1);  // 2 KV heads over 2 ranks
  const std::vector<int32_t> table = {0};
  ForwardBatch batch;
  batch.tokens = {3, 100000};
  batch.positions = {0, 1};
  batch.row_seq = {0, 0};
  batch.slots = {0, 1};
  batch.block_tables = {table.data()};
  batch.logit_rows = {1};
  try {
    split.model->forward(batch, cache);
    FAIL() << "a token outside the vocabulary ran";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("token id 100000 outside the vocabulary"), std::string::npos) << e.what();
  }
  EXPECT_EQ(greedy(*split.model, golden).output_ids, reference("mixtral").output_ids);
}

// The message parallel_check gives for `fixture`'s config with `changes`, split as `split`.
std::string refusal(const std::string& fixture, const nlohmann::json& changes, Split split) {
  nlohmann::json config = json_read_file(kFixtures / fixture / "config.json");
  config.merge_patch(changes);
  try {
    parallel_check(model_config_parse(config), ParallelConfig{split.size, split.expert_parallel});
  } catch (const Error& e) {
    return e.what();
  }
  return "accepted";
}

TEST(Parallel, ImpossibleSplitsAreRefused) {
  EXPECT_EQ(refusal("qwen3_moe", nlohmann::json::object(), {3, false}),
            "--tensor-parallel-size 3: the 4 attention heads and 2 KV heads cannot be split (the heads must be "
            "divisible by it, and the KV heads divisible by it or dividing it)");
  EXPECT_EQ(refusal("qwen3_moe", nlohmann::json::object(), {16, false}),
            "--tensor-parallel-size 16 exceeds the 8 routed experts of qwen3_moe (each rank holds a part of them)");
  EXPECT_EQ(refusal("glm_moe_dsa", nlohmann::json::object(), {8, false}),
            "--tensor-parallel-size 8 exceeds the 4 routed experts of glm_moe_dsa (each rank holds a part of them)");
  EXPECT_EQ(refusal("deepseek_v3", nlohmann::json::object(), {3, false}),
            "--tensor-parallel-size 3: the 4 attention heads are not divisible by it");
  EXPECT_EQ(refusal("deepseek_v4", {{"num_attention_heads", 6}, {"o_groups", 2}}, {3, false}),
            "--tensor-parallel-size 3: the 6 attention heads in 2 output groups cannot be split");
  EXPECT_EQ(refusal("mixtral", nlohmann::json::object(), {1, true}),
            "--enable-expert-parallel partitions the experts over the --tensor-parallel-size ranks: give a size of 2 "
            "or more");
  // 2 KV heads over 4 ranks: each held twice.
  EXPECT_EQ(refusal("mixtral", nlohmann::json::object(), {4, true}), "accepted");
  ModelLoadOptions options;
  options.load_mtp = true;
  EXPECT_THROW(parallel_check(options, ParallelConfig{2, false}), Error);
  options.load_mtp = false;
  options.tiering = TieringConfig{};
  try {
    parallel_check(options, ParallelConfig{2, false});
    FAIL() << "the expert cache was accepted on a split model";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("--expert-cache-gb"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace moet
