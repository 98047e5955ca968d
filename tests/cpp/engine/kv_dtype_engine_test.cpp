// The KV cache dtypes through the engine, on the MLA (deepseek_v3) and GQA (qwen3_moe) fixtures:
// for every dtype, chunked prefill + prefix caching + preemption by recompute give the tokens that
// one request at a time without them gives (same dtype); the quantized caches really change the
// logits (so the comparison is not of the F32 path with itself), the more the coarser, and the
// scorer's reference run is the F32 cache's, bit for bit; a smaller dtype makes the pool
// hold proportionally more tokens in the same budget; max_model_len is accepted when the pool holds
// one full sequence and refused (or, by default, lowered) with the numbers otherwise.
#include "../cpu_isa_env.h"
#include "backend/cpu/cpu_backend.h"
#include "core/error.h"
#include "engine/engine_core.h"
#include "engine/scorer.h"
#include "io/checkpoint.h"

#include <gtest/gtest.h>

#include <map>
#include <string>

namespace moet {
namespace {

const std::filesystem::path kFixtures = std::filesystem::path(MOET_SOURCE_DIR) / "tests" / "fixtures";

struct Loaded {
  explicit Loaded(const std::string& name) : checkpoint(Checkpoint::open(kFixtures / name)) {
    model = model_load(checkpoint, *backend, nullptr, ModelLoadOptions{ExpertMode::native});
  }
  Checkpoint checkpoint;
  std::unique_ptr<Backend> backend = cpu_backend_create({2, test_cpu_isa()});
  std::unique_ptr<Model> model;
};

Model& fixture(const std::string& name) {
  static std::map<std::string, std::unique_ptr<Loaded>> models;
  auto& slot = models[name];
  if (!slot) slot = std::make_unique<Loaded>(name);
  return *slot->model;
}

// Sets a model's KV dtype for one scope (the fixtures are shared by the tests of this binary).
struct KvDtypeScope {
  KvDtypeScope(Model& m, KvDtype dtype) : model(m) { model.set_kv_cache_dtype(dtype); }
  ~KvDtypeScope() { model.set_kv_cache_dtype(KvDtype::f32); }
  Model& model;
};

EngineConfig config(int64_t budget, int64_t blocks, bool caching) {
  EngineConfig c;
  c.max_num_batched_tokens = budget;
  c.block_size = 4;
  c.num_blocks = blocks;
  c.enable_prefix_caching = caching;
  c.max_model_len = 96;
  return c;
}

// Eight greedy requests sharing an 8-token prefix, prompts of 13 to 34 tokens, 10 tokens each.
std::vector<RequestParams> requests() {
  std::vector<RequestParams> out;
  for (int i = 0; i < 8; ++i) {
    RequestParams p;
    p.prompt = {5, 6, 7, 8, 9, 10, 11, 12};
    for (int k = 0; k < 5 + 3 * i; ++k) p.prompt.push_back(int32_t((i * 37 + k * 11) % 500 + 3));
    p.max_tokens = 10;
    out.push_back(p);
  }
  return out;
}

std::map<int64_t, std::vector<int32_t>> run(EngineCore& engine, const std::vector<RequestParams>& requests) {
  std::map<int64_t, std::vector<int32_t>> out;
  for (size_t i = 0; i < requests.size(); ++i)
    engine.add(int64_t(i), requests[i], [&out, i](RequestOutput&& o) {
      out[int64_t(i)].insert(out[int64_t(i)].end(), o.token_ids.begin(), o.token_ids.end());
    });
  while (engine.has_work()) engine.step();
  return out;
}

struct DtypeCase {
  std::string fixture;
  KvDtype dtype;
};

class KvDtypeEngine : public ::testing::TestWithParam<DtypeCase> {};

TEST_P(KvDtypeEngine, ChunkedPrefillPrefixCachingAndPreemptionAreInvisible) {
  Model& model = fixture(GetParam().fixture);
  const KvDtypeScope scope(model, GetParam().dtype);
  const auto reqs = requests();
  std::map<int64_t, std::vector<int32_t>> expected;
  for (size_t i = 0; i < reqs.size(); ++i) {  // one at a time: one prefill step, no cache reuse, room for all
    EngineCore alone(model, std::nullopt, config(2048, 64, false));
    expected[int64_t(i)] = run(alone, {reqs[i]}).at(0);
  }
  // 12-token steps cut every prompt into chunks; 30 blocks of 4 cannot hold eight requests of up
  // to 44 tokens, so some are preempted and recomputed; the shared prefix comes from the cache.
  EngineCore tight(model, std::nullopt, config(12, 30, true));
  const auto got = run(tight, reqs);
  for (size_t i = 0; i < reqs.size(); ++i) {
    EXPECT_EQ(got.at(int64_t(i)), expected.at(int64_t(i))) << "request " << i;
    EXPECT_EQ(got.at(int64_t(i)).size(), 10u);
  }
  const EngineStats stats = tight.stats();
  EXPECT_GT(stats.preemptions, 0);
  EXPECT_GT(stats.kv.prefix_hits, 0);
  EXPECT_EQ(stats.kv_bytes_per_token, kv_bytes_per_token(model.kv_layer_specs()));
}

INSTANTIATE_TEST_SUITE_P(Dtypes, KvDtypeEngine,
                         ::testing::Values(DtypeCase{"deepseek_v3", KvDtype::bf16},
                                           DtypeCase{"deepseek_v3", KvDtype::fp8_e4m3},
                                           DtypeCase{"deepseek_v3", KvDtype::fp8_e5m2},
                                           DtypeCase{"deepseek_v3", KvDtype::nvfp4},
                                           DtypeCase{"qwen3_moe", KvDtype::bf16},
                                           DtypeCase{"qwen3_moe", KvDtype::fp8_e4m3},
                                           DtypeCase{"qwen3_moe", KvDtype::fp8_e5m2}),
                         [](const auto& info) {
                           return info.param.fixture + "_" + std::string(kv_dtype_name(info.param.dtype));
                         });

TEST(KvDtypeEngineScore, QuantizedCachesChangeTheLogitsAndReportKld) {
  Model& model = fixture("deepseek_v3");
  std::vector<int32_t> ids;
  for (int i = 0; i < 40; ++i) ids.push_back(int32_t((i * 53) % 500 + 3));
  const ScoreResult f32 = score(model, ids, true, 16);
  std::vector<double> klds;
  for (KvDtype dtype : {KvDtype::bf16, KvDtype::fp8_e4m3, KvDtype::nvfp4}) {
    const KvDtypeScope scope(model, dtype);
    const ScoreResult quantized = score(model, ids, true, 16, 16, KvDtype::f32);
    EXPECT_NE(quantized.logits, f32.logits) << kv_dtype_name(dtype);
    EXPECT_EQ(quantized.reference_logprobs, f32.token_logprobs) << "the reference run is the F32 cache's";
    ASSERT_EQ(quantized.kld.size(), ids.size() - 1);
    klds.push_back(quantized.mean_kld());
  }
  // Coarser formats cost more (16-bit, then 8-bit, then 4-bit values).
  EXPECT_GT(klds[0], 0.0);
  EXPECT_LT(klds[0], klds[1]);
  EXPECT_LT(klds[1], klds[2]);
  const ScoreResult same = score(model, ids, false, 16, 16, KvDtype::f32);  // an F32 cache against itself
  EXPECT_EQ(same.mean_kld(), 0.0);
  EXPECT_EQ(same.top1_agree, int64_t(ids.size()) - 1);
}

TEST(KvDtypeEngineCapacity, SmallerDtypesHoldMoreTokensInTheSameBudget) {
  Model& model = fixture("deepseek_v3");
  std::map<KvDtype, int64_t> blocks;
  for (KvDtype dtype : {KvDtype::f32, KvDtype::bf16, KvDtype::fp8_e4m3, KvDtype::nvfp4}) {
    const KvDtypeScope scope(model, dtype);
    EngineConfig c;
    c.block_size = 16;
    c.max_model_len = 128;
    c.max_num_seqs = 1000;
    c.kv_cache_bytes = int64_t(8) << 20;
    blocks[dtype] = engine_config_resolve(model, c).num_blocks;
    EXPECT_EQ(blocks[dtype], c.kv_cache_bytes / (kv_bytes_per_token(model.kv_layer_specs()) * 16));
  }
  // The fixture's latent row is 32 + 16 values: 192, 96, 64 (48 + 8, to 16) and 48 bytes a layer.
  EXPECT_EQ(kv_bytes_per_token(kv_layer_specs_for(model.config(), KvDtype::nvfp4)), 3 * 48);
  EXPECT_GT(blocks[KvDtype::bf16], blocks[KvDtype::f32] * 2 - 2);
  EXPECT_GT(blocks[KvDtype::nvfp4], blocks[KvDtype::fp8_e4m3]);
  EXPECT_GT(blocks[KvDtype::fp8_e4m3], blocks[KvDtype::bf16]);
}

TEST(KvDtypeEngineCapacity, MaxModelLenNeedsOneFullSequenceInThePool) {
  Model& model = fixture("qwen3_moe");
  const int64_t token_bytes = kv_bytes_per_token(model.kv_layer_specs());
  EngineConfig c;
  c.block_size = 16;
  c.kv_cache_bytes = token_bytes * 16 * 10;  // ten blocks: 160 tokens
  c.max_model_len = 160;                     // fits exactly
  EXPECT_EQ(engine_config_resolve(model, c).num_blocks, 10);
  c.max_model_len = 161;
  try {
    engine_config_resolve(model, c);
    ADD_FAILURE() << "a max_model_len the pool cannot hold was accepted";
  } catch (const Error& e) {
    const std::string message = e.what();
    EXPECT_NE(message.find("max_model_len 161 needs 11 KV blocks"), std::string::npos) << message;
    EXPECT_NE(message.find("holds 10 blocks (160 tokens)"), std::string::npos) << message;
  }
  c.max_model_len = 0;  // the model's window (256), lowered to what the budget holds
  const EngineConfig lowered = engine_config_resolve(model, c);
  EXPECT_EQ(lowered.max_model_len, 160);
  EXPECT_EQ(lowered.num_blocks, 10);
  c.kv_cache_bytes = int64_t(1) << 30;  // plenty: the whole window
  EXPECT_EQ(engine_config_resolve(model, c).max_model_len, model.config().max_position_embeddings);
}

TEST(KvDtypeEngineCapacity, Nvfp4IsRefusedForGqaModels) {
  Model& model = fixture("qwen3_moe");
  try {
    model.set_kv_cache_dtype(KvDtype::nvfp4);
    ADD_FAILURE() << "nvfp4 accepted for a GQA model";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("--kv-cache-dtype nvfp4"), std::string::npos) << e.what();
  }
  EXPECT_EQ(model.kv_layer_specs().front().dtype, KvDtype::f32);  // unchanged
}

}  // namespace
}  // namespace moet
