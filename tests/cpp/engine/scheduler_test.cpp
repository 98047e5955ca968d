// Scheduler as a pure transform: plans are checked against the invariant (computed catches up with
// known), the token budget, chunked prefill, max_num_seqs admission, prefix-cache admission and
// preemption by recompute, with a fake "model" that appends a token whenever a chunk samples.
#include "engine/scheduler.h"

#include <gtest/gtest.h>

#include <memory>
#include <numeric>

namespace moet {
namespace {

struct Harness {
  KvBlockPool pool;
  Scheduler scheduler;
  std::vector<std::unique_ptr<Sequence>> seqs;

  Harness(int64_t blocks, int64_t block_size, SchedulerConfig config, bool caching = false)
      : pool(blocks, block_size, caching), scheduler(config, pool) {}

  Sequence* add(int prompt_len, int first_token = 0) {
    auto seq = std::make_unique<Sequence>();
    seq->id = int64_t(seqs.size());
    seq->tokens.resize(size_t(prompt_len));
    std::iota(seq->tokens.begin(), seq->tokens.end(), first_token);
    seq->prompt_len = prompt_len;
    scheduler.add(seq.get());
    seqs.push_back(std::move(seq));
    return seqs.back().get();
  }

  // Runs one step: checks the plan, "samples" token 1000 + position for sampling chunks.
  StepPlan step() {
    StepPlan plan = scheduler.schedule();
    for (const auto& c : plan.chunks) {
      EXPECT_EQ(c.begin, c.seq->num_computed);
      EXPECT_GT(c.count, 0);
      EXPECT_LE(c.begin + c.count, int64_t(c.seq->tokens.size()));
      EXPECT_GE(int64_t(c.seq->blocks.size()) * pool.block_size(), c.begin + c.count);
    }
    scheduler.complete(plan);
    for (const auto& c : plan.chunks)
      if (c.begin + c.count == int64_t(c.seq->tokens.size())) c.seq->tokens.push_back(int32_t(1000 + c.seq->tokens.size()));
    return plan;
  }
};

TEST(Scheduler, ChunkedPrefillWithinBudgetThenDecode) {
  Harness h(64, 4, {8, 6});
  Sequence* a = h.add(10);
  StepPlan p = h.step();
  ASSERT_EQ(p.chunks.size(), 1u);
  EXPECT_EQ(p.chunks[0].count, 6);
  EXPECT_FALSE(a->tokens.size() > 10);  // no token sampled mid-prompt
  p = h.step();
  EXPECT_EQ(p.chunks[0].count, 4);
  EXPECT_EQ(a->tokens.size(), 11u);  // prompt done -> sampled
  p = h.step();
  EXPECT_EQ(p.chunks[0].count, 1);  // decode
  EXPECT_EQ(a->num_computed, 11);
}

TEST(Scheduler, DecodeAndPrefillShareAStep) {
  Harness h(64, 4, {8, 8});
  Sequence* a = h.add(3);
  h.step();  // a prefilled, sampled
  Sequence* b = h.add(20);
  StepPlan p = h.step();
  ASSERT_EQ(p.chunks.size(), 2u);
  EXPECT_EQ(p.chunks[0].seq, a);
  EXPECT_EQ(p.chunks[0].count, 1);
  EXPECT_EQ(p.chunks[1].seq, b);
  EXPECT_EQ(p.chunks[1].count, 7);
  EXPECT_EQ(p.num_tokens, 8);
}

TEST(Scheduler, MaxNumSeqsLimitsAdmission) {
  Harness h(64, 4, {2, 100});
  h.add(2);
  h.add(2);
  h.add(2);
  StepPlan p = h.step();
  EXPECT_EQ(p.chunks.size(), 2u);
  EXPECT_EQ(h.scheduler.num_waiting(), 1);
  h.scheduler.remove(h.seqs[0].get());
  p = h.step();
  EXPECT_EQ(p.chunks.size(), 2u);
  EXPECT_EQ(h.scheduler.num_waiting(), 0);
}

TEST(Scheduler, AdmissionWaitsForBlocks) {
  Harness h(3, 4, {8, 100});
  h.add(8);  // 2 blocks
  h.add(8);  // needs 2 more, only 1 left
  StepPlan p = h.step();
  EXPECT_EQ(p.chunks.size(), 1u);
  EXPECT_EQ(h.scheduler.num_waiting(), 1);
  EXPECT_EQ(h.seqs[1]->blocks.size(), 0u);
}

TEST(Scheduler, PreemptsLatestByRecomputeWhenBlocksRunOut) {
  Harness h(4, 2, {8, 100});
  Sequence* a = h.add(3);  // 2 blocks
  Sequence* b = h.add(3);  // 2 blocks -> pool full
  h.step();
  ASSERT_EQ(a->tokens.size(), 4u);
  ASSERT_EQ(b->tokens.size(), 4u);
  h.step();  // both fit exactly: 4 known tokens in 2 blocks each, now 5 known each
  StepPlan p = h.step();  // a needs a 3rd block -> b (latest) is preempted
  ASSERT_EQ(p.preempted, std::vector<int64_t>{b->id});
  EXPECT_EQ(b->num_computed, 0);
  EXPECT_TRUE(b->blocks.empty());
  EXPECT_EQ(b->preemptions, 1);
  EXPECT_EQ(b->tokens.size(), 5u);  // its output is kept; it is recomputed later
  h.scheduler.remove(a);
  p = h.step();  // b comes back, recomputing all 5 known tokens in one chunk
  ASSERT_EQ(p.chunks.size(), 1u);
  EXPECT_EQ(p.chunks[0].seq, b);
  EXPECT_EQ(p.chunks[0].begin, 0);
  EXPECT_EQ(p.chunks[0].count, 5);
  EXPECT_EQ(b->tokens.size(), 6u);
}

TEST(Scheduler, PrefixCacheSkipsComputedBlocksButNeverTheLastToken) {
  Harness h(16, 4, {8, 100}, true);
  Sequence* a = h.add(8);
  h.step();
  h.scheduler.remove(a);
  Sequence* b = h.add(8);  // same 8 tokens: block 0 hits, block 1 would cover the last token
  StepPlan p = h.step();
  ASSERT_EQ(p.chunks.size(), 1u);
  EXPECT_EQ(p.chunks[0].begin, 4);
  EXPECT_EQ(p.chunks[0].count, 4);
  EXPECT_EQ(b->num_cached, 4);
  Sequence* c = h.add(13);  // 8 shared tokens + 5 new: two blocks hit
  p = h.step();
  EXPECT_EQ(c->num_cached, 8);
  EXPECT_EQ(h.pool.stats().prefix_hits, 12);
  EXPECT_EQ(h.pool.stats().prefix_queries, 8 + 8 + 13);
}

}  // namespace
}  // namespace moet
