// SingleSequence implementation (see single_sequence.h).
#include "engine/single_sequence.h"

#include "core/error.h"

namespace moet {

void add_row(ForwardBatch& batch, const std::vector<int32_t>& table, int64_t block_size, int32_t token, int64_t pos,
             int32_t seq) {
  batch.tokens.push_back(token);
  batch.positions.push_back(int32_t(pos));
  batch.row_seq.push_back(seq);
  batch.slots.push_back(int64_t(table[size_t(pos / block_size)]) * block_size + pos % block_size);
}

SingleSequence::SingleSequence(Model& model, int64_t tokens, int64_t block_size)
    : pool((tokens + block_size - 1) / block_size, block_size),
      cache(model.create_kv_cache(pool.total(), block_size)) {
  MOET_CHECK(pool.ensure(table, tokens), "KV pool too small");
}

std::vector<float> SingleSequence::forward(Model& model, const std::vector<int32_t>& tokens, int64_t begin,
                                           int64_t end, const std::vector<int32_t>& logit_rows, bool decode) {
  ForwardBatch batch;
  batch.decode = decode && end - begin == 1;
  for (int64_t pos = begin; pos < end; ++pos) add_row(batch, table, cache.block_size, tokens[size_t(pos)], pos, 0);
  batch.block_tables.push_back(table.data());
  batch.logit_rows = logit_rows;
  return model.forward(batch, cache);
}

}  // namespace moet
