// Chat prompt rendering (see chat_prompt.h).
#include "server/chat_prompt.h"

#include "server/api_error.h"

#include <algorithm>

namespace moet::server {
namespace {

constexpr const char* kRoles[] = {"system", "developer", "user", "assistant", "tool"};

// Tool calls as templates expect them (as transformers and vLLM pass them): arguments given as a
// JSON string become the object it holds.
void normalize_tool_calls(nlohmann::ordered_json& message, const std::string& where) {
  if (!message.contains("tool_calls") || message["tool_calls"].is_null()) return;
  if (!message["tool_calls"].is_array()) bad_request(where + ".tool_calls", "{}.tool_calls must be an array", where);
  for (auto& call : message["tool_calls"]) {
    if (!call.is_object() || !call.contains("function") || !call["function"].is_object() ||
        !call["function"].contains("name") || !call["function"]["name"].is_string())
      bad_request(where + ".tool_calls", "{}.tool_calls: each call needs a 'function' with a string 'name'", where);
    auto& args = call["function"]["arguments"];
    if (args.is_string()) {
      auto parsed = nlohmann::ordered_json::parse(args.get<std::string>(), nullptr, false);
      if (!parsed.is_discarded()) args = std::move(parsed);
    }
  }
}

// A message as the template sees it: content parts joined into one string, a null content of an
// assistant message (one that only calls tools) as "", "developer" as "system".
nlohmann::ordered_json normalize_message(const Json& message, size_t index) {
  const std::string where = fmt::format("messages[{}]", index);
  if (!message.is_object()) bad_request(where, "{} must be an object", where);
  if (!message.contains("role") || !message["role"].is_string())
    bad_request(where, "{} must have a string 'role'", where);
  const std::string role = message["role"].get<std::string>();
  if (std::find(std::begin(kRoles), std::end(kRoles), role) == std::end(kRoles))
    bad_request(where + ".role", "{}.role '{}' is not one of system, developer, user, assistant, tool", where, role);
  nlohmann::ordered_json out = message;
  if (role == "developer") out["role"] = "system";
  normalize_tool_calls(out, where);
  if (!message.contains("content") || message["content"].is_null()) {
    if (role != "assistant") bad_request(where + ".content", "{}.content is required for role '{}'", where, role);
    out["content"] = "";
  }
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

void parse_tool_choice(const Json& body, ChatPrompt& prompt) {
  if (!json_has(body, "tool_choice")) return;
  const Json& choice = body["tool_choice"];
  if (choice == "auto") return;
  if (choice == "none") {
    prompt.tool_choice = ToolChoice::none;
    return;
  }
  if (choice == "required") {
    prompt.tool_choice = ToolChoice::required;
  } else if (choice.is_object() && choice.value("type", "") == "function" && choice.contains("function") &&
             choice["function"].is_object() && choice["function"].contains("name") &&
             choice["function"]["name"].is_string()) {
    prompt.tool_choice = ToolChoice::named;
    prompt.tool_name = choice["function"]["name"].get<std::string>();
    const bool known = std::any_of(prompt.tools.begin(), prompt.tools.end(),
                                   [&](const Json& t) { return t["function"]["name"] == prompt.tool_name; });
    if (!known) bad_request("tool_choice", "tool_choice names the function '{}', which is not in 'tools'", prompt.tool_name);
  } else {
    bad_request("tool_choice",
                "tool_choice must be \"none\", \"auto\", \"required\" or {{\"type\": \"function\", \"function\": "
                "{{\"name\": ...}}}}");
  }
  if (prompt.tools.empty()) bad_request("tool_choice", "tool_choice \"required\" or a named function needs 'tools'");
}

}  // namespace

ChatPrompt render_chat_prompt(const Json& body, const ServerContext& ctx) {
  if (!ctx.chat_template) throw ApiError(400, "this model has no chat template; use /v1/completions");
  const Json* messages = json_array(body, "messages");
  if (!messages || messages->empty()) bad_request("messages", "'messages' must be a non-empty array");
  nlohmann::ordered_json request = nlohmann::ordered_json::object();
  if (const Json* kwargs = json_object(body, "chat_template_kwargs"))
    for (const auto& [k, v] : kwargs->items()) request[k] = v;
  request["messages"] = nlohmann::ordered_json::array();
  for (size_t i = 0; i < messages->size(); ++i) request["messages"].push_back(normalize_message((*messages)[i], i));
  ChatPrompt prompt;
  if (const Json* tools = json_array(body, "tools")) {
    for (const Json& tool : *tools)
      if (!tool.is_object() || !tool.contains("function") || !tool["function"].is_object() ||
          !tool["function"].contains("name") || !tool["function"]["name"].is_string())
        bad_request("tools", "each tool must be an object with a 'function' object that has a string 'name'");
    prompt.tools = *tools;
  }
  parse_tool_choice(body, prompt);
  if (!prompt.tools.empty() && prompt.tool_choice != ToolChoice::none) {
    request["tools"] = prompt.tools;
    prompt.has_tools = true;
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
