// score() implementation (see scorer.h). Log-softmax in double, max subtracted.
#include "engine/scorer.h"

#include "core/error.h"
#include "engine/sequence_batch.h"

#include <algorithm>
#include <cmath>
#include <memory>

namespace moet {
namespace {

double mean_of(const std::vector<double>& values) {
  double sum = 0.0;
  for (double v : values) sum += v;
  return values.empty() ? 0.0 : sum / double(values.size());
}

// log-softmax of a row of logits, in double.
std::vector<double> log_softmax(const float* row, int64_t vocab) {
  const double max_logit = *std::max_element(row, row + vocab);
  double sum = 0.0;
  for (int64_t v = 0; v < vocab; ++v) sum += std::exp(double(row[v]) - max_logit);
  const double log_sum = std::log(sum);
  std::vector<double> out(static_cast<size_t>(vocab));
  for (int64_t v = 0; v < vocab; ++v) out[size_t(v)] = double(row[v]) - max_logit - log_sum;
  return out;
}

}  // namespace

double ScoreResult::mean_nll() const { return -mean_of(token_logprobs); }
double ScoreResult::perplexity() const { return std::exp(mean_nll()); }
double ScoreResult::reference_perplexity() const { return std::exp(-mean_of(reference_logprobs)); }
double ScoreResult::mean_kld() const { return mean_of(kld); }

ScoreResult score(Model& model, const std::vector<int32_t>& ids, bool keep_logits, int64_t chunk, int64_t block_size,
                  std::optional<KvDtype> reference_kv, bool decode_steps) {
  const ModelConfig& config = model.config();
  const int64_t n = int64_t(ids.size()), vocab = config.vocab_size;
  MOET_CHECK(n >= 2, "scoring needs at least 2 tokens (got {})", n);
  MOET_CHECK(chunk > 0, "scoring needs a positive chunk size (got {})", chunk);
  MOET_CHECK(n <= config.max_position_embeddings, "{} tokens exceed the maximum model length {}", n,
             config.max_position_embeddings);
  for (int32_t id : ids) MOET_CHECK(id >= 0 && id < vocab, "token id {} is outside the vocabulary [0, {})", id, vocab);
  SequenceBatch sequences(model, 1, n, block_size);
  std::unique_ptr<SequenceBatch> reference;
  if (reference_kv) {
    std::vector<KvLayerSpec> specs;
    for (const KvLayerSpec& spec : model.kv_layer_specs())
      specs.push_back(kv_layer_spec_with_dtype(spec, *reference_kv));
    reference = std::make_unique<SequenceBatch>(model, 1, n, block_size, specs);
  }
  // The known tokens: all of them, or (decode steps) only those before the step's position.
  const auto known = [&](SequenceBatch& batch) -> std::vector<int32_t>& { return batch.sequence(0).tokens; };
  known(sequences).assign(ids.begin(), decode_steps ? ids.begin() + 1 : ids.end());
  if (reference) known(*reference) = known(sequences);
  if (decode_steps) chunk = 1;
  const ChunkRows rows = decode_steps ? ChunkRows::last : ChunkRows::all;
  ScoreResult result;
  for (int64_t begin = 0; begin < n - 1; begin += chunk) {
    const int64_t end = std::min(n - 1, begin + chunk);  // rows that predict a known next token
    const std::vector<float> logits = sequences.run_rows(0, begin, end, rows).output.logits;
    std::vector<float> reference_logits;
    if (reference) reference_logits = reference->run_rows(0, begin, end, rows).output.logits;
    if (decode_steps) {
      known(sequences).push_back(ids[size_t(end)]);
      if (reference) known(*reference).push_back(ids[size_t(end)]);
    }
    for (int64_t r = 0; r < end - begin; ++r) {
      const int32_t next = ids[size_t(begin + r + 1)];
      const std::vector<double> lp = log_softmax(logits.data() + r * vocab, vocab);
      result.token_logprobs.push_back(lp[size_t(next)]);
      if (!reference) continue;
      const std::vector<double> ref = log_softmax(reference_logits.data() + r * vocab, vocab);
      result.reference_logprobs.push_back(ref[size_t(next)]);
      double kld = 0.0;
      for (int64_t v = 0; v < vocab; ++v) kld += std::exp(ref[size_t(v)]) * (ref[size_t(v)] - lp[size_t(v)]);
      result.kld.push_back(kld);
      result.top1_agree += std::max_element(lp.begin(), lp.end()) - lp.begin() ==
                           std::max_element(ref.begin(), ref.end()) - ref.begin();
    }
    if (keep_logits) result.logits.insert(result.logits.end(), logits.begin(), logits.end());
  }
  return result;
}

}  // namespace moet
