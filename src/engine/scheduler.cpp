// Scheduler implementation (see scheduler.h).
#include "engine/scheduler.h"

#include "core/error.h"

#include <algorithm>

namespace moet {

Scheduler::Scheduler(const SchedulerConfig& config, KvBlockPool& pool) : config_(config), pool_(pool) {
  MOET_CHECK(config.max_num_seqs > 0, "max_num_seqs must be positive (got {})", config.max_num_seqs);
  MOET_CHECK(config.max_num_batched_tokens > 0, "max_num_batched_tokens must be positive (got {})",
             config.max_num_batched_tokens);
  MOET_CHECK(config.num_lookahead_tokens >= 0, "num_lookahead_tokens must be >= 0 (got {})",
             config.num_lookahead_tokens);
}

void Scheduler::add(Sequence* seq) {
  MOET_CHECK(seq->prompt_len > 0 && int64_t(seq->tokens.size()) >= seq->prompt_len, "sequence {} has no prompt",
             seq->id);
  seq->running = false;
  waiting_.push_back(seq);
}

void Scheduler::remove(Sequence* seq) {
  if (seq->running) {
    running_.erase(std::find(running_.begin(), running_.end(), seq));
  } else if (auto it = std::find(waiting_.begin(), waiting_.end(), seq); it != waiting_.end()) {
    waiting_.erase(it);
  }
  pool_.release(seq->blocks);
  seq->running = false;
}

void Scheduler::preempt(Sequence* seq) {
  running_.erase(std::find(running_.begin(), running_.end(), seq));
  seq->tokens.resize(seq->tokens.size() - size_t(seq->num_draft_tokens));
  seq->num_draft_tokens = 0;
  pool_.release(seq->blocks);
  seq->num_computed = 0;
  seq->num_cached = 0;
  seq->running = false;
  ++seq->preemptions;
  waiting_.push_front(seq);
}

bool Scheduler::admit(Sequence* seq, int64_t budget, StepPlan& plan) {
  const int64_t known = int64_t(seq->tokens.size());
  if (pool_.prefix_caching()) {
    // Never the whole sequence: the last token must be computed to produce logits.
    const std::vector<int32_t> lookup(seq->tokens.begin(), seq->tokens.end() - 1);
    seq->blocks = pool_.match_prefix(lookup);
    while (config_.prefix_check && !seq->blocks.empty() &&
           !config_.prefix_check(seq->blocks.back(), seq->tokens[seq->blocks.size() * size_t(pool_.block_size())])) {
      std::vector<int32_t> last{seq->blocks.back()};
      seq->blocks.pop_back();
      pool_.release(last);
    }
  }
  seq->num_computed = int64_t(seq->blocks.size()) * pool_.block_size();
  const int64_t count = std::min(known - seq->num_computed, budget);
  if (!pool_.ensure(seq->blocks, seq->num_computed + count + config_.num_lookahead_tokens)) {
    pool_.release(seq->blocks);  // gives the prefix hits back (they stay cached)
    seq->num_computed = 0;
    return false;
  }
  if (pool_.prefix_caching()) pool_.note_prefix_lookup(known, seq->num_computed);
  seq->num_cached = seq->num_computed;
  seq->running = true;
  running_.push_back(seq);
  plan.chunks.push_back({seq, seq->num_computed, count});
  plan.num_tokens += count;
  return true;
}

StepPlan Scheduler::schedule() {
  StepPlan plan;
  int64_t budget = config_.max_num_batched_tokens;
  // Running sequences first, in admission order; each catches up as far as the budget allows.
  for (size_t i = 0; i < running_.size() && budget > 0;) {
    Sequence* seq = running_[i];
    const int64_t count = std::min(int64_t(seq->tokens.size()) - seq->num_computed, budget);
    bool self_preempted = false;
    while (!pool_.ensure(seq->blocks, seq->num_computed + count + config_.num_lookahead_tokens)) {
      Sequence* victim = running_.back();
      plan.preempted.push_back(victim->id);
      preempt(victim);
      if (victim == seq) {
        self_preempted = true;
        break;
      }
    }
    if (self_preempted) break;  // it was the last running sequence; nothing after it remains
    plan.chunks.push_back({seq, seq->num_computed, count});
    plan.num_tokens += count;
    budget -= count;
    ++i;
  }
  // Then admission from the queue, unless this step already had to preempt.
  while (plan.preempted.empty() && budget > 0 && !waiting_.empty() &&
         int64_t(running_.size()) < config_.max_num_seqs) {
    Sequence* seq = waiting_.front();
    if (!admit(seq, budget, plan)) break;
    waiting_.pop_front();
    budget -= plan.chunks.back().count;
  }
  return plan;
}

void Scheduler::complete(const StepPlan& plan) {
  for (const ScheduledChunk& chunk : plan.chunks) {
    chunk.seq->num_computed = chunk.begin + chunk.count;
    pool_.commit(chunk.seq->blocks, chunk.seq->tokens, chunk.seq->num_computed);
  }
}

}  // namespace moet
