// tool_parser_create (see tool_parser.h).
#include "server/tool_parser.h"

#include "core/error.h"

namespace moet::server {

std::unique_ptr<ToolParser> tool_parser_create(const std::string& name, const std::string& chat_template) {
  if (name == "none") return nullptr;
  if (name == "hermes" || name == "qwen3" || name == "qwen2_5") return tool_parser_hermes();
  if (name == "deepseek_v3" || name == "deepseek_v31") return tool_parser_deepseek_v3();
  if (name == "auto") {
    if (chat_template.find("<tool_call>") != std::string::npos) return tool_parser_hermes();
    if (chat_template.find("tool\xe2\x96\x81" "calls\xe2\x96\x81" "begin") != std::string::npos)
      return tool_parser_deepseek_v3();
    return nullptr;
  }
  fail("unknown --tool-call-parser '{}' (choose auto, none, hermes, qwen3, deepseek_v3)", name);
}

}  // namespace moet::server
