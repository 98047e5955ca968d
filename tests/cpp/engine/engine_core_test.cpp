// EngineCore on a real fixture model: batching is invisible (16 concurrent greedy requests, mixed
// prefill chunks and decode rows, give the same tokens as one at a time, also when a small KV pool
// forces preemption by recompute), prefix caching gives the same tokens, seeded sampling is
// reproducible, stop ids / max_tokens finish correctly and abort frees every block; sampling from
// the rows' best logits gives the tokens sampling from whole rows gives, and steps with a row that
// needs the whole row fall back to it.
#include "../cpu_isa_env.h"
#include "backend/cpu/cpu_backend.h"
#include "core/error.h"
#include "engine/engine_core.h"
#include "io/checkpoint.h"

#include <gtest/gtest.h>

#include <functional>
#include <map>

namespace moet {
namespace {

const std::filesystem::path kFixture = std::filesystem::path(MOET_SOURCE_DIR) / "tests" / "fixtures" / "deepseek_v3";

struct Loaded {
  Checkpoint checkpoint = Checkpoint::open(kFixture);
  std::unique_ptr<Backend> backend = cpu_backend_create({2, test_cpu_isa()});
  // Experts as stored (the expert formats have their own tests; batching must hold for any format).
  std::unique_ptr<Model> model = model_load(checkpoint, *backend, nullptr, ModelLoadOptions{ExpertMode::native});
};

Loaded& loaded() {
  static Loaded l;
  return l;
}

RequestParams request(int i, int64_t max_tokens = 12) {
  RequestParams p;
  for (int k = 0; k < 5 + 3 * i; ++k) p.prompt.push_back(int32_t((i * 37 + k * 11) % 500 + 3));
  p.max_tokens = max_tokens;
  return p;
}

struct Collected {
  std::vector<int32_t> tokens;
  std::string finish_reason;
};

// Runs all requests to completion on one engine, adding them all at once.
std::map<int64_t, Collected> run(EngineCore& engine, const std::vector<RequestParams>& requests) {
  std::map<int64_t, Collected> out;
  for (size_t i = 0; i < requests.size(); ++i) {
    engine.add(int64_t(i), requests[i], [&out, i](RequestOutput&& o) {
      auto& c = out[int64_t(i)];
      c.tokens.insert(c.tokens.end(), o.token_ids.begin(), o.token_ids.end());
      if (o.finished) c.finish_reason = o.finish_reason;
    });
  }
  while (engine.has_work()) engine.step();
  return out;
}

EngineConfig config(int64_t budget, int64_t blocks, bool caching) {
  EngineConfig c;
  c.max_num_batched_tokens = budget;
  c.block_size = 4;
  c.num_blocks = blocks;
  c.enable_prefix_caching = caching;
  c.max_model_len = 128;
  return c;
}

std::vector<RequestParams> sixteen() {
  std::vector<RequestParams> r;
  for (int i = 0; i < 16; ++i) r.push_back(request(i));
  return r;
}

std::map<int64_t, Collected> one_by_one(const std::vector<RequestParams>& requests) {
  std::map<int64_t, Collected> out;
  for (size_t i = 0; i < requests.size(); ++i) {
    EngineCore engine(*loaded().model, std::nullopt, config(2048, 64, false));
    out[int64_t(i)] = run(engine, {requests[i]}).at(0);
  }
  return out;
}

TEST(EngineCore, BatchingIsInvisible) {
  const auto requests = sixteen();
  const auto expected = one_by_one(requests);
  EngineCore batched(*loaded().model, std::nullopt, config(24, 512, false));
  const auto got = run(batched, requests);
  for (int64_t i = 0; i < 16; ++i) {
    EXPECT_EQ(got.at(i).tokens, expected.at(i).tokens) << "request " << i;
    EXPECT_EQ(got.at(i).finish_reason, "length");
    EXPECT_EQ(got.at(i).tokens.size(), 12u);
  }
}

TEST(EngineCore, PreemptionAndPrefixCachingAreInvisible) {
  auto requests = sixteen();
  for (auto& r : requests) r.prompt.insert(r.prompt.begin(), {5, 6, 7, 8, 9, 10, 11, 12});  // shared prefix
  const auto expected = one_by_one(requests);
  EngineCore tight(*loaded().model, std::nullopt, config(64, 40, true));
  const auto got = run(tight, requests);
  for (int64_t i = 0; i < 16; ++i) EXPECT_EQ(got.at(i).tokens, expected.at(i).tokens) << "request " << i;
  const EngineStats stats = tight.stats();
  EXPECT_GT(stats.preemptions, 0);
  EXPECT_GT(stats.kv.prefix_hits, 0);
  EXPECT_EQ(stats.kv.used, 0);
}

TEST(EngineCore, SeededSamplingReproducesAcrossBatches) {
  std::vector<RequestParams> requests;
  for (int i = 0; i < 4; ++i) {
    RequestParams p = request(1);
    p.sampling.temperature = 1.0f;
    p.sampling.seed = uint64_t(i % 2);  // pairs share a seed
    requests.push_back(p);
  }
  EngineCore engine(*loaded().model, std::nullopt, config(16, 128, true));
  const auto got = run(engine, requests);
  EXPECT_EQ(got.at(0).tokens, got.at(2).tokens);
  EXPECT_EQ(got.at(1).tokens, got.at(3).tokens);
  EXPECT_NE(got.at(0).tokens, got.at(1).tokens);
}

// Runs the requests with or without top-logits sampling; *top_steps: the steps that used it.
std::map<int64_t, Collected> run_top(const std::vector<RequestParams>& requests, bool top, int64_t* top_steps) {
  EngineConfig c = config(2048, 64, false);
  c.top_logits_sampling = top;
  EngineCore engine(*loaded().model, std::nullopt, c);
  auto out = run(engine, requests);
  *top_steps = engine.stats().top_logits_steps;
  return out;
}

TEST(EngineCore, TopLogitsSamplingMatchesWholeRows) {
  std::vector<RequestParams> greedy, seeded;
  for (int i = 0; i < 6; ++i) {
    RequestParams p = request(i, 10);
    greedy.push_back(p);
    if (i % 3 != 0) {  // a third greedy; the others top-k 5 (width 64) or 100 (width 256)
      p.sampling.temperature = 0.9f;
      p.sampling.top_k = i % 3 == 1 ? 5 : 100;
      p.sampling.top_p = 0.9f;
      p.sampling.min_p = i == 2 ? 0.05f : 0.0f;
      p.sampling.seed = uint64_t(i);
    }
    seeded.push_back(p);
  }
  int64_t top_steps = 0, whole_steps = 0;
  for (const auto& requests : {greedy, seeded}) {
    const auto top = run_top(requests, true, &top_steps), whole = run_top(requests, false, &whole_steps);
    EXPECT_EQ(top_steps, 10);  // one prefill step, nine decode steps
    EXPECT_EQ(whole_steps, 0);
    for (size_t i = 0; i < requests.size(); ++i) EXPECT_EQ(top.at(int64_t(i)).tokens, whole.at(int64_t(i)).tokens) << i;
  }
  // One request that needs whole rows (in every step, as all run together) makes each step use them.
  const std::vector<std::function<void(SamplingParams&)>> changes = {
      [](SamplingParams& s) { s.logprobs = 2; }, [](SamplingParams& s) { s.repetition_penalty = 1.3f; },
      [](SamplingParams& s) { s.presence_penalty = 0.5f; }, [](SamplingParams& s) { s.top_k = 300; }};
  for (size_t c = 0; c < changes.size(); ++c) {
    auto requests = seeded;
    changes[c](requests[1].sampling);
    const auto top = run_top(requests, true, &top_steps), whole = run_top(requests, false, &whole_steps);
    EXPECT_EQ(top_steps, 0) << "change " << c;
    for (size_t i = 0; i < requests.size(); ++i)
      EXPECT_EQ(top.at(int64_t(i)).tokens, whole.at(int64_t(i)).tokens) << "change " << c << " request " << i;
  }
}

TEST(EngineCore, StopIdFinishesWithStop) {
  RequestParams p = request(2, 30);
  EngineCore first(*loaded().model, std::nullopt, config(64, 64, false));
  const auto free_run = run(first, {p}).at(0);
  p.stop_ids = {free_run.tokens[3]};
  EngineCore second(*loaded().model, std::nullopt, config(64, 64, false));
  const auto stopped = run(second, {p}).at(0);
  EXPECT_EQ(stopped.finish_reason, "stop");
  EXPECT_LE(stopped.tokens.size(), 4u);
  EXPECT_EQ(stopped.tokens.back(), free_run.tokens[3]);
}

TEST(EngineCore, AbortFreesBlocksAndValidationRejects) {
  EngineCore engine(*loaded().model, std::nullopt, config(8, 64, true));
  std::string reason;
  engine.add(1, request(3, 50), [&](RequestOutput&& o) {
    if (o.finished) reason = o.finish_reason;
  });
  engine.step();
  engine.step();
  EXPECT_GT(engine.stats().kv.used, 0);
  engine.abort(1);
  EXPECT_EQ(reason, "abort");
  EXPECT_EQ(engine.stats().kv.used, 0);
  EXPECT_FALSE(engine.has_work());
  RequestParams too_long = request(0, 200);
  EXPECT_THROW(engine.validate(too_long), Error);
  RequestParams bad_id = request(0);
  bad_id.prompt[0] = 9999;
  EXPECT_THROW(engine.validate(bad_id), Error);
  RequestParams zero = request(0, 0);
  EXPECT_THROW(engine.validate(zero), Error);
}

}  // namespace
}  // namespace moet
