// DeepSeek's DSML tool calls: DeepSeek-V4 (vLLM's deepseek_v4) and DeepSeek-V3.2 (deepseek_v32),
// one block per message
//   <｜DSML｜tool_calls>                                (V3.2: <｜DSML｜function_calls>)
//   <｜DSML｜invoke name="NAME">
//   <｜DSML｜parameter name="KEY" string="true|false">VALUE</｜DSML｜parameter>
//   ...
//   </｜DSML｜invoke>
//   ...more invokes...
//   </｜DSML｜tool_calls>
// A parameter marked string="true" is that text; any other is JSON (text that does not parse stays
// a string). Text before the block is content; a malformed block is kept as content.
#include "server/tool_parser.h"

#include <nlohmann/json.hpp>

#include <cctype>

namespace moet::server {
namespace {

#define MOET_DSML "\xef\xbd\x9c" "DSML" "\xef\xbd\x9c"  // ｜DSML｜
constexpr std::string_view kInvoke = "<" MOET_DSML "invoke name=\"", kInvokeClose = "</" MOET_DSML "invoke>";
constexpr std::string_view kParam = "<" MOET_DSML "parameter name=\"", kParamClose = "</" MOET_DSML "parameter>";

std::string_view trim(std::string_view s) {
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.front()))) s.remove_prefix(1);
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back()))) s.remove_suffix(1);
  return s;
}

// One invoke's body after its name's opening quote -> the call; false when malformed.
bool parse_invoke(std::string_view body, ToolCall& call) {
  const size_t name_end = body.find("\">");
  if (name_end == std::string_view::npos || name_end == 0) return false;
  call.name = std::string(body.substr(0, name_end));
  std::string_view rest = body.substr(name_end + 2);
  nlohmann::json args = nlohmann::json::object();
  while (!trim(rest).empty()) {
    rest = trim(rest);
    if (!rest.starts_with(kParam)) return false;
    rest.remove_prefix(kParam.size());
    const size_t key_end = rest.find('"');
    const size_t tag_end = rest.find('>');
    const size_t close = rest.find(kParamClose);
    if (key_end == std::string_view::npos || tag_end == std::string_view::npos || close == std::string_view::npos ||
        tag_end > close)
      return false;
    const std::string key(rest.substr(0, key_end));
    const bool is_string = rest.substr(key_end, tag_end - key_end).find("string=\"true\"") != std::string_view::npos;
    const std::string_view value = rest.substr(tag_end + 1, close - tag_end - 1);
    const auto parsed = is_string ? nlohmann::json() : nlohmann::json::parse(value, nullptr, false);
    args[key] = is_string || parsed.is_discarded() ? nlohmann::json(std::string(value)) : parsed;
    rest.remove_prefix(close + kParamClose.size());
  }
  call.arguments = args.dump();
  return true;
}

class DsmlToolParser : public ToolParser {
 public:
  explicit DsmlToolParser(const std::string& block)
      : open_("<" MOET_DSML + block + ">"), close_("</" MOET_DSML + block + ">") {}

  std::string_view start() const override { return open_; }

  ToolCallFormat format() const override {  // parameters are not one JSON object
    return {open_, close_, "\n", std::string(kInvoke), "\">", std::string(kInvokeClose), false, false};
  }

  ToolParseResult parse(std::string_view text) const override {
    ToolParseResult result;
    const size_t begin = text.find(open_);
    if (begin == std::string_view::npos) {
      result.content = std::string(text);
      return result;
    }
    std::string_view block = text.substr(begin + open_.size());
    if (const size_t end = block.find(close_); end != std::string_view::npos) block = block.substr(0, end);
    size_t pos = 0;
    while (true) {
      const size_t open = block.find(kInvoke, pos);
      if (open == std::string_view::npos) break;
      const size_t close = block.find(kInvokeClose, open);
      ToolCall call;
      const size_t body_at = open + kInvoke.size();
      if (close == std::string_view::npos || !parse_invoke(block.substr(body_at, close - body_at), call)) {
        result.calls.clear();
        break;
      }
      result.calls.push_back(std::move(call));
      pos = close + kInvokeClose.size();
    }
    result.content = std::string(result.calls.empty() ? text : trim(text.substr(0, begin)));
    return result;
  }

 private:
  std::string open_, close_;
};

}  // namespace

std::unique_ptr<ToolParser> tool_parser_deepseek_v4() { return std::make_unique<DsmlToolParser>("tool_calls"); }
std::unique_ptr<ToolParser> tool_parser_deepseek_v32() { return std::make_unique<DsmlToolParser>("function_calls"); }

}  // namespace moet::server
