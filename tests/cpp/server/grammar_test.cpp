// Structured-output grammars: regexes and JSON schemas accept exactly what they should, integer
// ranges are exact, token masks equal the brute-force answer, and random walks through the masks
// always end in text the grammar (and a JSON parser) accepts.
#include "server/api_error.h"
#include "server/grammar.h"
#include "server/json_schema_grammar.h"
#include "server/regex_grammar.h"
#include "server/token_mask.h"
#include "engine/sampler.h"

#include <gtest/gtest.h>

#include <random>

namespace moet::server {
namespace {

Grammar regex_grammar(const std::string& pattern, bool json = false) {
  GrammarBuilder b;
  return b.build(regex_rule(b, pattern, json));
}

Grammar schema_grammar(const Json& schema) {
  GrammarBuilder b;
  return b.build(json_schema_rule(b, schema, "response_format"));
}

TEST(RegexGrammar, MatchesWholeStrings) {
  struct Case {
    std::string pattern;
    std::vector<std::string> yes, no;
  };
  const std::vector<Case> cases = {
      {"abc", {"abc"}, {"ab", "abcd", ""}},
      {"^a(b|cd)*e$", {"ae", "abe", "acdbe"}, {"ace", "a", "abee"}},
      {"[0-9]{2,3}-[a-f]+", {"12-a", "123-fed"}, {"1-a", "1234-a", "12-"}},
      {"\\d+(\\.\\d{1,2})?", {"7", "3.14"}, {"3.", "3.141", "x"}},
      {"[^a-z]x?", {"A", "Ax", "\xc3\xa4"}, {"a", "ax", ""}},
      {"(?:ab){2}|(?<n>c)", {"abab", "c"}, {"ab", "cc"}},
      {"\\w\\s\\S.", {"a b!", "_ xz"}, {"a  b", "ab c"}},
      {"caf\xc3\xa9", {"caf\xc3\xa9"}, {"cafe"}},
      {"[\\u0400-\\u04ff]+", {"\xd0\x96\xd0\xb8"}, {"a"}},
      {"x{0}y", {"y"}, {"xy"}},
  };
  for (const Case& c : cases) {
    const Grammar g = regex_grammar(c.pattern);
    for (const auto& s : c.yes) EXPECT_TRUE(grammar_matches(g, s)) << c.pattern << " should match " << s;
    for (const auto& s : c.no) EXPECT_FALSE(grammar_matches(g, s)) << c.pattern << " should not match " << s;
  }
}

TEST(RegexGrammar, JsonStringSpelling) {
  const Grammar g = regex_grammar("a\"[\\n\\\\]", true);
  EXPECT_TRUE(grammar_matches(g, "a\\\"\\n"));
  EXPECT_TRUE(grammar_matches(g, "a\\\"\\\\"));
  EXPECT_FALSE(grammar_matches(g, "a\"\n"));
}

TEST(RegexGrammar, NestedOptionalsStayPolynomial) {
  // Every level of nesting doubles the ways to reach the same continuation: without expanding
  // each intermediate stack once, this took minutes (found by request_fuzz).
  std::string pattern;
  for (int i = 0; i < 6; ++i) pattern += "((((((((((a?)?)?)?)?)?)?)?)?)?)?b";
  const Grammar g = regex_grammar(pattern);
  EXPECT_TRUE(grammar_matches(g, "bbbbbb"));
  EXPECT_TRUE(grammar_matches(g, "abababababab"));
  EXPECT_FALSE(grammar_matches(g, "aab"));
}

TEST(RegexGrammar, UnsupportedIsAnError) {
  for (const char* p : {"a\\bb", "(a)\\1", "(?=a)", "a^b", "a$b", "[z-a]", "(ab", "ab)", "*a"}) {
    GrammarBuilder b;
    EXPECT_THROW(regex_rule(b, p, false), Error) << p;
  }
}

TEST(GrammarBuilder, TextUntil) {
  GrammarBuilder b;
  const Grammar g = b.build(b.choice({{b.text_until("</think>"), b.byte('!')}}));
  EXPECT_TRUE(grammar_matches(g, "</think>!"));
  EXPECT_TRUE(grammar_matches(g, "a </thin</think>!"));
  EXPECT_FALSE(grammar_matches(g, "a </think> </think>!"));  // the first marker ends the text
  EXPECT_FALSE(grammar_matches(g, "no marker!"));
}

TEST(JsonSchemaGrammar, ObjectsAndTypes) {
  const Json schema = Json::parse(R"({
    "type": "object",
    "properties": {
      "name": {"type": "string", "minLength": 1, "maxLength": 4},
      "age": {"type": "integer", "minimum": 0, "maximum": 130},
      "tags": {"type": "array", "items": {"enum": ["a", "b"]}, "minItems": 1, "maxItems": 2},
      "nick": {"type": ["string", "null"]},
      "score": {"type": "number"}
    },
    "required": ["name", "age", "tags"],
    "additionalProperties": false})");
  const Grammar g = schema_grammar(schema);
  for (const char* ok : {R"({"name":"ab","age":7,"tags":["a"]})",
                         R"({"name": "abcd", "age": 130, "tags": ["a", "b"], "nick": null})",
                         "{\n  \"name\": \"x\",\n  \"age\": 0,\n  \"tags\": [\"b\"],\n  \"score\": -1.5e3\n}",
                         R"({"name":"\u00e9\n","age":12,"tags":["b"],"nick":"z","score":0})"})
    EXPECT_TRUE(grammar_matches(g, ok)) << ok;
  for (const char* bad : {R"({"name":"","age":7,"tags":["a"]})", R"({"name":"abcde","age":7,"tags":["a"]})",
                          R"({"name":"a","age":131,"tags":["a"]})", R"({"name":"a","age":-1,"tags":["a"]})",
                          R"({"name":"a","age":1,"tags":[]})", R"({"name":"a","age":1,"tags":["a","b","a"]})",
                          R"({"name":"a","tags":["a"]})", R"({"name":"a","age":1,"tags":["c"]})",
                          R"({"name":"a","age":1,"tags":["a"],"extra":1})", R"({"name":"a","age":01,"tags":["a"]})",
                          R"({"age":1,"name":"a","tags":["a"]})"})
    EXPECT_FALSE(grammar_matches(g, bad)) << bad;
}

TEST(JsonSchemaGrammar, IntegerRangesAreExact) {
  std::mt19937_64 rng(7);
  std::vector<std::pair<int64_t, int64_t>> ranges = {{0, 0}, {-5, 5}, {7, 7}, {-120, -3}, {9, 1000}, {-999, 99}};
  for (int i = 0; i < 20; ++i) {
    const int64_t a = int64_t(rng() % 20000) - 10000, b = a + int64_t(rng() % 3000);
    ranges.emplace_back(a, b);
  }
  for (const auto& [lo, hi] : ranges) {
    const Grammar g = schema_grammar(Json{{"type", "integer"}, {"minimum", lo}, {"maximum", hi}});
    for (int64_t x = lo - 60; x <= hi + 60; x += (hi - lo > 500 ? 7 : 1))
      ASSERT_EQ(grammar_matches(g, std::to_string(x)), x >= lo && x <= hi) << lo << ".." << hi << ": " << x;
    EXPECT_FALSE(grammar_matches(g, "-0"));
  }
  const Grammar open = schema_grammar(Json{{"type", "integer"}, {"exclusiveMinimum", 10}});
  EXPECT_FALSE(grammar_matches(open, "10"));
  EXPECT_TRUE(grammar_matches(open, "11"));
  EXPECT_TRUE(grammar_matches(open, "123456789012"));
}

TEST(JsonSchemaGrammar, RefsFormatsAndCombinators) {
  const Json schema = Json::parse(R"({
    "$defs": {"node": {"type": "object", "properties": {"v": {"type": "integer"},
                        "next": {"anyOf": [{"$ref": "#/$defs/node"}, {"type": "null"}]}},
                        "required": ["v", "next"], "additionalProperties": false}},
    "type": "object",
    "properties": {"list": {"$ref": "#/$defs/node"}, "when": {"type": "string", "format": "date"},
                   "code": {"type": "string", "pattern": "^[A-Z]{3}$"}, "kind": {"const": "x"}},
    "required": ["list", "when", "code", "kind"]})");
  const Grammar g = schema_grammar(schema);
  EXPECT_TRUE(grammar_matches(
      g, R"({"list":{"v":1,"next":{"v":2,"next":null}},"when":"2024-02-29","code":"ABC","kind":"x"})"));
  EXPECT_FALSE(grammar_matches(g, R"({"list":{"v":1,"next":null},"when":"2024-13-01","code":"ABC","kind":"x"})"));
  EXPECT_FALSE(grammar_matches(g, R"({"list":{"v":1,"next":null},"when":"2024-01-01","code":"ABCD","kind":"x"})"));
  EXPECT_FALSE(grammar_matches(g, R"({"list":{"v":1,"next":null},"when":"2024-01-01","code":"ABC","kind":"y"})"));
}

