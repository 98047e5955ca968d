// OpenAI request parsing (see openai_request.h).
#include "server/openai_request.h"

#include "server/api_error.h"
#include "server/chat_prompt.h"
#include "server/reasoning_parser.h"

#include <algorithm>
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

std::unordered_map<int32_t, float> parse_logit_bias(const Json& body) {
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
    if (used != key.size() || id < 0 || id > INT32_MAX)
      bad_request("logit_bias", "logit_bias keys must be token ids (got '{}')", key);
    if (!value.is_number()) bad_request("logit_bias", "logit_bias values must be numbers (token {})", key);
    bias[int32_t(id)] = value.get<float>();
  }
  return bias;
}

// The fields shared by both endpoints; prompt, max_tokens and logprobs are set by the caller.
RequestParams parse_common(const Json& body, const ServerContext& ctx) {
  RequestParams p;
  SamplingParams& s = p.sampling;
  const SamplingParams& d = ctx.options.default_sampling;
  s.temperature = float(json_number(body, "temperature", d.temperature));
  s.top_p = float(json_number(body, "top_p", d.top_p));
  s.top_k = json_int(body, "top_k", d.top_k);
  if (s.top_k < 0) s.top_k = 0;  // vLLM: -1 means all
  s.min_p = float(json_number(body, "min_p", d.min_p));
  s.repetition_penalty = float(json_number(body, "repetition_penalty", d.repetition_penalty));
  s.presence_penalty = float(json_number(body, "presence_penalty", 0.0));
  s.frequency_penalty = float(json_number(body, "frequency_penalty", 0.0));
  s.logit_bias = parse_logit_bias(body);
  s.seed = json_has(body, "seed") ? uint64_t(json_int(body, "seed", 0)) : random_seed();
  p.stop = json_string_or_list(body, "stop");
  if (const Json* ids = json_array(body, "stop_token_ids")) {
    for (const Json& id : *ids) {
      if (!id.is_number_integer()) bad_request("stop_token_ids", "stop_token_ids must be integers");
      p.stop_ids.push_back(id.get<int32_t>());
    }
  }
  if (!json_bool(body, "ignore_eos", false)) p.stop_ids.insert(p.stop_ids.end(), ctx.eos_ids.begin(), ctx.eos_ids.end());
  p.skip_special_tokens = json_bool(body, "skip_special_tokens", true);
  return p;
}

// Runs the engine's own checks now, so a bad request fails before anything is queued.
void validate(const GenerationJob& job, const ServerContext& ctx) {
  for (const RequestParams& p : job.requests) {
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
  job.model = ctx.model_name();
  job.n = json_int(body, "n", 1);
  if (job.n < 1 || job.n > 128) bad_request("n", "n must be in [1, 128] (got {})", job.n);
  job.stream = json_bool(body, "stream", false);
  if (const Json* options = json_object(body, "stream_options")) job.include_usage = json_bool(*options, "include_usage", false);
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

}  // namespace

void check_model(const Json& body, const ServerContext& ctx) {
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
  if (json_has(body, "logprobs")) {
    base.sampling.logprobs = json_int(body, "logprobs", 0);
    if (base.sampling.logprobs < 0 || base.sampling.logprobs > 20)
      bad_request("logprobs", "logprobs must be in [0, 20] (got {})", base.sampling.logprobs);
  }
  expand(job, base, prompts, parse_max_tokens(body, "max_tokens", 16));
  validate(job, ctx);
  return job;
}

GenerationJob parse_chat_request(const Json& body, const ServerContext& ctx) {
  GenerationJob job;
  job.chat = true;
  parse_job_common(body, ctx, job);
  const ChatPrompt chat = render_chat_prompt(body, ctx);
  RequestParams base = parse_common(body, ctx);
  if (json_bool(body, "logprobs", false)) {
    base.sampling.logprobs = json_int(body, "top_logprobs", 0);
    if (base.sampling.logprobs < 0 || base.sampling.logprobs > 20)
      bad_request("top_logprobs", "top_logprobs must be in [0, 20] (got {})", base.sampling.logprobs);
  }
  const std::vector<int32_t> prompt = ctx.tokenizer.encode(chat.text, false);
  const int64_t room = std::max<int64_t>(1, ctx.max_model_len() - int64_t(prompt.size()));
  const char* key = json_has(body, "max_completion_tokens") ? "max_completion_tokens" : "max_tokens";
  expand(job, base, {prompt}, parse_max_tokens(body, key, room));
  job.parse_tools = chat.has_tools && ctx.tool_parser != nullptr;
  job.parse_reasoning = ctx.reasoning;
  job.reasoning_starts_inside = ctx.reasoning && prompt_opens_reasoning(chat.text);
  validate(job, ctx);
  return job;
}

}  // namespace moet::server
