// Jinja interpreter unit tests: whitespace control under HF's settings, scoping, filters and
// Python formatting, and errors that carry the template's line and column instead of crashing.
// Byte-parity with jinja2 on real templates lives in tests/python/tokenizer/test_chat_template_golden.py.
#include "core/error.h"
#include "tokenizer/chat_template.h"
#include "tokenizer/jinja_value.h"

#include <gtest/gtest.h>

namespace {

std::string render(const std::string& source, const std::string& request = "{}") {
  return moet::ChatTemplate(source).render(nlohmann::ordered_json::parse(request));
}

std::string error_of(const std::string& source) {
  try {
    render(source);
  } catch (const moet::Error& e) {
    return e.what();
  }
  return "no error";
}

TEST(Jinja, TrimAndLstripBlocks) {
  EXPECT_EQ(render("{% if true %}\n  x\n{% endif %}\ny"), "  x\ny");
  EXPECT_EQ(render("a\n    {% if true %}\nb\n    {% endif %}\nc"), "a\nb\nc");
  EXPECT_EQ(render("a  {%- if true -%}  b  {%- endif %}"), "ab");
  EXPECT_EQ(render("{{ 'x' }}\n"), "x");  // keep_trailing_newline=False
  EXPECT_EQ(render("{# c #}\nz{% raw %}{{ not }}{% endraw %}"), "z{{ not }}");
}

TEST(Jinja, LoopsScopesAndNamespaces) {
  EXPECT_EQ(render("{% for x in [1,2,3] if x != 2 %}{{ loop.index }}{{ x }}{% if loop.last %}!{% endif %}{% endfor %}"),
            "1123!");
  EXPECT_EQ(render("{% set x = 1 %}{% for i in [1] %}{% set x = 2 %}{% endfor %}{{ x }}"), "1");
  EXPECT_EQ(render("{% set ns = namespace(n=0) %}{% for i in range(4) %}{% set ns.n = ns.n + i %}{% endfor %}{{ ns.n }}"), "6");
  EXPECT_EQ(render("{% for k, v in {'a': 1, 'b': 2}.items() %}{{ k }}={{ v }};{% endfor %}"), "a=1;b=2;");
  EXPECT_EQ(render("{% for i in range(5) %}{% if i == 3 %}{% break %}{% endif %}{{ i }}{% endfor %}"), "012");
  EXPECT_EQ(render("{% macro m(a, b='B') %}[{{ a }}{{ b }}]{% endmacro %}{{ m(1) }}{{ m(2, b=3) }}"), "[1B][23]");
}

TEST(Jinja, PythonFormattingAndFilters) {
  EXPECT_EQ(render("{{ [1, 'a', none, true, 1.5] }}"), "[1, 'a', None, True, 1.5]");
  EXPECT_EQ(render("{{ {'k': 'v\u00e9'} | tojson }}"), "{\"k\": \"v\u00e9\"}");
  EXPECT_EQ(render("{{ {'a': [1, 2]} | tojson(indent=2) }}"), "{\n  \"a\": [\n    1,\n    2\n  ]\n}");
  EXPECT_EQ(render("{{ '  a b  '.strip().split(' ') }}"), "['a', 'b']");
  EXPECT_EQ(render("{{ 'x' if false }}|{{ undefined_name }}|{{ 7 // 2 }}|{{ -7 // 2 }}|{{ 1 / 4 }}"), "||3|-4|0.25");
  EXPECT_EQ(render("{{ [3, 1, 2] | sort | join(',') }}|{{ 'ab' * 2 }}|{{ 'a,b' | replace(',', ';') }}"), "1,2,3|abab|a;b");
  EXPECT_EQ(moet::jinja::python_float_repr(1e16), "1e+16");
  EXPECT_EQ(moet::jinja::python_float_repr(0.0001), "0.0001");
  EXPECT_EQ(moet::jinja::python_float_repr(1e-05), "1e-05");
  EXPECT_EQ(moet::jinja::python_float_repr(100.0), "100.0");
}

TEST(Jinja, RequestVariables) {
  EXPECT_EQ(render("{{ messages[0].content }}{{ add_generation_prompt }}{{ tools is none }}{{ enable_thinking }}",
                   R"({"messages": [{"role": "user", "content": "hi"}], "enable_thinking": false})"),
            "hiTrueTrueFalse");
}

TEST(Jinja, ErrorsCarryLineAndColumn) {
  EXPECT_EQ(error_of("ok\n{% if %}"), "line 2, column 7: unexpected end of statement block");
  EXPECT_NE(error_of("a\nb {{ x.y.z }}").find("line 2, column"), std::string::npos);
  EXPECT_NE(error_of("{{ raise_exception('bad role') }}").find("bad role"), std::string::npos);
  EXPECT_NE(error_of("{% for %}").find("line 1"), std::string::npos);
  EXPECT_NE(error_of("{{ [1].append(2) }}").find("unsafe"), std::string::npos);
  EXPECT_NE(error_of("{{ x | nosuchfilter }}").find("no filter named"), std::string::npos);
  EXPECT_NE(error_of("{{ " + std::string(1000, '(')).find("line 1"), std::string::npos);
  EXPECT_NE(error_of("{% macro f() %}{{ f() }}{% endmacro %}{{ f() }}").find("recursion"), std::string::npos);
}

TEST(Jinja, GarbageNeverCrashes) {
  for (const char* source : {"{{", "{%", "{#", "{{ 'a", "{% if x %}", "{% endfor %}", "{{ a[:: }}", "{{ }}",
                             "{% set %}", "{{ 1 +}}", "}}{%-%}", "{{ (1, }}", "{{ {'a' 1} }}", "\xFF{{ '\xFE' }}"})
    EXPECT_NO_FATAL_FAILURE(error_of(source));
}

}  // namespace
