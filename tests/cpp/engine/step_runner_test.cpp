// The step runner on a real fixture model (W2 experts): a hook that asks for the same step once
// more makes the runner run it twice, and the second pass's logits are bit-identical to a single
// pass (memcmp), for prefill chunks and decode steps, whole rows and top-logits; the hook sees
// every pass in order, the stats count the replay, and the engine reaches the model only through
// its runner. Chunks can return all their rows' logits (scoring) and hidden states.
#include "../cpu_isa_env.h"
#include "backend/cpu/cpu_backend.h"
#include "core/error.h"
#include "engine/engine_core.h"
#include "engine/sequence_batch.h"
#include "io/checkpoint.h"

#include <gtest/gtest.h>

#include <cstring>

namespace moet {
namespace {

const std::filesystem::path kFixture = std::filesystem::path(MOET_SOURCE_DIR) / "tests" / "fixtures" / "qwen3_moe";

struct Loaded {
  Checkpoint checkpoint = Checkpoint::open(kFixture);
  std::unique_ptr<Backend> backend = cpu_backend_create({2, test_cpu_isa()});
  std::unique_ptr<Model> model = model_load(checkpoint, *backend);
};

Loaded& loaded() {
  static Loaded l;
  return l;
}

// Says `again` after the first `replays` passes of every step, and records the passes it saw.
class ReplayHook final : public StepHook {
 public:
  explicit ReplayHook(int64_t replays) : replays_(replays) {}
  StepDecision after_pass(const StepPlan& plan, const StepOutput& output, int64_t pass) override {
    (void)plan;
    passes.push_back(pass);
    first_pass_logits = pass == 0 ? output.logits : first_pass_logits;
    return pass < replays_ ? StepDecision::again : StepDecision::done;
  }
  std::vector<int64_t> passes;
  std::vector<float> first_pass_logits;

 private:
  int64_t replays_;
};

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0);
}

const std::vector<int32_t> kPrompt = {3, 17, 42, 99, 7, 250, 11, 5, 60};

// Prefill of kPrompt, then `steps` greedy decode steps (top_logits 0: whole rows), on a fresh
// runner with `hook` (may be null); every step's output.
std::vector<StepOutput> run(StepHook* hook, int64_t steps, int64_t top_logits) {
  SequenceBatch sequences(*loaded().model, 1, int64_t(kPrompt.size()) + steps, 4);
  if (hook) sequences.runner().add_hook(hook);
  Sequence& seq = sequences.sequence(0);
  seq.tokens = kPrompt;
  std::vector<StepOutput> out;
  out.push_back(sequences.run_rows(0, 0, int64_t(kPrompt.size()), ChunkRows::last, top_logits).output);
  for (int64_t i = 0; i < steps; ++i) {
    const StepOutput& last = out.back();
    seq.tokens.push_back(top_logits > 0 ? last.top.ids[0] : argmax(last.logits.data(), int64_t(last.logits.size())));
    out.push_back(sequences.decode(int64_t(seq.tokens.size()) - 1, top_logits).output);
  }
  EXPECT_EQ(sequences.runner().stats().steps, steps + 1);
  return out;
}

TEST(StepRunner, ReplayedStepIsBitIdenticalToOnePass) {
  for (const int64_t top_logits : {0, 5}) {
    const std::vector<StepOutput> single = run(nullptr, 6, top_logits);
    ReplayHook hook(1);
    const std::vector<StepOutput> replayed = run(&hook, 6, top_logits);
    ASSERT_EQ(single.size(), replayed.size());
    for (size_t i = 0; i < single.size(); ++i) {
      EXPECT_TRUE(same_bits(single[i].logits, replayed[i].logits)) << "step " << i;
      EXPECT_TRUE(same_bits(single[i].top.values, replayed[i].top.values)) << "step " << i;
      EXPECT_EQ(single[i].top.ids, replayed[i].top.ids) << "step " << i;
    }
    EXPECT_EQ(hook.passes.size(), 2 * single.size());  // pass 0 then pass 1, every step
    for (size_t i = 0; i < hook.passes.size(); ++i) EXPECT_EQ(hook.passes[i], int64_t(i % 2));
  }
}

