// SequenceBatch implementation (see sequence_batch.h).
#include "engine/sequence_batch.h"

#include "core/error.h"
#include "engine/single_sequence.h"

namespace moet {

SequenceBatch::SequenceBatch(Model& model, int64_t sequences, int64_t tokens, int64_t block_size)
    : pool(sequences * ((tokens + block_size - 1) / block_size), block_size),
      cache(model.create_kv_cache(pool.total(), block_size)),
      tables(size_t(sequences)) {
  for (auto& table : tables) MOET_CHECK(pool.ensure(table, tokens), "KV pool too small");
}

SequenceBatch::~SequenceBatch() {
  for (auto& table : tables) pool.release(table);
}

std::vector<float> SequenceBatch::prefill(Model& model, int64_t seq, const std::vector<int32_t>& tokens, int64_t begin,
                                          int64_t end) {
  ForwardBatch batch;
  for (int64_t pos = begin; pos < end; ++pos)
    add_row(batch, tables[size_t(seq)], cache.block_size, tokens[size_t(pos)], pos, 0);
  batch.block_tables.push_back(tables[size_t(seq)].data());
  batch.logit_rows = {int32_t(end - begin - 1)};
  return model.forward(batch, cache);
}

std::vector<float> SequenceBatch::decode(Model& model, const std::vector<int32_t>& tokens, int64_t pos) {
  MOET_CHECK(tokens.size() == tables.size(), "one token per sequence");
  ForwardBatch batch;
  batch.decode = true;
  for (size_t s = 0; s < tables.size(); ++s) {
    add_row(batch, tables[s], cache.block_size, tokens[s], pos, int32_t(s));
    batch.block_tables.push_back(tables[s].data());
    batch.logit_rows.push_back(int32_t(s));
  }
  return model.forward(batch, cache);
}

}  // namespace moet
