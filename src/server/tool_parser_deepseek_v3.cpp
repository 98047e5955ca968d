// DeepSeek-V3 tool calls (its chat template's format), one section per message:
//   <｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>NAME\n```json\n{ARGS}\n```<｜tool▁call▁end｜>
//   ...more calls...<｜tool▁calls▁end｜>
// and the V3.1 variant without type and fence: <｜tool▁call▁begin｜>NAME<｜tool▁sep｜>{ARGS}<｜tool▁call▁end｜>.
// Text before the section is content; a malformed section is kept as content.
#include "server/tool_parser.h"

#include <nlohmann/json.hpp>

#include <cctype>

namespace moet::server {
namespace {

constexpr std::string_view kCallsBegin = "<\xef\xbd\x9ctool\xe2\x96\x81" "calls\xe2\x96\x81" "begin\xef\xbd\x9c>";
constexpr std::string_view kCallsEnd = "<\xef\xbd\x9ctool\xe2\x96\x81" "calls\xe2\x96\x81" "end\xef\xbd\x9c>";
constexpr std::string_view kCallBegin = "<\xef\xbd\x9ctool\xe2\x96\x81" "call\xe2\x96\x81" "begin\xef\xbd\x9c>";
constexpr std::string_view kCallEnd = "<\xef\xbd\x9ctool\xe2\x96\x81" "call\xe2\x96\x81" "end\xef\xbd\x9c>";
constexpr std::string_view kSep = "<\xef\xbd\x9ctool\xe2\x96\x81sep\xef\xbd\x9c>";

std::string_view trim(std::string_view s) {
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.front()))) s.remove_prefix(1);
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back()))) s.remove_suffix(1);
  return s;
}

// One call body (between call begin and call end) -> name and arguments; false when malformed.
bool parse_call(std::string_view body, ToolCall& call) {
  const size_t sep = body.find(kSep);
  if (sep == std::string_view::npos) return false;
  std::string_view head = trim(body.substr(0, sep));
  std::string_view rest = body.substr(sep + kSep.size());
  std::string_view args;
  if (head == "function") {  // V3: NAME\n```json\nARGS\n```
    const size_t newline = rest.find('\n');
    if (newline == std::string_view::npos) return false;
    call.name = std::string(trim(rest.substr(0, newline)));
    args = trim(rest.substr(newline + 1));
    if (args.starts_with("```json")) args.remove_prefix(7);
    else if (args.starts_with("```")) args.remove_prefix(3);
    if (args.ends_with("```")) args.remove_suffix(3);
  } else {  // V3.1: NAME<sep>ARGS
    call.name = std::string(head);
    args = rest;
  }
  const auto parsed = nlohmann::json::parse(trim(args), nullptr, false);
  if (call.name.empty() || !parsed.is_object()) return false;
  call.arguments = parsed.dump();
  return true;
}

class DeepSeekV3ToolParser : public ToolParser {
 public:
  std::string_view start() const override { return kCallsBegin; }

  ToolCallFormat format() const override {  // the V3 spelling (type "function" and a json fence)
    return {std::string(kCallsBegin), std::string(kCallsEnd), "",
            std::string(kCallBegin) + "function" + std::string(kSep), "\n```json\n", "\n```" + std::string(kCallEnd),
            false};
  }

  ToolParseResult parse(std::string_view text) const override {
    ToolParseResult result;
    const size_t begin = text.find(kCallsBegin);
    if (begin == std::string_view::npos) {
      result.content = std::string(text);
      return result;
    }
    std::string_view section = text.substr(begin + kCallsBegin.size());
    if (const size_t end = section.find(kCallsEnd); end != std::string_view::npos) section = section.substr(0, end);
    size_t pos = 0;
    while (true) {
      const size_t open = section.find(kCallBegin, pos);
      if (open == std::string_view::npos) break;
      const size_t close = section.find(kCallEnd, open);
      ToolCall call;
      const size_t body_at = open + kCallBegin.size();
      if (close == std::string_view::npos || !parse_call(section.substr(body_at, close - body_at), call)) {
        result.calls.clear();
        break;
      }
      result.calls.push_back(std::move(call));
      pos = close + kCallEnd.size();
    }
    result.content = std::string(result.calls.empty() ? text : text.substr(0, begin));
    return result;
  }
};

}  // namespace

std::unique_ptr<ToolParser> tool_parser_deepseek_v3() { return std::make_unique<DeepSeekV3ToolParser>(); }

}  // namespace moet::server
