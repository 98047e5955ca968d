// Tool-call parsers: turn a model's raw tool-call text into OpenAI `tool_calls`. One file per
// format (tool_parser_<format>.cpp); tool_parser_create() maps a vLLM --tool-call-parser name to
// one. A parser names the marker that opens its tool-call section (start()); the server streams
// content up to that marker, buffers the rest and calls parse() on it when the choice finishes.
// parse() never throws: text it cannot read as calls stays content (as vLLM does).
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace moet::server {

struct ToolCall {
  std::string name;
  std::string arguments;  // a JSON object serialized as a string (OpenAI's shape)
};

// How a format spells calls, for generating them under tool_choice "required" or a named
// function: section_begin, then calls separated by `separator`, then section_end; each call is
// call_begin, the name (as a JSON string literal when name_json), call_middle, the arguments
// object, call_end.
// json_arguments false: the format spells arguments otherwise (GLM's arg_key/arg_value pairs,
// DeepSeek's DSML parameters), which the grammar of tool_choice "required" cannot generate yet.
struct ToolCallFormat {
  std::string section_begin, section_end, separator;
  std::string call_begin, call_middle, call_end;
  bool name_json = false;
  bool json_arguments = true;
};

struct ToolParseResult {
  std::string content;          // text outside the tool-call markup
  std::vector<ToolCall> calls;
};

class ToolParser {
 public:
  virtual ~ToolParser() = default;
  virtual std::string_view start() const = 0;
  virtual ToolParseResult parse(std::string_view text) const = 0;
  virtual ToolCallFormat format() const = 0;
};

std::unique_ptr<ToolParser> tool_parser_hermes();
std::unique_ptr<ToolParser> tool_parser_deepseek_v3();
std::unique_ptr<ToolParser> tool_parser_glm();
std::unique_ptr<ToolParser> tool_parser_deepseek_v4();
std::unique_ptr<ToolParser> tool_parser_deepseek_v32();

// "hermes" (also "qwen3", "qwen2_5"), "deepseek_v3" (also "deepseek_v31"), "glm45" (also
// "glm47"), "deepseek_v4", "deepseek_v32", "none" -> nullptr, "auto" -> chosen from the chat
// template's markup (nullptr when it shows none).
// Throws moet::Error for an unknown name.
std::unique_ptr<ToolParser> tool_parser_create(const std::string& name, const std::string& chat_template);

}  // namespace moet::server
