// Helpers for running one sequence through Model::forward outside the scheduler (generate,
// score, bench): the KV blocks a sequence of known length needs, and the batch of its rows
// [begin, end) whose K/V go to the slots its block table gives (several sequences side by side:
// sequence_batch.h).
#pragma once

#include "kv/block_pool.h"
#include "models/model.h"

#include <cstdint>
#include <vector>

namespace moet {

// Appends to `batch` the row of token `token` at position `pos` of sequence `seq`, whose KV
// blocks `table` lists.
void add_row(ForwardBatch& batch, const std::vector<int32_t>& table, int64_t block_size, int32_t token, int64_t pos,
             int32_t seq);

struct SingleSequence {
  KvBlockPool pool;
  KvCache cache;
  std::vector<int32_t> table;

  // Reserves KV blocks for `tokens` tokens.
  SingleSequence(Model& model, int64_t tokens, int64_t block_size);
  ~SingleSequence() { pool.release(table); }

  // Forward of rows [begin, end) of `tokens`; logits of the rows listed (relative to begin).
  // decode: a one-token decode step (ForwardBatch::decode: may replay a CUDA graph).
  std::vector<float> forward(Model& model, const std::vector<int32_t>& tokens, int64_t begin, int64_t end,
                             const std::vector<int32_t>& logit_rows, bool decode = false);
};

}  // namespace moet
