// Teacher-forced scoring (engine/scorer.h) one position per decode step gives the same logits,
// bit for bit, as scoring in chunks (the CPU kernels compute every row on its own), on models/tiny.
#include "../cpu_isa_env.h"
#include "backend/cpu/cpu_backend.h"
#include "engine/scorer.h"
#include "engine/sequence_batch.h"
#include "io/checkpoint.h"

#include <gtest/gtest.h>

#include <cstring>

namespace moet {
namespace {

struct Tiny {
  Checkpoint checkpoint = Checkpoint::open(std::filesystem::path(MOET_SOURCE_DIR) / "models" / "tiny");
  std::unique_ptr<Backend> backend = cpu_backend_create({2, test_cpu_isa()});
  std::unique_ptr<Model> model = model_load(checkpoint, *backend);
};

std::vector<int32_t> ids_for(const Model& model, int64_t n) {
  std::vector<int32_t> ids;
  for (int64_t i = 0; i < n; ++i) ids.push_back(int32_t((i * 131 + 17) % model.config().vocab_size));
  return ids;
}

TEST(Scorer, DecodeStepsGiveTheChunkedLogits) {
  Tiny t;
  const std::vector<int32_t> ids = ids_for(*t.model, 24);
  const ScoreResult chunked = score(*t.model, ids, true, 7);
  const ScoreResult stepped = score(*t.model, ids, true, 7, 16, std::nullopt, true);
  ASSERT_EQ(chunked.logits.size(), stepped.logits.size());
  EXPECT_EQ(0, std::memcmp(chunked.logits.data(), stepped.logits.data(), chunked.logits.size() * sizeof(float)));
  EXPECT_EQ(chunked.token_logprobs, stepped.token_logprobs);
}

}  // namespace
}  // namespace moet
