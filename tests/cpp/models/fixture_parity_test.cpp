// Parity with HF transformers on the tiny fixtures (tests/fixtures/*, written by
// tools/fixtures/make_fixtures.py): last-prompt-position logits within 1e-3 of the FP32 golden
// and the 16-token greedy continuation identical, on the CPU backend (AVX2 and scalar paths,
// 1 and 3 threads).
#include "backend/cpu/cpu_backend.h"
#include "engine/generator.h"
#include "io/checkpoint.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <cmath>
#include <cstdlib>
#include <fstream>

namespace moet {
namespace {

const std::filesystem::path kFixtures = std::filesystem::path(MOET_SOURCE_DIR) / "tests" / "fixtures";

struct Case {
  std::string fixture;
  int threads;
};

class FixtureParity : public ::testing::TestWithParam<Case> {};

TEST_P(FixtureParity, LogitsAndGreedyMatchTransformers) {
  const Case c = GetParam();
  const auto dir = kFixtures / c.fixture;
  const nlohmann::json golden = json_read_file(dir / "golden.json");
  const Checkpoint checkpoint = Checkpoint::open(dir);
  auto backend = cpu_backend_create(c.threads);
  auto model = model_load(checkpoint, *backend);
  GenerateOptions options;
  options.max_tokens = int64_t(golden["greedy_ids"].size());
  options.block_size = 4;  // several blocks per sequence, so the block table is exercised
  const auto prompt = golden["prompt_ids"].get<std::vector<int32_t>>();
  const GenerateResult result = generate(*model, prompt, options);
  const auto expected = golden["logits_last"].get<std::vector<float>>();
  ASSERT_EQ(result.prompt_logits.size(), expected.size());
  double max_diff = 0.0;
  for (size_t i = 0; i < expected.size(); ++i)
    max_diff = std::max(max_diff, std::fabs(double(result.prompt_logits[i]) - double(expected[i])));
  EXPECT_LT(max_diff, 1e-3) << c.fixture;
  RecordProperty("max_abs_logit_diff", std::to_string(max_diff));
  EXPECT_EQ(result.output_ids, golden["greedy_ids"].get<std::vector<int32_t>>()) << c.fixture;
}

INSTANTIATE_TEST_SUITE_P(
    AllFixtures, FixtureParity,
    ::testing::Values(Case{"qwen3_moe", 1}, Case{"qwen3_moe", 3}, Case{"deepseek_v3", 1},
                      Case{"deepseek_v3", 3}, Case{"deepseek_v3_plainq", 2}, Case{"glm4_moe", 1},
                      Case{"glm4_moe", 3}, Case{"mixtral", 1}, Case{"mixtral", 2}),
    [](const ::testing::TestParamInfo<Case>& info) {
      return info.param.fixture + "_t" + std::to_string(info.param.threads);
    });

}  // namespace
}  // namespace moet