TEST(JsonSchemaGrammar, UnsupportedKeywordsAre400sNamingTheField) {
  for (const char* s : {R"({"type": "array", "uniqueItems": true})", R"({"not": {"type": "string"}})",
                        R"({"type": "number", "multipleOf": 2})", R"({"type": "object", "minProperties": 2})",
                        R"({"type": "number", "minimum": 0.5})", R"({"$ref": "http://example.com/s.json"})",
                        R"j({"type": "string", "pattern": "(?=x)"})j", "false"}) {
    GrammarBuilder b;
    try {
      json_schema_rule(b, Json::parse(s), "response_format");
      ADD_FAILURE() << s << " was accepted";
    } catch (const ApiError& e) {
      EXPECT_EQ(e.status(), 400);
      EXPECT_EQ(e.body()["error"]["param"], "response_format") << s;
    }
  }
}

// A toy vocabulary: every printable ASCII byte, some multi-byte tokens, a partial UTF-8 token,
// and an end token (id 0).
std::shared_ptr<TokenVocabulary> toy_vocab() {
  std::vector<std::string> bytes(1);
  for (int c = 32; c < 127; ++c) bytes.push_back(std::string(1, char(c)));
  for (const char* t : {"\n", "{\"", "\":", "\",", "true", "null", "  ", "ab", "\xc3", "\xa9", "\xc3\xa9", "[\"", "\"]",
                        "12", "-1", "name", "\"name\":", "}\n"})
    bytes.push_back(t);
  return std::make_shared<TokenVocabulary>(bytes, std::vector<int32_t>{0});
}

