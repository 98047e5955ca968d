// SequenceBatch implementation (see sequence_batch.h).
#include "engine/sequence_batch.h"

#include "core/error.h"

namespace moet {

SequenceBatch::SequenceBatch(Model& model, int64_t sequences, int64_t tokens, int64_t block_size,
                             std::span<const KvLayerSpec> specs)
    : pool_(sequences * ((tokens + block_size - 1) / block_size), block_size),
      runner_(model, pool_.total(), block_size, specs),
      sequences_(size_t(sequences)) {
  for (size_t s = 0; s < sequences_.size(); ++s) {
    sequences_[s].id = int64_t(s);
    MOET_CHECK(pool_.ensure(sequences_[s].blocks, tokens), "KV pool too small");
  }
}

SequenceBatch::~SequenceBatch() {
  for (Sequence& seq : sequences_) pool_.release(seq.blocks);
}

StepOutcome SequenceBatch::run_rows(int64_t s, int64_t begin, int64_t end, ChunkRows logits, int64_t top_logits) {
  StepPlan plan;
  plan.chunks.push_back({&sequence(s), begin, end - begin, logits});
  plan.num_tokens = end - begin;
  plan.top_logits = top_logits;
  return runner_.run(plan);
}

StepOutcome SequenceBatch::decode(int64_t pos, int64_t top_logits) {
  StepPlan plan;
  for (Sequence& seq : sequences_) plan.chunks.push_back({&seq, pos, 1, ChunkRows::last});
  plan.num_tokens = int64_t(sequences_.size());
  plan.top_logits = top_logits;
  return runner_.run(plan);
}

}  // namespace moet
