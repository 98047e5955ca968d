// Chat prompt rendering (see chat_prompt.h).
#include "server/chat_prompt.h"

#include "server/api_error.h"

namespace moet::server {
namespace {

// A message as the template sees it: content parts joined into one string.
nlohmann::ordered_json normalize_message(const Json& message, size_t index) {
  const std::string where = fmt::format("messages[{}]", index);
  if (!message.is_object()) bad_request(where, "{} must be an object", where);
  if (!message.contains("role") || !message["role"].is_string())
    bad_request(where, "{} must have a string 'role'", where);
  nlohmann::ordered_json out = nlohmann::ordered_json::parse(message.dump());
  const Json content = message.value("content", Json());
  if (content.is_array()) {
    std::string text;
    for (const Json& part : content) {
      if (!part.is_object() || part.value("type", "") != "text" || !part.contains("text") || !part["text"].is_string())
        bad_request(where, "{}: only text content parts are supported", where);
      text += part["text"].get<std::string>();
    }
    out["content"] = text;
  } else if (!content.is_string() && !content.is_null()) {
    bad_request(where, "{}.content must be a string, an array of text parts, or null", where);
  }
  return out;
}

}  // namespace

ChatPrompt render_chat_prompt(const Json& body, const ServerContext& ctx) {
  if (!ctx.chat_template) throw ApiError(400, "this model has no chat template; use /v1/completions");
  const Json* messages = json_array(body, "messages");
  if (!messages || messages->empty()) bad_request("messages", "'messages' must be a non-empty array");
  nlohmann::ordered_json request = nlohmann::ordered_json::object();
  if (const Json* kwargs = json_object(body, "chat_template_kwargs"))
    for (const auto& [k, v] : kwargs->items()) request[k] = nlohmann::ordered_json::parse(v.dump());
  request["messages"] = nlohmann::ordered_json::array();
  for (size_t i = 0; i < messages->size(); ++i) request["messages"].push_back(normalize_message((*messages)[i], i));
  ChatPrompt prompt;
  if (const Json* tools = json_array(body, "tools")) {
    for (const Json& tool : *tools)
      if (!tool.is_object() || !tool.contains("function") || !tool["function"].is_object())
        bad_request("tools", "each tool must be an object with a 'function' object");
    const bool none = body.contains("tool_choice") && body["tool_choice"] == "none";
    if (!tools->empty() && !none) {
      request["tools"] = nlohmann::ordered_json::parse(tools->dump());
      prompt.has_tools = true;
    }
  }
  request["add_generation_prompt"] = json_bool(body, "add_generation_prompt", true);
  try {
    prompt.text = ctx.chat_template->render(request);
  } catch (const Error& e) {
    throw ApiError(400, fmt::format("chat template: {}", e.what()), "messages");
  }
  return prompt;
}

}  // namespace moet::server
