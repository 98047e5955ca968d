// Tool-call parsers: Hermes/Qwen3 <tool_call> JSON and DeepSeek-V3 (V3 and V3.1 layouts), content
// around the calls, several calls, malformed calls kept as content, and auto-selection.
#include "server/tool_parser.h"

#include "core/error.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

namespace moet::server {
namespace {

const std::string kBegin = "<\xef\xbd\x9ctool\xe2\x96\x81" "calls\xe2\x96\x81" "begin\xef\xbd\x9c>";
const std::string kEnd = "<\xef\xbd\x9ctool\xe2\x96\x81" "calls\xe2\x96\x81" "end\xef\xbd\x9c>";
const std::string kCall = "<\xef\xbd\x9ctool\xe2\x96\x81" "call\xe2\x96\x81" "begin\xef\xbd\x9c>";
const std::string kCallEnd = "<\xef\xbd\x9ctool\xe2\x96\x81" "call\xe2\x96\x81" "end\xef\xbd\x9c>";
const std::string kSep = "<\xef\xbd\x9ctool\xe2\x96\x81sep\xef\xbd\x9c>";

nlohmann::json args(const ToolCall& call) { return nlohmann::json::parse(call.arguments); }

TEST(HermesToolParser, ParsesCallsAndKeepsContent) {
  auto parser = tool_parser_hermes();
  const auto r = parser->parse(
      "Let me check.<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>"
      "<tool_call>{\"name\": \"time\", \"arguments\": {}}</tool_call>");
  EXPECT_EQ(r.content, "Let me check.");
  ASSERT_EQ(r.calls.size(), 2u);
  EXPECT_EQ(r.calls[0].name, "get_weather");
  EXPECT_EQ(args(r.calls[0]), (nlohmann::json{{"city", "Paris"}}));
  EXPECT_EQ(r.calls[1].name, "time");
  EXPECT_EQ(args(r.calls[1]), nlohmann::json::object());
}

TEST(HermesToolParser, MalformedOrUnclosedStaysContent) {
  auto parser = tool_parser_hermes();
  const std::string bad = "<tool_call>{not json}</tool_call>";
  EXPECT_EQ(parser->parse(bad).content, bad);
  EXPECT_TRUE(parser->parse(bad).calls.empty());
  const std::string open = "x<tool_call>{\"name\": \"f\"";
  EXPECT_EQ(parser->parse(open).content, open);
}

TEST(DeepSeekV3ToolParser, ParsesV3Format) {
  auto parser = tool_parser_deepseek_v3();
  const std::string text = "Sure." + kBegin + kCall + "function" + kSep + "get_weather\n```json\n{\"city\": \"Paris\"}\n```" +
                           kCallEnd + kCall + "function" + kSep + "noop\n```json\n{}\n```" + kCallEnd + kEnd;
  const auto r = parser->parse(text);
  EXPECT_EQ(r.content, "Sure.");
  ASSERT_EQ(r.calls.size(), 2u);
  EXPECT_EQ(r.calls[0].name, "get_weather");
  EXPECT_EQ(args(r.calls[0]), (nlohmann::json{{"city", "Paris"}}));
  EXPECT_EQ(r.calls[1].name, "noop");
}

TEST(DeepSeekV3ToolParser, ParsesV31FormatAndRejectsMalformed) {
  auto parser = tool_parser_deepseek_v3();
  const auto r = parser->parse(kBegin + kCall + "search" + kSep + "{\"q\": \"moe\"}" + kCallEnd + kEnd);
  ASSERT_EQ(r.calls.size(), 1u);
  EXPECT_EQ(r.calls[0].name, "search");
  EXPECT_EQ(args(r.calls[0]), (nlohmann::json{{"q", "moe"}}));
  const std::string broken = kBegin + kCall + "search" + kSep + "{oops" + kCallEnd + kEnd;
  EXPECT_TRUE(parser->parse(broken).calls.empty());
  EXPECT_EQ(parser->parse(broken).content, broken);
}

TEST(ToolParserCreate, NamesAndAuto) {
  EXPECT_EQ(tool_parser_create("none", "<tool_call>"), nullptr);
  EXPECT_EQ(tool_parser_create("qwen3", "")->start(), "<tool_call>");
  EXPECT_EQ(tool_parser_create("auto", "{{ '<tool_call>' }}")->start(), "<tool_call>");
  EXPECT_EQ(tool_parser_create("auto", "x" + kBegin)->start(), kBegin);
  EXPECT_EQ(tool_parser_create("auto", "plain"), nullptr);
  EXPECT_THROW(tool_parser_create("mystery", ""), Error);
}

}  // namespace
}  // namespace moet::server
