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

namespace {

// KV slots a sequence may hold beyond its tokens: where the next drafts are written.
int64_t lookahead_tokens(const EngineConfig& config) {
  return config.speculative.enabled() ? config.speculative.num_speculative_tokens : 0;
}

// MTP: a prefix hit keeps a block only where the MTP layer's entries hold (Speculator::prefix_valid).
SchedulerConfig scheduler_config(const EngineConfig& config, const Speculator* speculator) {
  SchedulerConfig out{config.max_num_seqs, config.max_num_batched_tokens, lookahead_tokens(config), {}};
  if (config.speculative.method == SpeculativeConfig::Method::mtp)
    out.prefix_check = [speculator](int32_t block, int32_t next) { return speculator->prefix_valid(block, next); };
  return out;
}

}  // namespace

EngineConfig engine_config_resolve(const Model& model, EngineConfig config) {
  const ModelConfig& mc = model.config();
  const bool len_given = config.max_model_len > 0;
  if (!len_given) config.max_model_len = mc.max_position_embeddings;
  MOET_CHECK(config.max_model_len <= mc.max_position_embeddings,
             "max_model_len {} exceeds the model's max_position_embeddings {}", config.max_model_len,
             mc.max_position_embeddings);
  MOET_CHECK(config.block_size > 0, "block_size must be positive (got {})", config.block_size);
  MOET_CHECK(config.speculative.method != SpeculativeConfig::Method::mtp || model.has_mtp(),
             "--speculative-config method mtp: the model was loaded without its MTP layer");
  const int64_t token_bytes = kv_bytes_per_token(model.kv_layer_specs());
  const int64_t block_bytes = std::max<int64_t>(1, token_bytes * config.block_size);
  // A sequence's blocks: its tokens and the slots where its next drafts are written.
  const auto blocks_for = [&](int64_t tokens) {
    return (tokens + lookahead_tokens(config) + config.block_size - 1) / config.block_size;
  };
  if (config.num_blocks <= 0) {
    config.num_blocks =
        std::min(blocks_for(config.max_model_len) * config.max_num_seqs, config.kv_cache_bytes / block_bytes);
    // The model's window by default, lowered to what the budget holds; a length asked for is not.
    const int64_t held = config.num_blocks * config.block_size - lookahead_tokens(config);
    if (!len_given && held > 0 && held < config.max_model_len) {
      MOET_LOG_WARN("max_model_len lowered from the model's {} to {} tokens: the KV cache budget of {} bytes holds "
                    "{} tokens at {} bytes per token",
                    config.max_model_len, held, config.kv_cache_bytes, config.num_blocks * config.block_size,
                    token_bytes);
      config.max_model_len = held;
    }
  }
  const int64_t per_seq = blocks_for(config.max_model_len);
  MOET_CHECK(config.num_blocks >= per_seq,
             "max_model_len {} needs {} KV blocks of {} tokens ({} bytes per token: {:.1f} MiB), but the KV pool "
             "holds {} blocks ({} tokens); raise --kv-cache-memory-bytes or --num-kv-blocks, lower --max-model-len "
             "or pick a smaller --kv-cache-dtype",
             config.max_model_len, per_seq, config.block_size, token_bytes,
             double(per_seq * block_bytes) / double(1 << 20), config.num_blocks, config.num_blocks * config.block_size);
  return config;
}

EngineCore::EngineCore(Model& model, std::optional<Tokenizer> tokenizer, const EngineConfig& config)
    : model_(model),
      tokenizer_(std::move(tokenizer)),
      config_(engine_config_resolve(model, config)),
      pool_(config_.num_blocks, config_.block_size, config_.enable_prefix_caching),
      runner_(model, config_.num_blocks, config_.block_size),
      speculator_(config_.speculative.enabled()
                      ? std::make_unique<Speculator>(config_.speculative, runner_, config_.num_blocks)
                      : nullptr),
      scheduler_(scheduler_config(config_, speculator_.get()), pool_),
      sampling_pool_(int(std::min(kSamplingThreads, std::max(1u, std::thread::hardware_concurrency())))) {
  // A verify row must compute the bits of the decode step it replaces (step_runner.h).
  runner_.set_row_invariant(speculator_ != nullptr);
  runner_.set_speculative_graphs(speculator_ != nullptr && config_.speculative.graph_steps);
}

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

