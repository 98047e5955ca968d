// tool_parser_create (see tool_parser.h).
#include "server/tool_parser.h"

#include "core/error.h"

namespace moet::server {

std::unique_ptr<ToolParser> tool_parser_create(const std::string& name, const std::string& chat_template) {
  if (name == "none") return nullptr;
  if (name == "hermes" || name == "qwen3" || name == "qwen2_5") return tool_parser_hermes();
  if (name == "deepseek_v3" || name == "deepseek_v31") return tool_parser_deepseek_v3();
  if (name == "glm45" || name == "glm47") return tool_parser_glm();
  if (name == "deepseek_v4") return tool_parser_deepseek_v4();
  if (name == "deepseek_v32") return tool_parser_deepseek_v32();
  if (name == "auto") {
    if (chat_template.find("<arg_key>") != std::string::npos) return tool_parser_glm();
    if (chat_template.find("\xef\xbd\x9c" "DSML" "\xef\xbd\x9c") != std::string::npos)
      return chat_template.find("function_calls") != std::string::npos ? tool_parser_deepseek_v32()
                                                                         : tool_parser_deepseek_v4();
    if (chat_template.find("<tool_call>") != std::string::npos) return tool_parser_hermes();
    if (chat_template.find("tool\xe2\x96\x81" "calls\xe2\x96\x81" "begin") != std::string::npos)
      return tool_parser_deepseek_v3();
    return nullptr;
  }
  fail("unknown --tool-call-parser '{}' (choose auto, none, hermes, qwen3, deepseek_v3, glm45, glm47, deepseek_v4, "
       "deepseek_v32)", name);
}

}  // namespace moet::server