bool allowed(const std::vector<uint64_t>& words, int32_t id) { return (words[size_t(id) >> 6] >> (id & 63)) & 1; }

TEST(TokenMask, EqualsBruteForce) {
  auto vocab = toy_vocab();
  const Json schema = Json::parse(R"({"type": "object", "properties": {"name": {"type": "string", "maxLength": 3},
    "ok": {"type": "boolean"}}, "required": ["name", "ok"], "additionalProperties": false})");
  auto g = std::make_shared<CompiledGrammar>(schema_grammar(schema), vocab);
  const Grammar reference = schema_grammar(schema);
  std::mt19937 rng(1);
  for (int walk = 0; walk < 20; ++walk) {
    std::string text;
    int32_t state = g->initial();
    for (int step = 0; step < 200; ++step) {
      std::vector<uint64_t> words(g->vocab_words());
      g->mask(state, words.data());
      std::vector<int32_t> options;
      for (int32_t id = 0; id < vocab->size(); ++id) {
        const bool expect = id == 0 ? grammar_matches(reference, text)
                                    : grammar_prefix(reference, text + vocab->bytes(id));
        ASSERT_EQ(allowed(words, id), expect) << "text '" << text << "' token '" << vocab->bytes(id) << "'";
        if (expect) options.push_back(id);
      }
      ASSERT_FALSE(options.empty()) << text;
      const int32_t pick = options[rng() % options.size()];
      if (pick == 0) break;
      text += vocab->bytes(pick);
      state = g->advance(state, pick);
      ASSERT_NE(state, CompiledGrammar::kDead);
    }
  }
}