RequestOutput EngineCore::append(Request& r, std::span<const SampleResult> samples,
                                 std::span<const float> prompt_logits) {
  RequestOutput out;
  out.prompt_logits.assign(prompt_logits.begin(), prompt_logits.end());
  for (const SampleResult& sample : samples) {
    r.seq.tokens.push_back(sample.token);
    out.token_ids.push_back(sample.token);
    if (r.params.sampling.logprobs >= 0) out.logprobs.push_back(sample);
    const bool stop_id = std::find(r.params.stop_ids.begin(), r.params.stop_ids.end(), sample.token) !=
                         r.params.stop_ids.end();
    if (stop_id) {
      finish(r, out, "stop");
      break;
    }
    if (r.detokenizer) out.text += r.stop.push(r.detokenizer->push(sample.token));
    if (r.stop.stopped()) {
      finish(r, out, "stop");
      break;
    }
    if (int64_t(r.seq.tokens.size()) >= std::min(r.max_len, config_.max_model_len)) {
      finish(r, out, "length");
      break;
    }
  }
  out.prompt_tokens = r.seq.prompt_len;
  out.completion_tokens = int64_t(r.seq.tokens.size()) - r.seq.prompt_len;
  out.cached_tokens = r.seq.num_cached;
  return out;
}

int64_t EngineCore::max_drafts(const Request& r) const {
  const int64_t room = std::min(r.max_len, config_.max_model_len) - int64_t(r.seq.tokens.size());
  return std::clamp<int64_t>(room - 1, 0, config_.speculative.num_speculative_tokens);
}

// A chunk that samples: its request, its logit rows [first_row, first_row + 1 + drafts) and what
// they gave (accepted drafts, then the bonus token).
struct EngineCore::SampledChunk {
  Request* request = nullptr;
  size_t chunk = 0;
  size_t first_row = 0;
  int64_t drafts = 0;
  std::vector<SampleResult> results;
};

void EngineCore::sample_chunk(SampledChunk& s, const StepOutcome& outcome, int64_t width) const {
  Request& r = *s.request;
  const int64_t vocab = model_.config().vocab_size;
  const std::span<const int32_t> tokens(r.seq.tokens);
  const size_t known = tokens.size() - size_t(s.drafts);  // tokens before the drafts
  s.results = verify_drafts(tokens.subspan(known), [&](size_t i) {
    const size_t row = s.first_row + i;
    if (width > 0) {
      const TopLogits& top = outcome.output.top;
      return r.sampler.sample_top(top.values.data() + row * size_t(width), top.ids.data() + row * size_t(width), width,
                                  vocab);
    }
    // Row i's context ends with drafts 1 .. i (the tokens it follows, when they are accepted).
    const auto prompt = tokens.first(size_t(r.seq.prompt_len));
    const auto output = tokens.subspan(size_t(r.seq.prompt_len), known + i - size_t(r.seq.prompt_len));
    return r.sampler.sample(outcome.output.logits.data() + row * size_t(vocab), vocab, prompt, output);
  });
}

