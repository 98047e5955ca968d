// Jinja lexer with HF transformers' settings: trim_blocks and lstrip_blocks on, "-"/"+"
// whitespace control, comments dropped, {% raw %} blocks passed through as text, newlines
// normalized to "\n" and one trailing newline removed (keep_trailing_newline=False), exactly
// as jinja2's lexer does. Produces a flat token list; every token records its byte offset.
#pragma once

#include <string>
#include <vector>

namespace moet::jinja {

struct Token {
  enum class Kind { text, var_begin, var_end, block_begin, block_end, name, string, integer, floating, op, eof };
  Kind kind;
  std::string text;  // text, name, unescaped string, number spelling or operator
  size_t pos;
};

// source must already be newline-normalized (see normalize_source).
std::vector<Token> lex_template(const std::string& source);
std::string normalize_source(const std::string& source);

}  // namespace moet::jinja
