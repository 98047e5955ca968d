// The MTP layer (models/mtp.h) on the deepseek_v3 and glm_moe_dsa fixtures, whose layer 3 is an MTP
// module: its logits over a whole sequence (one draft step of T - 1 rows reading the target's hidden
// states) match the float64 golden (deepseek_v3: tools/fixtures/mtp_golden.py's NumPy, the formula
// tools/train trains; glm_moe_dsa: glm_mtp_golden.py, transformers' GLM-5 decoder layer with its DSA
// indexer over a sequence longer than index_topk) to 1e-3 and its argmax at every position; the
// layer adds its KV specs (GLM-5: the latent and the indexer's keys); W2 experts read from a pack
// (which holds only the decoder's layers) give the same MTP logits as experts quantized at load;
// and asking for the MTP layer of a checkpoint without one is a one-line error.
#include "../cpu_isa_env.h"
#include "../temp_dir.h"
#include "backend/cpu/cpu_backend.h"
#include "core/error.h"
#include "engine/sequence_batch.h"
#include "engine/sampler.h"
#include "io/checkpoint.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <cmath>
#include <cstring>

namespace moet {
namespace {

const std::filesystem::path kFixtures = std::filesystem::path(MOET_SOURCE_DIR) / "tests" / "fixtures";

std::unique_ptr<Model> load(const Checkpoint& checkpoint, Backend& backend, ExpertMode mode,
                            const std::filesystem::path& pack_dir = {}) {
  ModelLoadOptions options;
  options.experts = mode;
  options.load_mtp = true;
  options.pack_dir = pack_dir;
  return model_load(checkpoint, backend, nullptr, options);
}

// The MTP logits [T - 1, vocab] over `ids`: the target's hidden states of every position, then one
// draft step over positions 0 .. T - 2 (each reading the next token).
std::vector<float> mtp_logits(Model& model, const std::vector<int32_t>& ids) {
  const int64_t length = int64_t(ids.size());
  SequenceBatch sequences(model, 1, length, 4);
  Sequence& seq = sequences.sequence(0);
  seq.tokens = ids;
  StepPlan target;
  target.chunks.push_back({&seq, 0, length, ChunkRows::none, ChunkRows::all});
  target.num_tokens = length;
  const std::vector<float> hidden = sequences.runner().run(target).output.hidden;
  EXPECT_EQ(hidden.size(), size_t(length * model.config().hidden_size));
  const std::vector<float> inputs(hidden.begin(), hidden.end() - model.config().hidden_size);
  StepPlan draft;
  draft.chunks.push_back({&seq, 0, length - 1, ChunkRows::all});
  draft.num_tokens = length - 1;
  draft.mtp_hidden = &inputs;
  return sequences.runner().run(draft).output.logits;
}

class MtpFormula : public ::testing::TestWithParam<std::pair<std::string, size_t>> {};

TEST_P(MtpFormula, LogitsMatchTheGolden) {
  const auto [fixture, mtp_specs] = GetParam();
  const auto dir = kFixtures / fixture;
  const nlohmann::json golden = json_read_file(dir / "golden_mtp.json");
  const Checkpoint checkpoint = Checkpoint::open(dir);
  auto backend = cpu_backend_create({2, test_cpu_isa()});
  auto model = load(checkpoint, *backend, ExpertMode::native);
  ASSERT_TRUE(model->has_mtp());
  const size_t main_specs = model_load(checkpoint, *backend, nullptr, ModelLoadOptions{})->kv_layer_specs().size();
  EXPECT_EQ(model->kv_layer_specs().size(), main_specs + mtp_specs);
  const auto ids = golden["token_ids"].get<std::vector<int32_t>>();
  const std::vector<float> logits = mtp_logits(*model, ids);
  const int64_t vocab = model->config().vocab_size;
  ASSERT_EQ(logits.size(), (ids.size() - 1) * size_t(vocab));
  const auto argmaxes = golden["mtp_argmax"].get<std::vector<int32_t>>();
  for (size_t p = 0; p + 1 < ids.size(); ++p)
    EXPECT_EQ(argmax(logits.data() + p * size_t(vocab), vocab), argmaxes[p]) << "position " << p;
  const auto rows = golden["mtp_logits_rows"].get<std::vector<int64_t>>();
  const auto expected = golden["mtp_logits"].get<std::vector<std::vector<float>>>();
  double max_diff = 0.0;
  for (size_t r = 0; r < rows.size(); ++r)
    for (int64_t v = 0; v < vocab; ++v) {
      const double got = logits[size_t(rows[r] * vocab + v)];
      max_diff = std::max(max_diff, std::fabs(got - double(expected[r][size_t(v)])));
    }
  EXPECT_LT(max_diff, 1e-3);
  RecordProperty("max_abs_logit_diff", std::to_string(max_diff));
}

INSTANTIATE_TEST_SUITE_P(Fixtures, MtpFormula,
                         ::testing::Values(std::pair<std::string, size_t>{"deepseek_v3", 1},
                                           std::pair<std::string, size_t>{"glm_moe_dsa", 2}),
                         [](const auto& info) { return info.param.first; });

TEST(Mtp, PackedExpertsGiveTheSameDrafts) {
  const auto dir = kFixtures / "deepseek_v3";
  const auto ids = json_read_file(dir / "golden_mtp.json")["token_ids"].get<std::vector<int32_t>>();
  const Checkpoint checkpoint = Checkpoint::open(dir);
  auto backend = cpu_backend_create({2, test_cpu_isa()});
  const std::vector<float> quantized = mtp_logits(*load(checkpoint, *backend, ExpertMode::w2), ids);
  TempDir packs;
  const std::vector<float> packed = mtp_logits(*load(checkpoint, *backend, ExpertMode::w2, packs.path()), ids);
  ASSERT_EQ(quantized.size(), packed.size());
  EXPECT_EQ(std::memcmp(quantized.data(), packed.data(), quantized.size() * sizeof(float)), 0);
}

TEST(Mtp, CheckpointsWithoutAnMtpLayerAreRefused) {
  auto backend = cpu_backend_create({1, test_cpu_isa()});
  // qwen3_moe has no next-n layers; deepseek_v3_plainq declares one in config.json but ships no tensors.
  for (const char* fixture : {"qwen3_moe", "deepseek_v3_plainq"}) {
    const Checkpoint checkpoint = Checkpoint::open(kFixtures / fixture);
    try {
      load(checkpoint, *backend, ExpertMode::native);
      ADD_FAILURE() << fixture << " loaded an MTP layer";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("has no MTP layer"), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find(fixture), std::string::npos) << e.what();
    }
  }
  const Checkpoint checkpoint = Checkpoint::open(kFixtures / "deepseek_v3");
  auto model = model_load(checkpoint, *backend, nullptr, ModelLoadOptions{ExpertMode::native});
  EXPECT_FALSE(model->has_mtp());
  EXPECT_EQ(model->kv_layer_specs().size(), size_t(model->config().num_hidden_layers));
}

}  // namespace
}  // namespace moet
