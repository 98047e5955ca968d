// Sequences run outside the scheduler (moet score, moet bench, tests): KV blocks reserved up front
// for each sequence's length, and steps over them through a StepRunner. run_rows() runs rows
// [begin, end) of one sequence; decode() one token of every sequence at one position, as one
// decode step (one CUDA graph per batch size and context bucket). The caller fills each
// sequence's tokens (Sequence::tokens) before running positions of it.
#pragma once

#include "engine/scheduler.h"
#include "engine/step_runner.h"
#include "kv/block_pool.h"
#include "models/model.h"

#include <cstdint>
#include <vector>

namespace moet {

class SequenceBatch {
 public:
  // Reserves KV blocks for `sequences` sequences of `tokens` tokens each (caches of `specs`, or
  // of the model's specs when empty).
  SequenceBatch(Model& model, int64_t sequences, int64_t tokens, int64_t block_size,
                std::span<const KvLayerSpec> specs = {});
  ~SequenceBatch();

  Sequence& sequence(int64_t s) { return sequences_[size_t(s)]; }
  int64_t size() const { return int64_t(sequences_.size()); }
  StepRunner& runner() { return runner_; }

  // Rows [begin, end) of sequence s in one step; `logits` says whose logits come back.
  StepOutcome run_rows(int64_t s, int64_t begin, int64_t end, ChunkRows logits, int64_t top_logits = 0);
  // One decode step: every sequence's token at position `pos`; logits [sequences, vocab].
  StepOutcome decode(int64_t pos, int64_t top_logits = 0);

 private:
  KvBlockPool pool_;
  StepRunner runner_;
  std::vector<Sequence> sequences_;
};

}  // namespace moet