TEST(TokenMask, RandomWalksEndInValidJson) {
  auto vocab = toy_vocab();
  for (const char* s : {R"({"type": "object"})", R"({"type": "array", "items": {"type": "integer"}, "maxItems": 4})",
                        R"({"type": "object", "properties": {"a": {"type": "array", "items": {"type": "string",
                           "maxLength": 2}, "maxItems": 2}, "b": {"enum": [1, "x", null]}}, "required": ["a", "b"]})"}) {
    auto g = std::make_shared<CompiledGrammar>(schema_grammar(Json::parse(s)), vocab);
    std::mt19937 rng(3);
    int ended = 0;
    for (int walk = 0; walk < 50; ++walk) {
      auto matcher = g->start();
      std::string text;
      for (int step = 0; step < 400; ++step) {
        const uint64_t* words = matcher->allowed(vocab->size());
        std::vector<int32_t> options;
        for (int32_t id = 0; id < vocab->size(); ++id)
          if ((words[id >> 6] >> (id & 63)) & 1) options.push_back(id);
        ASSERT_FALSE(options.empty());
        // Prefer ending when possible, so walks finish.
        const int32_t pick = std::find(options.begin(), options.end(), 0) != options.end() && rng() % 4 == 0
                                 ? 0 : options[rng() % options.size()];
        matcher->accept(pick);
        if (pick == 0) {
          ++ended;
          EXPECT_FALSE(Json::parse(text, nullptr, false).is_discarded()) << s << ": " << text;
          break;
        }
        text += vocab->bytes(pick);
      }
    }
    EXPECT_GT(ended, 0) << s;
  }
}

TEST(TokenMask, MasksAreCachedPerState) {
  auto vocab = toy_vocab();
  auto g = std::make_shared<CompiledGrammar>(schema_grammar(Json{{"type", "string"}}), vocab);
  auto m = g->start();
  m->allowed(vocab->size());
  m->accept(int32_t(1 + ('"' - 32)));
  for (int i = 0; i < 50; ++i) {  // inside the string the state repeats: no new states after the first
    m->allowed(vocab->size());
    m->accept(int32_t(1 + ('x' - 32)));
  }
  EXPECT_LT(g->states(), 40u);
}

TEST(TokenMask, TooDeepEndsTheRequestInsteadOfThrowing) {
  auto vocab = toy_vocab();
  auto g = std::make_shared<CompiledGrammar>(schema_grammar(Json::object()), vocab);  // any JSON value
  auto m = g->start();
  const int32_t open = int32_t(1 + ('[' - 32));
  bool ended = false;
  for (int i = 0; i < 5000 && !ended; ++i) {
    const uint64_t* words = m->allowed(vocab->size());
    if (!((words[open >> 6] >> (open & 63)) & 1)) {
      ended = true;  // past the nesting limit: only the end token is left
      EXPECT_TRUE(words[0] & 1);
      for (int32_t id = 1; id < vocab->size(); ++id) EXPECT_FALSE((words[id >> 6] >> (id & 63)) & 1);
      break;
    }
    m->accept(open);
  }
  EXPECT_TRUE(ended);
}

// The Sampler side: a constrained row is sampled from the whole logits, only among the allowed
// tokens, and the matcher sees each sampled token.
TEST(SamplerConstraint, SamplesOnlyAllowedTokensAndAdvances) {
  auto vocab = toy_vocab();
  auto g = std::make_shared<CompiledGrammar>(regex_grammar("ab?c"), vocab);
  SamplingParams p;
  p.constraint = g;
  EXPECT_EQ(Sampler::top_width(p, vocab->size()), 0);
  for (const float temperature : {0.0f, 1.0f}) {
    p.temperature = temperature;
    p.seed = 5;
    Sampler sampler(p);
    std::vector<float> logits(size_t(vocab->size()), 0.0f);
    logits[size_t(1 + ('z' - 32))] = 50.0f;  // the model wants 'z', which the grammar never allows
    std::string text;
    for (int step = 0; step < 5; ++step) {
      const int32_t t = sampler.sample(logits.data(), vocab->size()).token;
      if (t == 0) break;
      text += vocab->bytes(t);
    }
    EXPECT_TRUE(text == "ac" || text == "abc") << text;
  }
}

}  // namespace
}  // namespace moet::server
