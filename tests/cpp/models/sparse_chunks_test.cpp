// GLM-5's indexer and DeepSeek-V4's compressors keep their state in the paged KV caches only, so a
// sequence run in chunks (a chunked prefill: each chunk attends over keys, indexer keys, compressor
// states and compressed entries the earlier ones wrote, across block boundaries and compression
// windows) gives every position the bits of one chunk over the whole sequence (memcmp), for every
// fixture of the two families, with several chunk sizes and in a bf16 cache too.
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

}  // namespace
}  // namespace moet
