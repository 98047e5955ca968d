// Hermes / Qwen2.5 / Qwen3 tool calls: each call is `<tool_call>{"name": ..., "arguments": {...}}
// </tool_call>` (whitespace around the JSON allowed); text outside the tags is content. A call
// whose JSON does not parse, or an unclosed final tag, is kept as content.
#include "server/tool_parser.h"

#include <nlohmann/json.hpp>

namespace moet::server {
namespace {

constexpr std::string_view kOpen = "<tool_call>";
constexpr std::string_view kClose = "</tool_call>";

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
      const auto call = nlohmann::json::parse(body, nullptr, false);
      if (call.is_object() && call.contains("name") && call["name"].is_string()) {
        result.content.append(text.substr(pos, open - pos));
        const auto args = call.value("arguments", nlohmann::json::object());
        result.calls.push_back({call["name"].get<std::string>(), args.is_string() ? args.get<std::string>() : args.dump()});
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
