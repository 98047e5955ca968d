// Parsing OpenAI /v1/completions and /v1/chat/completions bodies into a GenerationJob: the engine
// requests (one per choice: prompt p, sample j -> index p * n + j) plus what the response needs.
// Every client mistake is an ApiError (400 naming the field, 404 for an unknown model); fields
// moet does not know are ignored, but known ones it does not implement (suffix, best_of other
// than n, echo with logprobs, guided_grammar) are a 400 naming them. vLLM's extensions are accepted too: top_k, min_p,
// repetition_penalty, stop_token_ids, ignore_eos, skip_special_tokens, chat_template_kwargs.
#pragma once

#include "engine/request.h"
#include "server/json_fields.h"
#include "server/server_context.h"

#include <string>
#include <vector>

namespace moet::server {

struct GenerationJob {
  bool chat = false;
  std::string model;
  std::vector<RequestParams> requests;  // index = prompt * n + sample
  int64_t n = 1;
  bool stream = false;
  bool include_usage = false;           // stream_options.include_usage
  bool parse_tools = false;             // chat with tools and a tool parser
  bool parse_reasoning = false;
  bool reasoning_starts_inside = false;
  bool echo = false;                    // completions: the prompt's text starts each choice
};

GenerationJob parse_completion_request(const Json& body, const ServerContext& ctx);
GenerationJob parse_chat_request(const Json& body, const ServerContext& ctx);

// Checks "model" against the served names (absent is fine); throws a 404 ApiError otherwise.
void check_model(const Json& body, const ServerContext& ctx);

}  // namespace moet::server
