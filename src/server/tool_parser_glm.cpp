// GLM-4.5 / 4.6 / 4.7 / GLM-5 tool calls (vLLM's glm45 and glm47 parsers; the chat templates'
// format), each call
//   <tool_call>NAME<arg_key>KEY</arg_key><arg_value>VALUE</arg_value>...</tool_call>
// with optional whitespace or newlines between the pieces (GLM-4.5/4.6 put a newline after the
// name and after each piece, GLM-4.7/5 none: one parser reads both). The templates write a string
// argument as it is and any other value as JSON, so a value that parses as JSON (a number, true,
// an object, ...) becomes that value and anything else stays a string: without the request's
// parameter schemas a string argument that looks like a number ("42") comes back as a number.
// Text outside the calls is content; a malformed or unclosed call stays content.
#include "server/tool_parser.h"

#include <nlohmann/json.hpp>

#include <cctype>

namespace moet::server {
namespace {

constexpr std::string_view kOpen = "<tool_call>", kClose = "</tool_call>";
constexpr std::string_view kKeyOpen = "<arg_key>", kKeyClose = "</arg_key>";
constexpr std::string_view kValueOpen = "<arg_value>", kValueClose = "</arg_value>";

std::string_view trim(std::string_view s) {
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.front()))) s.remove_prefix(1);
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back()))) s.remove_suffix(1);
  return s;
}

// The text between `open` and `close` at the start of `s` (after whitespace); advances s past it.
bool take(std::string_view& s, std::string_view open, std::string_view close, std::string_view& out) {
  s = trim(s);
  if (!s.starts_with(open)) return false;
  const size_t end = s.find(close, open.size());
  if (end == std::string_view::npos) return false;
  out = s.substr(open.size(), end - open.size());
  s.remove_prefix(end + close.size());
  return true;
}

bool parse_call(std::string_view body, ToolCall& call) {
  const size_t first_key = body.find(kKeyOpen);
  call.name = std::string(trim(body.substr(0, first_key)));
  if (call.name.empty() || call.name.find('<') != std::string::npos) return false;
  nlohmann::json args = nlohmann::json::object();
  std::string_view rest = first_key == std::string_view::npos ? std::string_view() : body.substr(first_key);
  while (!trim(rest).empty()) {
    std::string_view key, value;
    if (!take(rest, kKeyOpen, kKeyClose, key) || !take(rest, kValueOpen, kValueClose, value)) return false;
    const auto parsed = nlohmann::json::parse(value, nullptr, false);
    args[std::string(trim(key))] = parsed.is_discarded() ? nlohmann::json(std::string(value)) : parsed;
  }
  call.arguments = args.dump();
  return true;
}

class GlmToolParser : public ToolParser {
 public:
  std::string_view start() const override { return kOpen; }

  ToolCallFormat format() const override {  // GLM-4.7/5 spelling; arguments are not one JSON object
    return {"", "", "", std::string(kOpen), "", std::string(kClose), false, false};
  }

  ToolParseResult parse(std::string_view text) const override {
    ToolParseResult result;
    size_t pos = 0;
    while (pos < text.size()) {
      const size_t open = text.find(kOpen, pos);
      const size_t close = open == std::string_view::npos ? open : text.find(kClose, open + kOpen.size());
      if (close == std::string_view::npos) {
        result.content.append(text.substr(pos));
        break;
      }
      ToolCall call;
      if (parse_call(text.substr(open + kOpen.size(), close - open - kOpen.size()), call)) {
        result.content.append(text.substr(pos, open - pos));
        result.calls.push_back(std::move(call));
      } else {
        result.content.append(text.substr(pos, close + kClose.size() - pos));
      }
      pos = close + kClose.size();
    }
    return result;
  }
};

}  // namespace

std::unique_ptr<ToolParser> tool_parser_glm() { return std::make_unique<GlmToolParser>(); }

}  // namespace moet::server
