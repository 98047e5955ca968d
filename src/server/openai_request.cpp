// OpenAI request parsing (see openai_request.h).
#include "server/openai_request.h"

#include "server/api_error.h"
#include "server/chat_prompt.h"
#include "server/reasoning_parser.h"
#include "server/structured_output.h"

#include <algorithm>
#include <cmath>
#include <mutex>
#include <random>

namespace moet::server {
namespace {

uint64_t random_seed() {
  static std::mutex mutex;
  static std::mt19937_64 rng{std::random_device{}()};
  std::lock_guard lock(mutex);
  return rng();
}

template <typename... Args>
void require(bool ok, const char* param, fmt::format_string<Args...> format, Args&&... args) {
  if (!ok) throw ApiError(400, fmt::format(format, std::forward<Args>(args)...), param);
}

int64_t vocab_size(const ServerContext& ctx) { return int64_t(ctx.tokenizer.vocab_size()); }

std::unordered_map<int32_t, float> parse_logit_bias(const Json& body, int64_t vocab) {
  std::unordered_map<int32_t, float> bias;
  const Json* object = json_object(body, "logit_bias");
  if (!object) return bias;
  for (const auto& [key, value] : object->items()) {
    size_t used = 0;
    long id = -1;
    try {
      id = std::stol(key, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    require(used == key.size() && id >= 0 && id < vocab, "logit_bias",
            "logit_bias keys must be token ids in [0, {}) (got '{}')", vocab, key);
    require(value.is_number(), "logit_bias", "logit_bias values must be numbers (token {})", key);
    const double v = value.get<double>();
    require(v >= -100.0 && v <= 100.0, "logit_bias", "logit_bias values must be in [-100, 100] (token {}: {})", key, v);
    bias[int32_t(id)] = float(v);
  }
  return bias;
}

// Fields moet does not implement: a 400 naming them rather than a silent difference.
void reject_unsupported(const Json& body, bool chat) {
  if (!chat) {
    require(!json_has(body, "suffix"), "suffix", "'suffix' (insertion) is not supported");
    if (json_has(body, "best_of")) {
      const int64_t best_of = json_int(body, "best_of", 1);
      require(best_of == json_int(body, "n", 1), "best_of",
              "best_of must equal n (got {}): ranking extra samples is not supported", best_of);
    }
  }
  require(!json_has(body, "guided_grammar"), "guided_grammar",
          "guided_grammar is not supported; use guided_json, guided_regex, guided_choice or response_format");
}

// The fields shared by both endpoints; prompt, max_tokens and logprobs are set by the caller.
RequestParams parse_common(const Json& body, const ServerContext& ctx) {
  RequestParams p;
  SamplingParams& s = p.sampling;
  const SamplingParams& d = ctx.options.default_sampling;
  const int64_t vocab = vocab_size(ctx);
  s.temperature = float(json_number(body, "temperature", d.temperature));
  require(std::isfinite(s.temperature) && s.temperature >= 0.0f, "temperature", "temperature must be >= 0 (got {})",
          s.temperature);
  s.top_p = float(json_number(body, "top_p", d.top_p));
  require(s.top_p > 0.0f && s.top_p <= 1.0f, "top_p", "top_p must be in (0, 1] (got {})", s.top_p);
  s.top_k = json_int(body, "top_k", d.top_k);
  require(s.top_k >= -1, "top_k", "top_k must be -1 or 0 (all tokens) or positive (got {})", s.top_k);
  if (s.top_k < 0) s.top_k = 0;  // vLLM: -1 means all
  s.min_p = float(json_number(body, "min_p", d.min_p));
  require(s.min_p >= 0.0f && s.min_p <= 1.0f, "min_p", "min_p must be in [0, 1] (got {})", s.min_p);
  s.repetition_penalty = float(json_number(body, "repetition_penalty", d.repetition_penalty));
  require(s.repetition_penalty > 0.0f, "repetition_penalty", "repetition_penalty must be > 0 (got {})",
          s.repetition_penalty);
  for (const char* key : {"presence_penalty", "frequency_penalty"}) {
    const double v = json_number(body, key, 0.0);
    require(v >= -2.0 && v <= 2.0, key, "{} must be in [-2, 2] (got {})", key, v);
  }
  s.presence_penalty = float(json_number(body, "presence_penalty", 0.0));
  s.frequency_penalty = float(json_number(body, "frequency_penalty", 0.0));
  s.logit_bias = parse_logit_bias(body, vocab);
  s.seed = json_has(body, "seed") ? uint64_t(json_int(body, "seed", 0)) : random_seed();
  p.stop = json_string_or_list(body, "stop");
  for (const std::string& stop : p.stop) require(!stop.empty(), "stop", "stop strings must not be empty");
  if (const Json* ids = json_array(body, "stop_token_ids")) {
    for (const Json& id : *ids) {
      require(id.is_number_integer(), "stop_token_ids", "stop_token_ids must be integers");
      const int64_t v = id.get<int64_t>();
      require(v >= 0 && v < vocab, "stop_token_ids", "stop_token_ids: {} is outside the vocabulary [0, {})", v, vocab);
      p.stop_ids.push_back(int32_t(v));
    }
  }
  if (!json_bool(body, "ignore_eos", false)) p.stop_ids.insert(p.stop_ids.end(), ctx.eos_ids.begin(), ctx.eos_ids.end());
  p.skip_special_tokens = json_bool(body, "skip_special_tokens", true);
  return p;
}

// Runs the engine's own checks now, so a bad request fails before anything is queued; the
// length checks first, so their errors name the field.
void validate(const GenerationJob& job, const ServerContext& ctx, const char* prompt_field,
              const char* max_tokens_field) {
  const int64_t limit = ctx.max_model_len(), vocab = vocab_size(ctx);
  for (const RequestParams& p : job.requests) {
    const int64_t len = int64_t(p.prompt.size());
    require(len > 0, prompt_field, "the prompt is empty");
    for (int32_t id : p.prompt)
      require(id >= 0 && id < vocab, prompt_field, "prompt token id {} is outside the vocabulary [0, {})", id, vocab);
    require(len < limit, prompt_field, "the prompt has {} tokens but this model's maximum context length is {} tokens",
            len, limit);
    require(len + p.max_tokens <= limit, max_tokens_field,
            "this model's maximum context length is {} tokens; the request has {} prompt tokens and asks for {} "
            "more ({}); reduce the prompt or {}", limit, len, p.max_tokens, max_tokens_field, max_tokens_field);
    try {
      ctx.engine.validate(p);
    } catch (const Error& e) {
      throw ApiError(400, e.what());
    }
  }
}

void parse_job_common(const Json& body, const ServerContext& ctx, GenerationJob& job) {
  if (!body.is_object()) throw ApiError(400, "the request body must be a JSON object");
  check_model(body, ctx);
  reject_unsupported(body, job.chat);
  job.model = ctx.model_name();
  job.n = json_int(body, "n", 1);
  if (job.n < 1 || job.n > 128) bad_request("n", "n must be in [1, 128] (got {})", job.n);
  job.stream = json_bool(body, "stream", false);
  if (const Json* options = json_object(body, "stream_options")) job.include_usage = json_bool(*options, "include_usage", false);
}

// A constrained request ends with an end token once its grammar is complete, whatever ignore_eos.
void constrain(RequestParams& base, std::shared_ptr<const TokenConstraint> constraint, const ServerContext& ctx) {
  if (!constraint) return;
  base.sampling.constraint = std::move(constraint);
  for (int32_t id : ctx.eos_ids)
    if (std::find(base.stop_ids.begin(), base.stop_ids.end(), id) == base.stop_ids.end()) base.stop_ids.push_back(id);
}

// One request per (prompt, sample); seeds differ per sample so n > 1 gives n different choices.
void expand(GenerationJob& job, const RequestParams& base, const std::vector<std::vector<int32_t>>& prompts,
            int64_t max_tokens) {
  for (const auto& prompt : prompts) {
    for (int64_t j = 0; j < job.n; ++j) {
      RequestParams p = base;
      p.prompt = prompt;
      p.max_tokens = max_tokens;
      p.sampling.seed = base.sampling.seed + uint64_t(j);
      job.requests.push_back(std::move(p));
    }
  }
}

int64_t parse_max_tokens(const Json& body, const char* key, int64_t fallback) {
  const int64_t v = json_int(body, key, fallback);
  if (v <= 0) bad_request(key, "{} must be at least 1 (got {})", key, v);
  return v;
}

int64_t parse_logprobs_count(const Json& body, const char* key) {
  const int64_t v = json_int(body, key, 0);
  require(v >= 0 && v <= 20, key, "{} must be in [0, 20] (got {})", key, v);
  return v;
}

}  // namespace

void check_model(const Json& body, const ServerContext& ctx) {
  if (body.contains("model") && !body["model"].is_string())
    bad_request("model", "'model' must be a string naming a served model (got {})", body["model"].type_name());
  const std::string model = json_string(body, "model", "");
  const auto& names = ctx.options.served_model_names;
  if (!model.empty() && std::find(names.begin(), names.end(), model) == names.end())
    throw ApiError(404, fmt::format("The model `{}` does not exist.", model), "model", "model_not_found");
}

GenerationJob parse_completion_request(const Json& body, const ServerContext& ctx) {
  GenerationJob job;
  parse_job_common(body, ctx, job);
  if (!json_has(body, "prompt")) bad_request("prompt", "'prompt' is required");
  const Json& prompt = body.at("prompt");
  std::vector<std::vector<int32_t>> prompts;
  auto add_text = [&](const Json& text) { prompts.push_back(ctx.tokenizer.encode(text.get<std::string>(), true)); };
  auto add_ids = [&](const Json& ids) {
    std::vector<int32_t> out;
    for (const Json& id : ids) {
      if (!id.is_number_integer()) bad_request("prompt", "token prompts must be arrays of integers");
      out.push_back(id.get<int32_t>());
    }
    prompts.push_back(std::move(out));
  };
  if (prompt.is_string()) {
    add_text(prompt);
  } else if (prompt.is_array() && !prompt.empty() && prompt[0].is_number_integer()) {
    add_ids(prompt);
  } else if (prompt.is_array() && !prompt.empty()) {
    for (const Json& item : prompt) {
      if (item.is_string()) add_text(item);
      else if (item.is_array()) add_ids(item);
      else bad_request("prompt", "'prompt' must be a string, an array of strings, or token id arrays");
    }
  } else {
    bad_request("prompt", "'prompt' must be a non-empty string, array of strings, or token id array");
  }
  RequestParams base = parse_common(body, ctx);
  if (json_has(body, "logprobs")) base.sampling.logprobs = parse_logprobs_count(body, "logprobs");
  job.echo = json_bool(body, "echo", false);
  require(!job.echo || base.sampling.logprobs < 0, "echo",
          "echo with logprobs needs the prompt's logprobs, which moet does not compute; drop one of them");
  constrain(base, structured_output(body, nullptr, false, false, ctx), ctx);
  expand(job, base, prompts, parse_max_tokens(body, "max_tokens", 16));
  validate(job, ctx, "prompt", "max_tokens");
  return job;
}

GenerationJob parse_chat_request(const Json& body, const ServerContext& ctx) {
  GenerationJob job;
  job.chat = true;
  parse_job_common(body, ctx, job);
  const ChatPrompt chat = render_chat_prompt(body, ctx);
  RequestParams base = parse_common(body, ctx);
  const bool logprobs = json_bool(body, "logprobs", false);
  require(logprobs || !json_has(body, "top_logprobs"), "top_logprobs", "top_logprobs needs logprobs: true");
  if (logprobs) base.sampling.logprobs = parse_logprobs_count(body, "top_logprobs");
  const std::vector<int32_t> prompt = ctx.tokenizer.encode(chat.text, false);
  const bool opens_reasoning = ctx.reasoning && prompt_opens_reasoning(chat.text);
  constrain(base, structured_output(body, &chat, ctx.reasoning, opens_reasoning, ctx), ctx);
  const int64_t room = std::max<int64_t>(1, ctx.max_model_len() - int64_t(prompt.size()));
  const char* key = json_has(body, "max_completion_tokens") ? "max_completion_tokens" : "max_tokens";
  expand(job, base, {prompt}, parse_max_tokens(body, key, room));
  job.parse_tools = chat.has_tools && ctx.tool_parser != nullptr;
  job.parse_reasoning = ctx.reasoning;
  job.reasoning_starts_inside = opens_reasoning;
  validate(job, ctx, "messages", key);
  return job;
}

}  // namespace moet::server
