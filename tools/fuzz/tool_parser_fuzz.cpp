// libFuzzer target: arbitrary text through every tool-call parser. parse() never throws; every
// call it returns has a name and arguments that are a JSON object; content plus calls never
// invent text (the content is a part of the input when there are no calls, the whole input).
#include "fuzz_util.h"
#include "server/tool_parser.h"

#include <nlohmann/json.hpp>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const auto hermes = moet::server::tool_parser_hermes();
  static const auto deepseek = moet::server::tool_parser_deepseek_v3();
  const std::string text = moet::fuzz::input(data, size);
  for (const auto* parser : {hermes.get(), deepseek.get()}) {
    const moet::server::ToolParseResult r = parser->parse(text);
    for (const auto& call : r.calls) {
      moet::fuzz::check(!call.name.empty(), "a call without a name");
      const auto args = nlohmann::json::parse(call.arguments, nullptr, false);
      moet::fuzz::check(args.is_object(), "arguments that are not a JSON object");
    }
    if (r.calls.empty()) moet::fuzz::check(r.content == text, "content changed without calls");
    moet::fuzz::check(r.content.size() <= text.size(), "content longer than the input");
  }
  return 0;
}
