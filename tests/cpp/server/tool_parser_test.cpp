// Tool-call parsers: Hermes/Qwen3 <tool_call> JSON, DeepSeek-V3 (V3 and V3.1 layouts), GLM's
// arg_key/arg_value calls (GLM-4.5 with newlines, GLM-4.7/5 without), DeepSeek's DSML (V4
// tool_calls, V3.2 function_calls), content around the calls, several calls, malformed calls kept
// as content, and auto-selection from a chat template.
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

TEST(GlmToolParser, ParsesGlm47AndGlm45Spellings) {
  auto parser = tool_parser_create("glm47", "");
  const auto r = parser->parse(
      "I will look.<tool_call>get_weather<arg_key>city</arg_key><arg_value>Paris</arg_value><arg_key>days</arg_key>"
      "<arg_value>3</arg_value><arg_key>opts</arg_key><arg_value>{\"metric\": true}</arg_value></tool_call>"
      "<tool_call>noop</tool_call>");
  EXPECT_EQ(r.content, "I will look.");
  ASSERT_EQ(r.calls.size(), 2u);
  EXPECT_EQ(r.calls[0].name, "get_weather");
  EXPECT_EQ(args(r.calls[0]), (nlohmann::json{{"city", "Paris"}, {"days", 3}, {"opts", {{"metric", true}}}}));
  EXPECT_EQ(r.calls[1].name, "noop");
  EXPECT_EQ(args(r.calls[1]), nlohmann::json::object());
  // GLM-4.5/4.6: a newline after the name and after each piece.
  const auto r45 = tool_parser_create("glm45", "")->parse(
      "<tool_call>search\n<arg_key>q</arg_key>\n<arg_value>moe models</arg_value>\n</tool_call>");
  ASSERT_EQ(r45.calls.size(), 1u);
  EXPECT_EQ(r45.calls[0].name, "search");
  EXPECT_EQ(args(r45.calls[0]), (nlohmann::json{{"q", "moe models"}}));
  EXPECT_FALSE(parser->format().json_arguments);
}

TEST(GlmToolParser, MalformedOrUnclosedStaysContent) {
  auto parser = tool_parser_glm();
  const std::string bad = "<tool_call>f<arg_key>a</arg_key>no value</tool_call>";
  EXPECT_EQ(parser->parse(bad).content, bad);
  EXPECT_TRUE(parser->parse(bad).calls.empty());
  const std::string open = "x<tool_call>f<arg_key>a";
  EXPECT_EQ(parser->parse(open).content, open);
}

const std::string kDsml = "\xef\xbd\x9c" "DSML" "\xef\xbd\x9c";

TEST(DsmlToolParser, ParsesDeepSeekV4AndV32Blocks) {
  const std::string calls = "<" + kDsml + "invoke name=\"get_weather\">\n<" + kDsml +
                            "parameter name=\"city\" string=\"true\">42 Paris</" + kDsml + "parameter>\n<" + kDsml +
                            "parameter name=\"days\" string=\"false\">[1, 2]</" + kDsml + "parameter>\n</" + kDsml +
                            "invoke>\n<" + kDsml + "invoke name=\"noop\">\n</" + kDsml + "invoke>\n";
  for (const std::string block : {"tool_calls", "function_calls"}) {
    auto parser = tool_parser_create(block == "tool_calls" ? "deepseek_v4" : "deepseek_v32", "");
    const std::string text = "Checking.\n\n<" + kDsml + block + ">\n" + calls + "</" + kDsml + block + ">";
    const auto r = parser->parse(text);
    EXPECT_EQ(r.content, "Checking.");
    ASSERT_EQ(r.calls.size(), 2u) << block;
    EXPECT_EQ(r.calls[0].name, "get_weather");
    EXPECT_EQ(args(r.calls[0]), (nlohmann::json{{"city", "42 Paris"}, {"days", {1, 2}}}));
    EXPECT_EQ(r.calls[1].name, "noop");
    EXPECT_EQ(args(r.calls[1]), nlohmann::json::object());
    const std::string broken = "<" + kDsml + block + "><" + kDsml + "invoke name=\"f\"><" + kDsml + "parameter oops";
    EXPECT_TRUE(parser->parse(broken).calls.empty());
    EXPECT_EQ(parser->parse(broken).content, broken);
  }
}

TEST(ToolParserCreate, NamesAndAuto) {
  EXPECT_EQ(tool_parser_create("auto", "<tool_call>{{ name }}<arg_key>")->start(), "<tool_call>");
  // GLM's parser, not Hermes'.
  EXPECT_FALSE(tool_parser_create("auto", "<tool_call>{{ name }}<arg_key>")->format().json_arguments);
  EXPECT_EQ(tool_parser_create("auto", "{%- set t = '" + kDsml + "' -%}tool_calls")->start(),
            "<" + kDsml + "tool_calls>");
  EXPECT_EQ(tool_parser_create("auto", "{%- set t = '" + kDsml + "' -%}function_calls")->start(),
            "<" + kDsml + "function_calls>");
  EXPECT_EQ(tool_parser_create("none", "<tool_call>"), nullptr);
  EXPECT_EQ(tool_parser_create("qwen3", "")->start(), "<tool_call>");
  EXPECT_EQ(tool_parser_create("auto", "{{ '<tool_call>' }}")->start(), "<tool_call>");
  EXPECT_EQ(tool_parser_create("auto", "x" + kBegin)->start(), kBegin);
  EXPECT_EQ(tool_parser_create("auto", "plain"), nullptr);
  EXPECT_THROW(tool_parser_create("mystery", ""), Error);
}

}  // namespace
}  // namespace moet::server
