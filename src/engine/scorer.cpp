// score() implementation (see scorer.h). Log-softmax in double, max subtracted.
#include "engine/scorer.h"

#include "core/error.h"
#include "engine/sequence_batch.h"

#include <algorithm>
#include <cmath>

namespace moet {

double ScoreResult::mean_nll() const {
  double sum = 0.0;
  for (double lp : token_logprobs) sum -= lp;
  return token_logprobs.empty() ? 0.0 : sum / double(token_logprobs.size());
}

double ScoreResult::perplexity() const { return std::exp(mean_nll()); }

ScoreResult score(Model& model, const std::vector<int32_t>& ids, bool keep_logits, int64_t chunk, int64_t block_size,
                  bool decode_steps) {
  const ModelConfig& config = model.config();
  const int64_t n = int64_t(ids.size()), vocab = config.vocab_size;
  MOET_CHECK(n >= 2, "scoring needs at least 2 tokens (got {})", n);
  MOET_CHECK(n <= config.max_position_embeddings, "{} tokens exceed the maximum model length {}", n,
             config.max_position_embeddings);
  for (int32_t id : ids) MOET_CHECK(id >= 0 && id < vocab, "token id {} is outside the vocabulary [0, {})", id, vocab);
  SequenceBatch sequences(model, 1, n, block_size);
  std::vector<int32_t>& known = sequences.sequence(0).tokens;
  known = ids;
  if (decode_steps) {
    chunk = 1;
    known.resize(1);
  }
  ScoreResult result;
  for (int64_t begin = 0; begin < n - 1; begin += chunk) {
    const int64_t end = std::min(n - 1, begin + chunk);  // rows that predict a known next token
    const std::vector<float> logits =
        sequences.run_rows(0, begin, end, decode_steps ? ChunkRows::last : ChunkRows::all).output.logits;
    if (decode_steps) known.push_back(ids[size_t(end)]);
    for (int64_t r = 0; r < end - begin; ++r) {
      const float* row = logits.data() + r * vocab;
      const double max_logit = *std::max_element(row, row + vocab);
      double sum = 0.0;
      for (int64_t v = 0; v < vocab; ++v) sum += std::exp(double(row[v]) - max_logit);
      result.token_logprobs.push_back(double(row[ids[size_t(begin + r + 1)]]) - max_logit - std::log(sum));
    }
    if (keep_logits) result.logits.insert(result.logits.end(), logits.begin(), logits.end());
  }
  return result;
}

}  // namespace moet
