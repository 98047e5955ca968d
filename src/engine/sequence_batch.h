// Several sequences decoding side by side outside the scheduler (moet bench --batch): one KV pool
// holding every sequence's blocks, each sequence prefilled on its own, then decode steps that feed
// one token of each sequence, all at the same position, as one decode batch (ForwardBatch::decode:
// one CUDA graph per batch size and context bucket).
#pragma once

#include "kv/block_pool.h"
#include "models/model.h"

#include <cstdint>
#include <vector>

namespace moet {

struct SequenceBatch {
  KvBlockPool pool;
  KvCache cache;
  std::vector<std::vector<int32_t>> tables;  // [sequence] its KV blocks

  // Reserves KV blocks for `sequences` sequences of `tokens` tokens each.
  SequenceBatch(Model& model, int64_t sequences, int64_t tokens, int64_t block_size);
  ~SequenceBatch();

  // Rows [begin, end) of sequence `seq`'s tokens; the logits of its last row.
  std::vector<float> prefill(Model& model, int64_t seq, const std::vector<int32_t>& tokens, int64_t begin,
                             int64_t end);
  // One decode step: sequence s feeds tokens[s] at position `pos`; logits [sequences, vocab].
  std::vector<float> decode(Model& model, const std::vector<int32_t>& tokens, int64_t pos);
};

}  // namespace moet