int64_t EngineCore::step() {
  StepPlan plan = scheduler_.schedule();
  preemptions_ += int64_t(plan.preempted.size());
  for (int64_t id : plan.preempted) MOET_LOG_INFO("preempted request {} (KV cache full); it will be recomputed", id);
  if (plan.chunks.empty()) return 0;
  if (speculator_) speculator_->prepare(plan);
  const int64_t vocab = model_.config().vocab_size;
  std::vector<SampledChunk> sampled;  // the chunks that sample, in order; their logit rows follow each other
  size_t rows = 0;
  for (size_t c = 0; c < plan.chunks.size(); ++c) {
    const ScheduledChunk& chunk = plan.chunks[c];
    if (!chunk.samples()) continue;
    sampled.push_back({requests_.at(chunk.seq->id).get(), c, rows, chunk.seq->num_draft_tokens, {}});
    rows += size_t(1 + chunk.seq->num_draft_tokens);
  }
  // The fewest best logits per row that every sampled row can be drawn from (0: whole rows).
  int64_t width = config_.top_logits_sampling && !sampled.empty() ? 1 : 0;
  for (size_t i = 0; i < sampled.size() && width > 0; ++i) {
    const Request& r = *sampled[i].request;
    const bool wants_prompt_logits = r.params.prompt_logits && int64_t(r.seq.tokens.size()) == r.seq.prompt_len;
    const int64_t need = wants_prompt_logits ? 0 : Sampler::top_width(r.params.sampling, vocab);
    const auto fit = std::find_if(std::begin(kTopWidths), std::end(kTopWidths), [&](int64_t w) { return w >= need; });
    width = need == 0 || fit == std::end(kTopWidths) ? 0 : std::max(width, std::min(*fit, vocab));
  }
  plan.top_logits = width;
  const StepOutcome outcome = runner_.run(plan);
  if (width > 0) ++top_logits_steps_;
  computed_tokens_ += plan.num_tokens;
  // Each chunk with its own request's sampler, so chunks may run on any thread; emitted in order.
  std::vector<std::exception_ptr> errors(sampled.size());
  const auto sample_chunks = [&](size_t begin, size_t end) {
    for (size_t i = begin; i < end; ++i) {
      try {
        sample_chunk(sampled[i], outcome, width);
      } catch (...) {
        errors[i] = std::current_exception();
      }
    }
  };
  if (sampled.size() > 1) {
    sampling_pool_.parallel_for(sampled.size(), sample_chunks);
  } else {
    sample_chunks(0, sampled.size());
  }
  for (const std::exception_ptr& error : errors)
    if (error) std::rethrow_exception(error);
  // Settle: drafts leave the tokens (the accepted come back as sampled tokens), rejected
  // positions are not computed, and each request's tokens are appended up to a finish.
  std::vector<std::pair<Request*, RequestOutput>> outputs;
  for (SampledChunk& s : sampled) {
    Request& r = *s.request;
    if (s.drafts > 0) {
      const int64_t accepted = int64_t(s.results.size()) - 1;
      speculator_->record(s.drafts, accepted);
      r.seq.tokens.resize(r.seq.tokens.size() - size_t(s.drafts));
      r.seq.num_draft_tokens = 0;
      plan.chunks[s.chunk].count -= s.drafts - accepted;
    }
    const bool keep = r.params.prompt_logits && int64_t(r.seq.tokens.size()) == r.seq.prompt_len;
    const auto logits = keep ? std::span<const float>(outcome.output.logits).subspan(s.first_row * size_t(vocab),
                                                                                      size_t(vocab))
                             : std::span<const float>();
    outputs.emplace_back(&r, append(r, s.results, logits));
    generated_tokens_ += int64_t(outputs.back().second.token_ids.size());
  }
  for (ScheduledChunk& chunk : plan.chunks)  // a stop inside an accepted run keeps fewer positions
    chunk.count = std::min(chunk.count, int64_t(chunk.seq->tokens.size()) - chunk.begin);
  scheduler_.complete(plan);
  if (speculator_) {
    std::vector<DraftRequest> drafting;
    size_t next_sampled = 0;
    for (size_t c = 0; c < plan.chunks.size(); ++c) {
      const bool samples = next_sampled < sampled.size() && sampled[next_sampled].chunk == c;
      const Request* r = samples ? sampled[next_sampled].request : nullptr;
      const bool finished = samples && outputs[next_sampled++].second.finished;
      if (!finished) drafting.push_back({c, r ? max_drafts(*r) : 0});
    }
    speculator_->propose(plan, outcome, drafting);
  }
  for (auto& [r, out] : outputs) {
    const int64_t id = r->seq.id;
    const bool finished = out.finished;
    if (finished) scheduler_.remove(&r->seq);
    out.time = now_seconds();
    r->on_output(std::move(out));
    if (finished) requests_.erase(id);
  }
  return plan.num_tokens;
}

EngineStats EngineCore::stats() const {
  EngineStats s{scheduler_.num_running(), scheduler_.num_waiting(), preemptions_, computed_tokens_, generated_tokens_,
                top_logits_steps_, pool_.stats(), std::nullopt, std::nullopt};
  if (const ExpertResidency* residency = model_.experts().residency()) s.experts = residency->kpis();
  if (speculator_) s.speculative = speculator_->stats();
  s.kv_cache_tokens = config_.num_blocks * config_.block_size;
  s.kv_bytes_per_token = kv_bytes_per_token(model_.kv_layer_specs());
  if (const Fp4Tier* tier = model_.experts().fp4_tier()) s.fp4 = fp4_tier_kpis(*tier);
  return s;
}

}  // namespace moet
