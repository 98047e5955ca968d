// Jinja lexer (see jinja_lexer.h). Whitespace rules follow jinja2/lexer.py: a "-" on a tag strips
// the adjacent whitespace; lstrip_blocks removes the spaces/tabs between a line start and a block
// or comment tag; trim_blocks removes the first newline after a block or comment tag.
#include "tokenizer/jinja_lexer.h"

#include "core/error.h"
#include "tokenizer/jinja_ast.h"
#include "tokenizer/unicode.h"

#include <cctype>
#include <cstring>

namespace moet::jinja {

std::string normalize_source(const std::string& source) {
  std::string out;
  out.reserve(source.size());
  for (size_t i = 0; i < source.size(); ++i) {
    if (source[i] == '\r') {
      out.push_back('\n');
      if (i + 1 < source.size() && source[i + 1] == '\n') ++i;
    } else {
      out.push_back(source[i]);
    }
  }
  if (!out.empty() && out.back() == '\n') out.pop_back();
  return out;
}

namespace {

bool is_ws(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v'; }

class Lexer {
 public:
  explicit Lexer(const std::string& src) : src_(src) {}

  std::vector<Token> run() {
    size_t pos = 0;
    bool line_starting = true;
    while (pos < src_.size()) {
      const size_t tag = find_tag(pos);
      std::string text = src_.substr(pos, tag - pos);
      if (tag == src_.size()) {
        emit_text(std::move(text), pos);
        break;
      }
      const char type = src_[tag + 1];
      const char modifier = tag + 2 < src_.size() ? src_[tag + 2] : '\0';
      if (modifier == '-') {
        while (!text.empty() && is_ws(text.back())) text.pop_back();
      } else if (type != '{' && modifier != '+') {
        const size_t line_begin = text.rfind('\n');
        const size_t from = line_begin == std::string::npos ? 0 : line_begin + 1;
        if ((line_begin != std::string::npos || line_starting) &&
            text.find_first_not_of(" \t", from) == std::string::npos)
          text.erase(from);
      }
      emit_text(std::move(text), pos);
      size_t body = tag + 2 + ((modifier == '-' || modifier == '+') ? 1 : 0);
      if (type == '#') pos = lex_comment(tag, body);
      else if (type == '{') pos = lex_expression(tag, body, "}}", Token::Kind::var_begin, Token::Kind::var_end);
      else if (is_raw(body)) pos = lex_raw(tag, body);
      else pos = lex_expression(tag, body, "%}", Token::Kind::block_begin, Token::Kind::block_end);
      line_starting = pos > 0 && src_[pos - 1] == '\n';
    }
    tokens_.push_back({Token::Kind::eof, "", src_.size()});
    return std::move(tokens_);
  }

 private:
  [[noreturn]] void error(size_t pos, const std::string& message) const {
    fail("{}: {}", source_location(src_, pos), message);
  }

  size_t find_tag(size_t from) const {
    for (size_t i = src_.find('{', from); i != std::string::npos; i = src_.find('{', i + 1))
      if (i + 1 < src_.size() && (src_[i + 1] == '{' || src_[i + 1] == '%' || src_[i + 1] == '#')) return i;
    return src_.size();
  }

  void emit_text(std::string text, size_t pos) {
    if (!text.empty()) tokens_.push_back({Token::Kind::text, std::move(text), pos});
  }

  // After a tag's closing delimiter at end: "-" strips all following whitespace, a block or
  // comment tag without "+" drops one newline (trim_blocks).
  size_t after_close(size_t end, char modifier, bool block) const {
    if (modifier == '-') {
      while (end < src_.size() && is_ws(src_[end])) ++end;
    } else if (block && modifier != '+' && end < src_.size() && src_[end] == '\n') {
      ++end;
    }
    return end;
  }

  size_t lex_comment(size_t tag, size_t body) {
    const size_t close = src_.find("#}", body);
    if (close == std::string::npos) error(tag, "unclosed comment");
    const char modifier = close > body && (src_[close - 1] == '-' || src_[close - 1] == '+') ? src_[close - 1] : '\0';
    return after_close(close + 2, modifier, true);
  }

  bool is_raw(size_t body) const {
    size_t i = body;
    while (i < src_.size() && is_ws(src_[i])) ++i;
    if (src_.compare(i, 3, "raw") != 0) return false;
    i += 3;
    while (i < src_.size() && is_ws(src_[i])) ++i;
    return src_.compare(i, 2, "%}") == 0 || src_.compare(i, 3, "-%}") == 0 || src_.compare(i, 3, "+%}") == 0;
  }

  size_t lex_raw(size_t tag, size_t body) {
    const size_t open_close = src_.find("%}", body);
    size_t content = after_close(open_close + 2, src_[open_close - 1], true);
    for (size_t k = src_.find("{%", content); k != std::string::npos; k = src_.find("{%", k + 2)) {
      size_t i = k + 2;
      const bool strip_before = i < src_.size() && src_[i] == '-';
      if (strip_before || (i < src_.size() && src_[i] == '+')) ++i;
      while (i < src_.size() && is_ws(src_[i])) ++i;
      if (src_.compare(i, 6, "endraw") != 0) continue;
      const size_t close = src_.find("%}", i);
      if (close == std::string::npos) break;
      std::string text = src_.substr(content, k - content);
      if (strip_before)
        while (!text.empty() && is_ws(text.back())) text.pop_back();
      emit_text(std::move(text), content);
      return after_close(close + 2, src_[close - 1], true);
    }
    error(tag, "missing endraw");
  }

  size_t lex_expression(size_t tag, size_t i, const char* close, Token::Kind begin, Token::Kind end) {
    tokens_.push_back({begin, "", tag});
    int depth = 0;
    while (true) {
      while (i < src_.size() && is_ws(src_[i])) ++i;
      if (i >= src_.size()) error(tag, std::string("unexpected end of template, expected '") + close + "'");
      if (depth == 0) {
        const bool modified = (src_[i] == '-' || src_[i] == '+') && src_.compare(i + 1, 2, close) == 0;
        if (modified || src_.compare(i, 2, close) == 0) {
          tokens_.push_back({end, "", i});
          const size_t after = i + 2 + (modified ? 1 : 0);
          return after_close(after, modified ? src_[i] : '\0', begin == Token::Kind::block_begin);
        }
      }
      const char c = src_[i];
      if (std::isalpha(uint8_t(c)) || c == '_') {
        size_t j = i;
        while (j < src_.size() && (std::isalnum(uint8_t(src_[j])) || src_[j] == '_')) ++j;
        tokens_.push_back({Token::Kind::name, src_.substr(i, j - i), i});
        i = j;
      } else if (std::isdigit(uint8_t(c))) {
        i = lex_number(i);
      } else if (c == '\'' || c == '"') {
        i = lex_string(i);
      } else {
        static const char* const ops[] = {"//", "**", "==", "!=", "<=", ">=", "+", "-", "*", "/", "%", "~", "<",
                                          ">", "=", "(", ")", "[", "]", "{", "}", ",", ".", ":", "|"};
        const char* match = nullptr;
        for (const char* op : ops)
          if (src_.compare(i, std::strlen(op), op) == 0) {
            match = op;
            break;
          }
        if (!match) error(i, fmt::format("unexpected character '{}'", c));
        if (*match == '(' || *match == '[' || *match == '{') ++depth;
        if (*match == ')' || *match == ']' || *match == '}') --depth;
        tokens_.push_back({Token::Kind::op, match, i});
        i += std::strlen(match);
      }
    }
  }

  size_t lex_number(size_t i) {
    size_t j = i;
    while (j < src_.size() && (std::isdigit(uint8_t(src_[j])) || src_[j] == '_')) ++j;
    bool is_float = false;
    if (j + 1 < src_.size() && src_[j] == '.' && std::isdigit(uint8_t(src_[j + 1]))) {
      is_float = true;
      ++j;
      while (j < src_.size() && (std::isdigit(uint8_t(src_[j])) || src_[j] == '_')) ++j;
    }
    if (j < src_.size() && (src_[j] == 'e' || src_[j] == 'E')) {
      size_t k = j + 1;
      if (k < src_.size() && (src_[k] == '+' || src_[k] == '-')) ++k;
      if (k < src_.size() && std::isdigit(uint8_t(src_[k]))) {
        is_float = true;
        j = k;
        while (j < src_.size() && std::isdigit(uint8_t(src_[j]))) ++j;
      }
    }
    std::string spelling;
    for (size_t k = i; k < j; ++k)
      if (src_[k] != '_') spelling.push_back(src_[k]);
    tokens_.push_back({is_float ? Token::Kind::floating : Token::Kind::integer, spelling, i});
    return j;
  }

  size_t lex_string(size_t i) {
    const char quote = src_[i];
    std::string out;
    size_t j = i + 1;
    while (j < src_.size() && src_[j] != quote) {
      if (src_[j] != '\\' || j + 1 >= src_.size()) {
        out.push_back(src_[j++]);
        continue;
      }
      const char e = src_[j + 1];
      j += 2;
      switch (e) {
        case 'n': out.push_back('\n'); break;
        case 't': out.push_back('\t'); break;
        case 'r': out.push_back('\r'); break;
        case '0': out.push_back('\0'); break;
        case '\\': case '\'': case '"': out.push_back(e); break;
        case '\n': break;
        case 'x': case 'u': case 'U': {
          const size_t width = e == 'x' ? 2 : e == 'u' ? 4 : 8;
          uint32_t cp = 0;
          for (size_t k = 0; k < width; ++k) {
            const char h = j + k < src_.size() ? src_[j + k] : '\0';
            const int digit = std::isdigit(uint8_t(h)) ? h - '0' : (h >= 'a' && h <= 'f') ? h - 'a' + 10
                            : (h >= 'A' && h <= 'F') ? h - 'A' + 10 : -1;
            if (digit < 0) error(j, "truncated \\" + std::string(1, e) + " escape");
            cp = cp * 16 + uint32_t(digit);
          }
          if (cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) error(j, "escape is not a valid code point");
          tok::utf8_append(out, char32_t(cp));
          j += width;
          break;
        }
        default: out.push_back('\\'); out.push_back(e);
      }
    }
    if (j >= src_.size()) error(i, "unterminated string");
    tokens_.push_back({Token::Kind::string, std::move(out), i});
    return j + 1;
  }

  const std::string& src_;
  std::vector<Token> tokens_;
};

}  // namespace

std::vector<Token> lex_template(const std::string& source) { return Lexer(source).run(); }

}  // namespace moet::jinja
