// The forward returns the confidence (the gate's signals) of the logit rows a batch asks for,
// equal to the kernel's (kernels/cpu/logit_confidence.h) on the whole logit rows, also when the
// step returns only its best logits; the logits are those of a batch that asks for none.
#include "../cpu_isa_env.h"
#include "backend/cpu/cpu_backend.h"
#include "io/checkpoint.h"
#include "kernels/cpu/logit_confidence.h"
#include "models/model.h"

#include <gtest/gtest.h>

#include <cstring>

namespace moet {
namespace {

TEST(Forward, ReturnsTheConfidenceOfTheRowsAskedFor) {
  const Checkpoint checkpoint = Checkpoint::open(std::filesystem::path(MOET_SOURCE_DIR) / "models" / "tiny");
  std::unique_ptr<Backend> backend = cpu_backend_create({2, test_cpu_isa()});
  std::unique_ptr<Model> model = model_load(checkpoint, *backend);
  const std::vector<int32_t> ids = {5, 900, 17, 4000, 33, 8000};
  const int64_t vocab = model->config().vocab_size;
  KvCache cache = kv_cache_create(*backend, model->kv_layer_specs(), 1, 16);
  const int32_t block = 0;
  ForwardBatch batch;
  batch.tokens = ids;
  for (int32_t i = 0; i < 6; ++i) {
    batch.positions.push_back(i);
    batch.row_seq.push_back(0);
    batch.slots.push_back(i);
  }
  batch.block_tables = {&block};
  batch.logit_rows = {1, 3, 5};
  const StepOutput plain = model->forward(batch, cache);
  batch.confidence_rows = {2, 0};
  const StepOutput judged = model->forward(batch, cache);
  ASSERT_EQ(plain.logits.size(), judged.logits.size());
  EXPECT_EQ(0, std::memcmp(plain.logits.data(), judged.logits.data(), plain.logits.size() * sizeof(float)));
  EXPECT_TRUE(plain.confidence.empty());
  std::vector<float> want(6);
  logit_confidence(plain.logits.data(), 3, vocab, want.data());
  ASSERT_EQ(judged.confidence.size(), 4u);
  EXPECT_EQ(judged.confidence[0], want[4]);  // logit row 2
  EXPECT_EQ(judged.confidence[1], want[5]);
  EXPECT_EQ(judged.confidence[2], want[0]);  // logit row 0
  EXPECT_EQ(judged.confidence[3], want[1]);
  batch.top_k = 4;  // only the best logits: the confidence still comes from the whole rows
  const StepOutput top = model->forward(batch, cache);
  ASSERT_EQ(top.confidence.size(), 4u);
  EXPECT_EQ(0, std::memcmp(top.confidence.data(), judged.confidence.data(), 4 * sizeof(float)));
}

}  // namespace
}  // namespace moet
