// Structured output for a generation request: OpenAI's response_format (text, json_object,
// json_schema), vLLM's guided_json / guided_regex / guided_choice, and tool_choice "required" or
// a named function (the output is then a tool call in the model's own format, its arguments
// valid under the tool's parameters schema). Each becomes a Grammar (json_schema_grammar.h,
// regex_grammar.h) compiled against the vocabulary into a CompiledGrammar that masks sampling
// (token_mask.h). JSON outputs may start with bounded whitespace. In chat with the reasoning
// split on, a reasoning block may come first (it must, when the prompt opened it) and is free
// text; the constraint applies after it. Compiled grammars are cached by their source (schema
// text, pattern, choices, tools) in a GrammarCache, so a repeated schema reuses its automaton
// and masks (GrammarCache, token_mask.h). The output is complete and valid when the request ends with finish_reason "stop"
// (a max_tokens cut leaves it unfinished).
#pragma once

#include "server/chat_prompt.h"
#include "server/token_mask.h"

#include <memory>

namespace moet::server {

struct ServerContext;

// The constraint the body asks for, or nullptr. chat: the rendered chat prompt (nullptr for
// /v1/completions); reasoning / reasoning_open: the reasoning split is on / the prompt opened a
// reasoning block. Throws ApiError (400 naming the field) for invalid or unsupported requests.
std::shared_ptr<const TokenConstraint> structured_output(const Json& body, const ChatPrompt* chat, bool reasoning,
                                                         bool reasoning_open, const ServerContext& ctx);

}  // namespace moet::server
