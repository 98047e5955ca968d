// libFuzzer target: arbitrary bytes as a chat template source. Parsing and rendering against a
// fixed conversation (tools, tool calls, thinking) must end in a string or a moet::Error, never a
// crash, hang or sanitizer report.
#include "core/error.h"
#include "tokenizer/chat_template.h"

#include <nlohmann/json.hpp>

#include <string>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const nlohmann::ordered_json request = nlohmann::ordered_json::parse(R"({
    "messages": [
      {"role": "system", "content": "sys"},
      {"role": "user", "content": "hi 你好"},
      {"role": "assistant", "content": "", "reasoning_content": "think",
       "tool_calls": [{"id": "c0", "type": "function", "function": {"name": "f", "arguments": {"x": 1.5, "y": [1, null]}}}]},
      {"role": "tool", "tool_call_id": "c0", "content": "{\"ok\": true}"}],
    "tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {"x": {"type": "number"}}}}}],
    "add_generation_prompt": true, "enable_thinking": true, "bos_token": "<s>", "eos_token": "</s>"})");
  try {
    const moet::ChatTemplate tmpl(std::string(reinterpret_cast<const char*>(data), size));
    (void)tmpl.render(request);
  } catch (const moet::Error&) {
  }
  return 0;
}
