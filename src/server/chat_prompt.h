// The prompt of a chat request: validates "messages" (a non-empty array of objects with a string
// "role"; "content" a string, null, or an array of text parts, which is joined) and "tools", then
// renders the model's chat template with messages, tools, add_generation_prompt and
// chat_template_kwargs (vLLM's extension, e.g. {"enable_thinking": false}). Template errors
// (raise_exception included) are the client's: a 400.
#pragma once

#include "server/json_fields.h"
#include "server/server_context.h"

#include <string>

namespace moet::server {

struct ChatPrompt {
  std::string text;
  bool has_tools = false;  // tools given and tool_choice is not "none"
};

ChatPrompt render_chat_prompt(const Json& body, const ServerContext& ctx);

}  // namespace moet::server
