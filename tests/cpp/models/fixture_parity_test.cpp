// Parity with HF transformers on the tiny fixtures (tests/fixtures/*, written by
// tools/fixtures/make_fixtures.py, make_sparse_fixtures.py (GLM-5, DeepSeek-V4: prompts longer than
// their indexers' top-k and DeepSeek-V4's sliding window) and make_quantized_fixtures.py): last-prompt-position logits
// within 1e-3 of the FP32 golden and the 16-token greedy continuation identical, on the CPU
// backend (AVX2 and scalar paths; 1 to 3 threads), for every way experts can be stored:
//   native  golden.json       (BF16 weights; FP8 / NVFP4 / MXFP4 checkpoints decoded)
//   w2      golden_w2.json    (routed experts replaced by their W2 values, zero mode auto)
//   fp4     golden_fp4.json   (routed experts replaced by their MXFP4 values)
// Goldens whose greedy steps or expert choices are near ties are marked "robust": false by the
// fixture tool; for those only the logits are compared.
#include "../cpu_isa_env.h"
#include "backend/cpu/cpu_backend.h"
#include "engine/generator.h"
#include "io/checkpoint.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <cmath>

namespace moet {
namespace {

const std::filesystem::path kFixtures = std::filesystem::path(MOET_SOURCE_DIR) / "tests" / "fixtures";

struct Case {
  std::string fixture;
  ExpertMode mode;
  int threads;
};

std::string golden_file(ExpertMode mode) {
  return mode == ExpertMode::native ? "golden.json" : std::string("golden_") + expert_mode_name(mode) + ".json";
}

class FixtureParity : public ::testing::TestWithParam<Case> {};

TEST_P(FixtureParity, LogitsAndGreedyMatchTransformers) {
  const Case c = GetParam();
  const auto dir = kFixtures / c.fixture;
  const nlohmann::json golden = json_read_file(dir / golden_file(c.mode));
  const Checkpoint checkpoint = Checkpoint::open(dir);
  auto backend = cpu_backend_create({c.threads, test_cpu_isa()});
  ModelLoadOptions options;
  options.experts = c.mode;
  auto model = model_load(checkpoint, *backend, nullptr, options);
  GenerateOptions generate_options;
  generate_options.max_tokens = int64_t(golden["greedy_ids"].size());
  generate_options.block_size = 4;  // several blocks per sequence, so the block table is exercised
  const auto prompt = golden["prompt_ids"].get<std::vector<int32_t>>();
  const GenerateResult result = generate(*model, prompt, generate_options);
  const auto expected = golden["logits_last"].get<std::vector<float>>();
  ASSERT_EQ(result.prompt_logits.size(), expected.size());
  double max_diff = 0.0;
  for (size_t i = 0; i < expected.size(); ++i)
    max_diff = std::max(max_diff, std::fabs(double(result.prompt_logits[i]) - double(expected[i])));
  EXPECT_LT(max_diff, 1e-3) << c.fixture;
  RecordProperty("max_abs_logit_diff", std::to_string(max_diff));
  if (golden.value("robust", true)) {
    EXPECT_EQ(result.output_ids, golden["greedy_ids"].get<std::vector<int32_t>>()) << c.fixture;
  }
}

std::vector<Case> all_cases() {
  std::vector<Case> cases;
  int threads = 1;
  for (const char* fixture : {"qwen3_moe", "deepseek_v3", "deepseek_v3_plainq", "glm4_moe", "mixtral", "glm_moe_dsa",
                              "glm_moe_dsa_b", "deepseek_v4", "deepseek_v4_b"})
    for (ExpertMode mode : {ExpertMode::native, ExpertMode::w2, ExpertMode::fp4})
      cases.push_back({fixture, mode, threads++ % 3 + 1});
  for (const char* fixture : {"deepseek_v3_fp8", "qwen3_moe_nvfp4", "mixtral_mxfp4", "deepseek_v4_mxfp4"})
    for (ExpertMode mode : {ExpertMode::native, ExpertMode::w2}) cases.push_back({fixture, mode, threads++ % 3 + 1});
  return cases;
}

INSTANTIATE_TEST_SUITE_P(AllFixtures, FixtureParity, ::testing::ValuesIn(all_cases()),
                         [](const ::testing::TestParamInfo<Case>& info) {
                           return info.param.fixture + "_" + expert_mode_name(info.param.mode) + "_t" +
                                  std::to_string(info.param.threads);
                         });

}  // namespace
}  // namespace moet
