// EngineCore implementation (see engine_core.h).
#include "engine/engine_core.h"

#include "core/error.h"
#include "core/log.h"
#include "engine/stop_matcher.h"
#include "tokenizer/detokenizer.h"

#include <algorithm>
#include <chrono>
#include <exception>
#include <thread>

namespace moet {
namespace {

constexpr unsigned kSamplingThreads = 8;  // rows of a step sampled at once

// Candidate widths a step may ask for, smallest first (each a CUDA graph per batch shape).
constexpr int64_t kTopWidths[] = {1, 64, kMaxTopLogits};

double now_seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

}  // namespace

struct EngineCore::Request {
  Sequence seq;
  RequestParams params;
  Sampler sampler;
  std::optional<IncrementalDetokenizer> detokenizer;
  StopMatcher stop;
  OutputCallback on_output;
  int64_t max_len = 0;  // prompt + max_tokens, capped by max_model_len

  Request(RequestParams p, OutputCallback cb)
      : params(std::move(p)), sampler(params.sampling), stop(params.stop), on_output(std::move(cb)) {}
};

EngineConfig engine_config_resolve(const Model& model, EngineConfig config) {
  const ModelConfig& mc = model.config();
  if (config.max_model_len <= 0) config.max_model_len = mc.max_position_embeddings;
  MOET_CHECK(config.max_model_len <= mc.max_position_embeddings,
             "max_model_len {} exceeds the model's max_position_embeddings {}", config.max_model_len,
             mc.max_position_embeddings);
  MOET_CHECK(config.block_size > 0, "block_size must be positive (got {})", config.block_size);
  const int64_t per_seq = (config.max_model_len + config.block_size - 1) / config.block_size;
  if (config.num_blocks <= 0) {
    const int64_t block_bytes =
        std::max<int64_t>(1, kv_bytes_per_token(model.kv_layer_specs()) * config.block_size);
    config.num_blocks = std::max<int64_t>(per_seq, std::min(per_seq * config.max_num_seqs,
                                                            config.kv_cache_bytes / block_bytes));
  }
  MOET_CHECK(config.num_blocks >= per_seq,
             "{} KV blocks of {} tokens cannot hold one sequence of max_model_len {}; raise the block count "
             "or lower max_model_len",
             config.num_blocks, config.block_size, config.max_model_len);
  return config;
}

EngineCore::EngineCore(Model& model, std::optional<Tokenizer> tokenizer, const EngineConfig& config)
    : model_(model),
      tokenizer_(std::move(tokenizer)),
      config_(engine_config_resolve(model, config)),
      pool_(config_.num_blocks, config_.block_size, config_.enable_prefix_caching),
      runner_(model, config_.num_blocks, config_.block_size),
      scheduler_({config_.max_num_seqs, config_.max_num_batched_tokens}, pool_),
      sampling_pool_(int(std::min(kSamplingThreads, std::max(1u, std::thread::hardware_concurrency())))) {}

EngineCore::~EngineCore() = default;

void EngineCore::validate(const RequestParams& params) const {
  const int64_t vocab = model_.config().vocab_size;
  const int64_t prompt_len = int64_t(params.prompt.size());
  MOET_CHECK(prompt_len > 0, "the prompt is empty");
  for (int32_t id : params.prompt)
    MOET_CHECK(id >= 0 && id < vocab, "prompt token id {} is outside the vocabulary [0, {})", id, vocab);
  MOET_CHECK(params.max_tokens > 0, "max_tokens must be positive (got {})", params.max_tokens);
  MOET_CHECK(prompt_len < config_.max_model_len,
             "the prompt has {} tokens but this model's maximum context length is {} tokens", prompt_len,
             config_.max_model_len);
  MOET_CHECK(prompt_len + params.max_tokens <= config_.max_model_len,
             "this model's maximum context length is {} tokens; the request has {} prompt tokens and asks for "
             "{} more (max_tokens); reduce the prompt or max_tokens",
             config_.max_model_len, prompt_len, params.max_tokens);
  MOET_CHECK(params.stop.empty() || tokenizer_.has_value(), "stop strings need a model with a tokenizer");
  for (const auto& s : params.stop) MOET_CHECK(!s.empty(), "stop strings must not be empty");
  params.sampling.validate(vocab);
}

void EngineCore::add(int64_t id, RequestParams params, OutputCallback on_output) {
  validate(params);
  MOET_CHECK(!requests_.count(id), "request id {} is already in use", id);
  auto request = std::make_unique<Request>(std::move(params), std::move(on_output));
  Request& r = *request;
  r.seq.id = id;
  r.seq.tokens = r.params.prompt;
  r.seq.prompt_len = int64_t(r.params.prompt.size());
  r.max_len = r.seq.prompt_len + r.params.max_tokens;
  if (tokenizer_) r.detokenizer.emplace(*tokenizer_, r.params.skip_special_tokens);
  scheduler_.add(&r.seq);
  requests_.emplace(id, std::move(request));
}

void EngineCore::finish(Request& request, RequestOutput& out, const std::string& reason) {
  if (!request.stop.stopped()) {  // flush held-back text, unless a stop string cut it off
    if (request.detokenizer) out.text += request.stop.push(request.detokenizer->finish());
    out.text += request.stop.finish();
  }
  out.finished = true;
  out.finish_reason = reason;
  out.stop_reason = request.stop.matched();
  scheduler_.remove(&request.seq);
}

void EngineCore::abort(int64_t id) {
  auto it = requests_.find(id);
  if (it == requests_.end()) return;
  Request& r = *it->second;
  RequestOutput out;
  out.prompt_tokens = r.seq.prompt_len;
  out.completion_tokens = int64_t(r.seq.tokens.size()) - r.seq.prompt_len;
  out.cached_tokens = r.seq.num_cached;
  out.time = now_seconds();
  out.finished = true;
  out.finish_reason = "abort";
  scheduler_.remove(&r.seq);
  OutputCallback callback = std::move(r.on_output);
  requests_.erase(it);
  callback(std::move(out));
}

void EngineCore::emit(Request& r, const SampleResult& sample, std::span<const float> prompt_logits) {
  r.seq.tokens.push_back(sample.token);
  RequestOutput out;
  out.prompt_logits.assign(prompt_logits.begin(), prompt_logits.end());
  out.token_ids.push_back(sample.token);
  if (r.params.sampling.logprobs >= 0) out.logprobs.push_back(sample);
  out.prompt_tokens = r.seq.prompt_len;
  out.completion_tokens = int64_t(r.seq.tokens.size()) - r.seq.prompt_len;
  out.cached_tokens = r.seq.num_cached;
  const bool stop_id = std::find(r.params.stop_ids.begin(), r.params.stop_ids.end(), sample.token) !=
                       r.params.stop_ids.end();
  if (stop_id) {
    finish(r, out, "stop");
  } else {
    if (r.detokenizer) out.text = r.stop.push(r.detokenizer->push(sample.token));
    if (r.stop.stopped()) {
      finish(r, out, "stop");
    } else if (int64_t(r.seq.tokens.size()) >= std::min(r.max_len, config_.max_model_len)) {
      finish(r, out, "length");
    }
  }
  out.time = now_seconds();
  const bool finished = out.finished;
  r.on_output(std::move(out));
  if (finished) requests_.erase(r.seq.id);
}

int64_t EngineCore::step() {
  StepPlan plan = scheduler_.schedule();
  preemptions_ += int64_t(plan.preempted.size());
  for (int64_t id : plan.preempted) MOET_LOG_INFO("preempted request {} (KV cache full); it will be recomputed", id);
  if (plan.chunks.empty()) return 0;
  const int64_t vocab = model_.config().vocab_size;
  std::vector<Request*> sampled;  // logit row i is sampled[i]'s (the chunks that sample, in order)
  for (const ScheduledChunk& chunk : plan.chunks)
    if (chunk.samples()) sampled.push_back(requests_.at(chunk.seq->id).get());
  // The fewest best logits per row that every sampled row can be drawn from (0: whole rows).
  int64_t width = config_.top_logits_sampling && !sampled.empty() ? 1 : 0;
  for (size_t i = 0; i < sampled.size() && width > 0; ++i) {
    const Request& r = *sampled[i];
    const bool wants_prompt_logits = r.params.prompt_logits && int64_t(r.seq.tokens.size()) == r.seq.prompt_len;
    const int64_t need = wants_prompt_logits ? 0 : Sampler::top_width(r.params.sampling, vocab);
    const auto fit = std::find_if(std::begin(kTopWidths), std::end(kTopWidths), [&](int64_t w) { return w >= need; });
    width = need == 0 || fit == std::end(kTopWidths) ? 0 : std::max(width, std::min(*fit, vocab));
  }
  plan.top_logits = width;
  const StepOutcome outcome = runner_.run(plan);
  const std::vector<float>& logits = outcome.output.logits;
  const TopLogits& top = outcome.output.top;
  if (width > 0) ++top_logits_steps_;
  scheduler_.complete(plan);
  computed_tokens_ += plan.num_tokens;
  generated_tokens_ += int64_t(sampled.size());
  // Each row with its own request's sampler, so rows may run on any thread; emitted in order.
  std::vector<SampleResult> results(sampled.size());
  std::vector<std::exception_ptr> errors(sampled.size());
  const auto sample_rows = [&](size_t begin, size_t end) {
    for (size_t i = begin; i < end; ++i) {
      try {
        Request& r = *sampled[i];
        if (width > 0) {
          results[i] = r.sampler.sample_top(top.values.data() + i * size_t(width), top.ids.data() + i * size_t(width),
                                            width, vocab);
          continue;
        }
        const auto prompt = std::span<const int32_t>(r.seq.tokens).first(size_t(r.seq.prompt_len));
        const auto output = std::span<const int32_t>(r.seq.tokens).subspan(size_t(r.seq.prompt_len));
        results[i] = r.sampler.sample(logits.data() + i * size_t(vocab), vocab, prompt, output);
      } catch (...) {
        errors[i] = std::current_exception();
      }
    }
  };
  if (sampled.size() > 1) {
    sampling_pool_.parallel_for(sampled.size(), sample_rows);
  } else {
    sample_rows(0, sampled.size());
  }
  for (const std::exception_ptr& error : errors)
    if (error) std::rethrow_exception(error);
  for (size_t i = 0; i < sampled.size(); ++i) {
    Request& r = *sampled[i];
    const bool first = int64_t(r.seq.tokens.size()) == r.seq.prompt_len;
    const bool keep = r.params.prompt_logits && first;
    emit(r, results[i], keep ? std::span<const float>(logits).subspan(i * size_t(vocab), size_t(vocab))
                             : std::span<const float>());
  }
  return plan.num_tokens;
}

EngineStats EngineCore::stats() const {
  EngineStats s{scheduler_.num_running(), scheduler_.num_waiting(), preemptions_, computed_tokens_, generated_tokens_,
                top_logits_steps_, pool_.stats(), std::nullopt, std::nullopt};
  if (const ExpertResidency* residency = model_.experts().residency()) s.experts = residency->kpis();
  if (const Fp4Tier* tier = model_.experts().fp4_tier()) s.fp4 = fp4_tier_kpis(*tier);
  return s;
}

}  // namespace moet
