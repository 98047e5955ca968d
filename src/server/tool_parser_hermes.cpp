// Hermes / Qwen2.5 / Qwen3 tool calls: each call is `<tool_call>{"name": ..., "arguments": {...}}
// </tool_call>` (whitespace around the JSON allowed); text outside the tags is content. A call
// whose JSON does not parse, that has no name, or whose arguments are not an object (or a string
// holding one), and an unclosed final tag, are kept as content.
#include "server/tool_parser.h"

#include <nlohmann/json.hpp>

namespace moet::server {
namespace {

constexpr std::string_view kOpen = "<tool_call>";
constexpr std::string_view kClose = "</tool_call>";

// {"name": NAME, "arguments": OBJECT} (arguments may also be a string holding the object's JSON,
// or absent for {}); false for anything else.
bool parse_call(std::string_view body, ToolCall& call) {
  const auto json = nlohmann::json::parse(body, nullptr, false);
  if (!json.is_object() || !json.contains("name") || !json["name"].is_string()) return false;
  call.name = json["name"].get<std::string>();
  nlohmann::json args = json.value("arguments", nlohmann::json::object());
  if (args.is_string()) args = nlohmann::json::parse(args.get<std::string>(), nullptr, false);
  if (call.name.empty() || !args.is_object()) return false;
  call.arguments = args.dump();
  return true;
}

class HermesToolParser : public ToolParser {
 public:
  std::string_view start() const override { return kOpen; }

  ToolCallFormat format() const override {
    return {"", "", "\n", std::string(kOpen) + "\n{\"name\": ", ", \"arguments\": ", "}\n" + std::string(kClose), true};
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
      const std::string_view body = text.substr(open + kOpen.size(), close - open - kOpen.size());
      ToolCall parsed;
      if (parse_call(body, parsed)) {
        result.content.append(text.substr(pos, open - pos));
        result.calls.push_back(std::move(parsed));
      } else {
        result.content.append(text.substr(pos, close + kClose.size() - pos));
      }
      pos = close + kClose.size();
    }
    return result;
  }
};

}  // namespace

std::unique_ptr<ToolParser> tool_parser_hermes() { return std::make_unique<HermesToolParser>(); }

}  // namespace moet::server
