// The prompt of a chat request: validates "messages" (a non-empty array of objects with a string
// "role"; "content" a string, null, or an array of text parts, which is joined) and "tools", then
// renders the model's chat template with messages, tools, add_generation_prompt and
// chat_template_kwargs (vLLM's extension, e.g. {"enable_thinking": false}). Roles other than
// system, developer (passed as system), user, assistant and tool are a 400; tool-call arguments
// given as JSON strings reach the template as objects. tool_choice is checked against the tools
// (an unknown function name is a 400 naming tool_choice). Template errors (raise_exception
// included) are the client's: a 400.
#pragma once

#include "server/json_fields.h"
#include "server/server_context.h"

#include <string>

namespace moet::server {

// OpenAI tool_choice: "auto" (the model decides), "none", "required" (some tool), or a named
// function ({"type": "function", "function": {"name": ...}}).
enum class ToolChoice { auto_, none, required, named };

struct ChatPrompt {
  std::string text;
  bool has_tools = false;  // tools given and tool_choice is not "none"
  ToolChoice tool_choice = ToolChoice::auto_;
  std::string tool_name;   // for ToolChoice::named
  Json tools = Json::array();  // the request's tools (validated: each has function.name)
};

ChatPrompt render_chat_prompt(const Json& body, const ServerContext& ctx);

}  // namespace moet::server