TEST(StepRunner, CountsPassesAndReplays) {
  ReplayHook hook(2);
  SequenceBatch sequences(*loaded().model, 1, 8, 4);
  sequences.runner().add_hook(&hook);
  sequences.sequence(0).tokens = {1, 2, 3, 4};
  const StepOutcome outcome = sequences.run_rows(0, 0, 4, ChunkRows::last);
  EXPECT_EQ(outcome.passes, 3);
  EXPECT_TRUE(same_bits(outcome.output.logits, hook.first_pass_logits));
  const StepRunnerStats& stats = sequences.runner().stats();
  EXPECT_EQ(stats.steps, 1);
  EXPECT_EQ(stats.passes, 3);
  EXPECT_EQ(stats.replayed_steps, 1);
}

// ChunkRows::all returns every row's logits and hidden states in row order, each equal to what
// the row gets as the last row of its own prefix (rows are computed independently on the CPU).
TEST(StepRunner, AllRowsAndHiddenStates) {
  const int64_t n = int64_t(kPrompt.size()), vocab = loaded().model->config().vocab_size;
  const int64_t hidden = loaded().model->config().hidden_size;
  SequenceBatch all(*loaded().model, 1, n, 4);
  all.sequence(0).tokens = kPrompt;
  StepPlan plan;
  plan.chunks.push_back({&all.sequence(0), 0, n, ChunkRows::all, ChunkRows::all});
  plan.num_tokens = n;
  const StepOutcome outcome = all.runner().run(plan);
  ASSERT_EQ(int64_t(outcome.output.logits.size()), n * vocab);
  ASSERT_EQ(int64_t(outcome.output.hidden.size()), n * hidden);
  EXPECT_EQ(outcome.logit_chunks, std::vector<int32_t>(size_t(n), 0));
  EXPECT_EQ(outcome.hidden_chunks, std::vector<int32_t>(size_t(n), 0));
  for (const int64_t prefix : {int64_t(1), n / 2, n}) {
    SequenceBatch one(*loaded().model, 1, prefix, 4);
    one.sequence(0).tokens.assign(kPrompt.begin(), kPrompt.begin() + prefix);
    StepPlan last;
    last.chunks.push_back({&one.sequence(0), 0, prefix, ChunkRows::last, ChunkRows::last});
    const StepOutput out = one.runner().run(last).output;
    EXPECT_EQ(0, std::memcmp(out.logits.data(), outcome.output.logits.data() + (prefix - 1) * vocab, size_t(vocab) * 4))
        << "prefix " << prefix;
    ASSERT_EQ(int64_t(out.hidden.size()), hidden);
    EXPECT_EQ(0, std::memcmp(out.hidden.data(), outcome.output.hidden.data() + (prefix - 1) * hidden, size_t(hidden) * 4))
        << "prefix " << prefix;
  }
  float norm = 0.0f;
  for (float v : outcome.output.hidden) norm += v * v;
  EXPECT_GT(norm, 0.0f);
}

TEST(StepRunner, RejectsChunksOutsideTheSequence) {
  SequenceBatch sequences(*loaded().model, 1, 4, 4);
  sequences.sequence(0).tokens = {1, 2, 3};
  EXPECT_THROW(sequences.run_rows(0, 2, 5, ChunkRows::last), Error);  // past its known tokens
  StepPlan empty;
  EXPECT_THROW(sequences.runner().run(empty), Error);
}

// The engine's steps go through its runner: a hook added there sees every step, and replaying
// each step once changes no token.
TEST(StepRunner, EngineStepsGoThroughTheRunner) {
  EngineConfig config;
  config.max_model_len = 64;
  config.num_blocks = 32;
  config.block_size = 4;
  const auto generate_tokens = [&](StepHook* hook) {
    EngineCore engine(*loaded().model, std::nullopt, config);
    if (hook) engine.runner().add_hook(hook);
    std::vector<int32_t> tokens;
    RequestParams params;
    params.prompt = kPrompt;
    params.max_tokens = 8;
    engine.add(1, params, [&](RequestOutput&& out) { tokens.insert(tokens.end(), out.token_ids.begin(), out.token_ids.end()); });
    while (engine.has_work()) engine.step();
    EXPECT_EQ(engine.runner().stats().replayed_steps, hook ? engine.runner().stats().steps : 0);
    return tokens;
  };
  ReplayHook hook(1);
  const std::vector<int32_t> plain = generate_tokens(nullptr), replayed = generate_tokens(&hook);
  EXPECT_EQ(plain.size(), 8u);
  EXPECT_EQ(plain, replayed);
  EXPECT_EQ(hook.passes.size(), 2u * 8u);  // one prefill step + 7 decode steps, two passes each
}

}  // namespace
}  // namespace moet
