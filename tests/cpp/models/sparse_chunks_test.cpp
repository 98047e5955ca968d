// GLM-5's indexer and DeepSeek-V4's compressors keep their state in the paged KV caches only, so a
// sequence run in chunks (a chunked prefill: each chunk attends over keys, indexer keys, compressor
// states and compressed entries the earlier ones wrote, across block boundaries and compression
// windows) gives every position the bits of one chunk over the whole sequence (memcmp), for every
// fixture of the two families, with several chunk sizes and in a bf16 cache too; and sequences
// decoded together in one step (each reading its own block table, indexer keys and compressor
// state) get the bits each gets decoded alone.
#include "../cpu_isa_env.h"
#include "backend/cpu/cpu_backend.h"
#include "engine/sequence_batch.h"
#include "io/checkpoint.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <cstring>

namespace moet {
namespace {

const std::filesystem::path kFixtures = std::filesystem::path(MOET_SOURCE_DIR) / "tests" / "fixtures";

// Every position's logits of `ids` run in chunks of `chunk` rows (blocks of 4 slots).
std::vector<float> chunked_logits(Model& model, const std::vector<int32_t>& ids, int64_t chunk) {
  const int64_t length = int64_t(ids.size());
  SequenceBatch batch(model, 1, length, 4);
  batch.sequence(0).tokens = ids;
  std::vector<float> logits;
  for (int64_t begin = 0; begin < length; begin += chunk) {
    const StepOutcome out = batch.run_rows(0, begin, std::min(length, begin + chunk), ChunkRows::all);
    logits.insert(logits.end(), out.output.logits.begin(), out.output.logits.end());
  }
  return logits;
}

TEST(SparseChunks, ChunkedPrefillEqualsOneChunk) {
  for (const char* fixture : {"glm_moe_dsa", "glm_moe_dsa_b", "deepseek_v4", "deepseek_v4_b"}) {
    const auto dir = kFixtures / fixture;
    const nlohmann::json golden = json_read_file(dir / "golden.json");
    std::vector<int32_t> ids = golden["prompt_ids"].get<std::vector<int32_t>>();
    for (int32_t id : golden["greedy_ids"].get<std::vector<int32_t>>()) ids.push_back(id);
    const Checkpoint checkpoint = Checkpoint::open(dir);
    auto backend = cpu_backend_create({2, test_cpu_isa()});
    auto model = model_load(checkpoint, *backend, nullptr, ModelLoadOptions{ExpertMode::native});
    for (KvDtype dtype : {KvDtype::f32, KvDtype::bf16}) {
      model->set_kv_cache_dtype(dtype);
      const std::vector<float> whole = chunked_logits(*model, ids, int64_t(ids.size()));
      for (int64_t chunk : {1, 3, 5}) {
        const std::vector<float> pieces = chunked_logits(*model, ids, chunk);
        ASSERT_EQ(pieces.size(), whole.size());
        EXPECT_EQ(std::memcmp(pieces.data(), whole.data(), whole.size() * sizeof(float)), 0)
            << fixture << " chunks of " << chunk << " dtype " << kv_dtype_name(dtype);
      }
    }
  }
}

// Logits of the decode steps of `ids` (prefill of `prompt` tokens, then one row per step) for each
// of `sequences` sequences decoded together; sequence s reads ids rotated by s.
std::vector<std::vector<float>> batched_decode(Model& model, const std::vector<int32_t>& ids, int64_t prompt,
                                               int64_t sequences) {
  const int64_t length = int64_t(ids.size()), vocab = model.config().vocab_size;
  SequenceBatch batch(model, sequences, length, 4);
  for (int64_t s = 0; s < sequences; ++s) {
    for (int64_t i = 0; i < length; ++i) batch.sequence(s).tokens.push_back(ids[size_t((i + s) % length)]);
    batch.run_rows(s, 0, prompt, ChunkRows::none);
  }
  std::vector<std::vector<float>> logits(static_cast<size_t>(sequences));
  for (int64_t pos = prompt; pos < length; ++pos) {
    const std::vector<float> step = batch.decode(pos).output.logits;
    for (int64_t s = 0; s < sequences; ++s)
      logits[size_t(s)].insert(logits[size_t(s)].end(), step.begin() + s * vocab, step.begin() + (s + 1) * vocab);
  }
  return logits;
}

TEST(SparseChunks, BatchedDecodeEqualsEachSequenceAlone) {
  for (const char* fixture : {"glm_moe_dsa", "deepseek_v4"}) {
    const auto dir = kFixtures / fixture;
    const nlohmann::json golden = json_read_file(dir / "golden.json");
    std::vector<int32_t> ids = golden["prompt_ids"].get<std::vector<int32_t>>();
    const int64_t prompt = int64_t(ids.size());
    for (int32_t id : golden["greedy_ids"].get<std::vector<int32_t>>()) ids.push_back(id);
    const Checkpoint checkpoint = Checkpoint::open(dir);
    auto backend = cpu_backend_create({2, test_cpu_isa()});
    auto model = model_load(checkpoint, *backend, nullptr, ModelLoadOptions{ExpertMode::native});
    const auto together = batched_decode(*model, ids, prompt, 3);
    for (int64_t s = 0; s < 3; ++s) {
      std::vector<int32_t> rotated;
      for (size_t i = 0; i < ids.size(); ++i) rotated.push_back(ids[(i + size_t(s)) % ids.size()]);
      const auto alone = batched_decode(*model, rotated, prompt, 1);
      ASSERT_EQ(alone[0].size(), together[size_t(s)].size());
      EXPECT_EQ(std::memcmp(alone[0].data(), together[size_t(s)].data(), alone[0].size() * sizeof(float)), 0)
          << fixture << " sequence " << s;
    }
  }
}

}  // namespace
}  // namespace moet
