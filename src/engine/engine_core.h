// EngineCore: continuous batching over one Model, synchronous. add() queues a request, step() runs
// one scheduler plan through the StepRunner (prefill chunks and decode rows of many requests in one
// batch; the runner owns the KV cache and any re-run of the step), samples the rows that reached
// their last known token, and reports a RequestOutput delta
// per request through its callback (detokenized, stop strings and stop ids applied, max_tokens and
// max_model_len enforced). Requests finish with "stop", "length" or "abort"; their KV blocks go
// back to the pool (full blocks stay in the prefix cache). Not thread-safe: AsyncEngine runs it on
// one thread. Batching is invisible: a request's tokens depend only on its own parameters, because
// the CPU kernels compute every output row independently and each request has its own sampler.
// A step's rows are sampled in parallel (up to 8 threads: a temperature draw over a large
// vocabulary takes milliseconds), then emitted in row order. When every row a step samples needs
// only its best logits (Sampler::top_width: greedy or top-k, no logit_bias, penalties or
// logprobs), the step asks the model for the best 1, 64 or kMaxTopLogits of each row (the
// smallest that covers them: few widths, few CUDA graphs) and samples from those, with the same
// tokens as from the whole rows; otherwise it copies the whole rows (docs/design.md, "Sampling").
// With speculative decoding (EngineConfig::speculative, engine/speculative.h) a decoding request's
// chunk is [last token, drafts]; its rows are sampled in order until a token differs from its
// draft (verify_drafts), and every token produced (accepted drafts and that token) goes out in one
// RequestOutput, cut at the first stop or length limit. Outputs are delivered after the step is
// settled. Tokens are those of a run without speculation, greedy or seeded.
#pragma once

#include "core/thread_pool.h"
#include "experts/expert_kpis.h"
#include "experts/fp4_kpis.h"
#include "engine/request.h"
#include "engine/scheduler.h"
#include "engine/speculative.h"
#include "engine/step_runner.h"
#include "models/model.h"
#include "tokenizer/tokenizer.h"

#include <functional>
#include <map>
#include <memory>
#include <optional>

namespace moet {

struct EngineConfig {
  int64_t max_num_seqs = 256;
  int64_t max_num_batched_tokens = 2048;
  int64_t max_model_len = 0;  // 0: the model's max_position_embeddings, lowered to what kv_cache_bytes holds
  int64_t block_size = 16;
  int64_t num_blocks = 0;     // 0: enough for max_num_seqs full-length sequences, within kv_cache_bytes
  int64_t kv_cache_bytes = int64_t(1) << 30;  // budget for the automatic num_blocks
  bool enable_prefix_caching = true;
  bool top_logits_sampling = true;  // false: always copy whole logit rows (same tokens, slower)
  SpeculativeConfig speculative;    // none by default
};

struct EngineStats {
  int64_t running = 0;
  int64_t waiting = 0;
  int64_t preemptions = 0;       // total so far
  int64_t computed_tokens = 0;   // total rows run through the model (prefill + decode)
  int64_t generated_tokens = 0;  // total tokens sampled
  int64_t top_logits_steps = 0;  // total steps sampled from their rows' best logits only
  KvPoolStats kv;
  std::optional<ExpertKpis> experts;  // the expert cache's, since start (tiered experts only)
  std::optional<SpeculativeStats> speculative;  // with speculative decoding
  int64_t kv_cache_tokens = 0;        // tokens the KV pool holds (blocks x block size)
  int64_t kv_bytes_per_token = 0;     // every layer's slots (the cache dtype's codes, scales, padding)
  std::optional<Fp4Kpis> fp4;         // the FP4 tier's and the gate's, since start (with an FP4 tier only)
};

using OutputCallback = std::function<void(RequestOutput&&)>;

class EngineCore {
 public:
  // tokenizer is optional (without one, outputs carry ids only and stop strings are refused).
  EngineCore(Model& model, std::optional<Tokenizer> tokenizer, const EngineConfig& config);
  ~EngineCore();

  // Throws moet::Error (a client mistake) for an empty prompt, ids outside the vocabulary,
  // prompt + max_tokens over max_model_len, bad sampling parameters. Thread-safe (reads config only).
  void validate(const RequestParams& params) const;
  void add(int64_t id, RequestParams params, OutputCallback on_output);
  // Finishes the request with "abort" and frees its blocks; unknown ids are ignored.
  void abort(int64_t id);
  bool has_work() const { return scheduler_.has_work(); }
  // Runs one step; returns the number of tokens it computed (0: nothing to do).
  int64_t step();

  EngineStats stats() const;
  const EngineConfig& config() const { return config_; }
  // The runner the steps go through (hooks are added here).
  StepRunner& runner() { return runner_; }

 private:
  struct Request;
  struct SampledChunk;
  // Samples a chunk's rows in order until a token is not the draft it verifies.
  void sample_chunk(SampledChunk& s, const StepOutcome& outcome, int64_t width) const;
  // Appends the step's tokens of a request up to the first that finishes it and returns its
  // output (with the last prompt position's logits, when asked); delivered later.
  RequestOutput append(Request& request, std::span<const SampleResult> samples, std::span<const float> prompt_logits);
  void finish(Request& request, RequestOutput& out, const std::string& reason);
  // Drafts the requests that go on may take (speculative decoding).
  int64_t max_drafts(const Request& request) const;

  Model& model_;
  std::optional<Tokenizer> tokenizer_;
  EngineConfig config_;
  KvBlockPool pool_;
  StepRunner runner_;
  std::unique_ptr<Speculator> speculator_;  // with speculative decoding
  Scheduler scheduler_;
  std::map<int64_t, std::unique_ptr<Request>> requests_;
  ThreadPool sampling_pool_;
  int64_t preemptions_ = 0;
  int64_t computed_tokens_ = 0;
  int64_t generated_tokens_ = 0;
  int64_t top_logits_steps_ = 0;
};

// Fills in config's zeros from the model (max_model_len, num_blocks) and checks the rest.
EngineConfig engine_config_resolve(const Model& model, EngineConfig config);

}  // namespace moet
