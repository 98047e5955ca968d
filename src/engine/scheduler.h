// The scheduler: a synchronous CPU transform from the request queues and the KV pool to the plan of
// one model step. No model, no threads, no clocks: tests drive it with plain structs.
//
// One invariant replaces prefill/decode phases (vLLM v1): each sequence's computed tokens catch up
// with its known tokens (prompt + sampled output). A step gives every running sequence
// min(known - computed, remaining budget) tokens, so a long prompt is prefilled in chunks across
// steps while other sequences decode; a sequence samples a token in a step whose chunk reaches its
// last known token. Admission: waiting sequences join (FIFO) while the token budget, max_num_seqs
// and free KV blocks allow; a new sequence first takes its longest cached prefix (full blocks only,
// never the whole prompt, so at least one token is computed and yields logits). Preemption: when a
// running sequence needs a block and the pool is empty, the most recently admitted running
// sequence loses all its blocks and goes back to the front of the queue with computed = 0; it is
// recomputed from its known tokens later (preemption by recompute).
// Speculative decoding (engine/speculative.h): a sequence's last num_draft_tokens tokens are
// unverified drafts, scheduled like known tokens (so a decode chunk verifies them in one step) and
// dropped on preemption; every allocation keeps num_lookahead_tokens more slots (where the next
// drafts are written before the scheduler runs again, as vLLM's num_lookahead_tokens); and an
// optional prefix check may refuse the last cached blocks of a prefix hit.
#pragma once

#include "kv/block_pool.h"

#include <cstdint>
#include <deque>
#include <functional>
#include <vector>

namespace moet {

struct Sequence {
  int64_t id = 0;
  std::vector<int32_t> tokens;  // known tokens: prompt then output
  int64_t prompt_len = 0;
  int64_t num_computed = 0;     // tokens whose K/V are in `blocks`
  int64_t num_cached = 0;       // prompt tokens taken from the prefix cache at (last) admission
  int64_t preemptions = 0;
  std::vector<int32_t> blocks;  // block table
  bool running = false;
  int64_t num_draft_tokens = 0;  // the last tokens are unverified drafts (speculative decoding)
};

struct SchedulerConfig {
  int64_t max_num_seqs = 256;
  int64_t max_num_batched_tokens = 2048;
  int64_t num_lookahead_tokens = 0;  // KV slots kept beyond every step's tokens
  // When set, a prefix hit keeps its cached blocks only while prefix_check(last block, the token
  // after it) holds (the MTP layer's entry at a block's last position depends on the next token).
  std::function<bool(int32_t block, int32_t next_token)> prefix_check;
};

// Which of a chunk's rows a step returns logits or hidden states for.
enum class ChunkRows {
  if_sampling,  // the last row when the chunk reaches the sequence's last known token, else none
  none,
  last,
  all,          // every row (teacher-forced scoring)
};

struct ScheduledChunk {
  Sequence* seq = nullptr;
  int64_t begin = 0;  // first token position computed this step
  int64_t count = 0;  // tokens computed this step
  ChunkRows logits = ChunkRows::if_sampling;
  ChunkRows hidden = ChunkRows::none;
  bool samples() const { return begin + count == int64_t(seq->tokens.size()); }
};

// One model step: what the scheduler planned (or a driver outside it built), and what the step
// runner should return of it.
struct StepPlan {
  std::vector<ScheduledChunk> chunks;
  std::vector<int64_t> preempted;  // ids preempted while planning this step
  int64_t num_tokens = 0;
  int64_t top_logits = 0;          // > 0: return only the best top_logits logits of each row
  // A draft step of the MTP layer (ForwardBatch::mtp_hidden): each row reads the token after its
  // position and this hidden state [rows, hidden], rows in the chunks' order.
  const std::vector<float>* mtp_hidden = nullptr;
};

class Scheduler {
 public:
  Scheduler(const SchedulerConfig& config, KvBlockPool& pool);

  // Queues a sequence (not owned; it must outlive its stay here).
  void add(Sequence* seq);
  // Takes a sequence out of the queues and returns its blocks (finish or abort).
  void remove(Sequence* seq);
  StepPlan schedule();
  // After the model ran `plan`: advances computed tokens and publishes full blocks to the prefix cache.
  void complete(const StepPlan& plan);

  int64_t num_running() const { return int64_t(running_.size()); }
  int64_t num_waiting() const { return int64_t(waiting_.size()); }
  bool has_work() const { return !running_.empty() || !waiting_.empty(); }

 private:
  void preempt(Sequence* seq);
  bool admit(Sequence* seq, int64_t budget, StepPlan& plan);

  SchedulerConfig config_;
  KvBlockPool& pool_;
  std::vector<Sequence*> running_;  // admission order (last = lowest priority)
  std::deque<Sequence*> waiting_;
};

}  // namespace moet
