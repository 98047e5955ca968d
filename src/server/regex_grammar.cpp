// regex_rule (see regex_grammar.h): a recursive-descent parser over the pattern's code points that
// emits grammar rules as it goes. The class escapes are ASCII (\d = [0-9], \w = [A-Za-z0-9_],
// \s = ASCII whitespace; \D \W \S their complements within ASCII), so whatever is generated also
// matches under Unicode-aware engines (Python's re, which jsonschema validators use), where
// these classes are wider.
#include "server/regex_grammar.h"

#include "core/error.h"

#include <fmt/format.h>

#include <string>

namespace moet::server {
namespace {

using Sym = GrammarBuilder::Sym;
using Seq = GrammarBuilder::Seq;
using Range = GrammarBuilder::Range;
using Ranges = std::vector<Range>;

std::u32string decode_utf8(std::string_view s) {
  std::u32string out;
  for (size_t i = 0; i < s.size();) {
    const auto c = uint8_t(s[i]);
    const int n = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
    MOET_CHECK(n > 0 && i + size_t(n) <= s.size(), "regex: the pattern is not valid UTF-8");
    uint32_t cp = n == 1 ? c : c & (0x7F >> n);
    for (int k = 1; k < n; ++k) cp = (cp << 6) | (uint8_t(s[i + size_t(k)]) & 0x3F);
    out.push_back(char32_t(cp));
    i += size_t(n);
  }
  return out;
}

const Ranges kDigit = {{'0', '9'}};
const Ranges kWord = {{'0', '9'}, {'A', 'Z'}, {'_', '_'}, {'a', 'z'}};
const Ranges kSpace = {{'\t', '\r'}, {' ', ' '}};
const Ranges kAscii = {{0, 0x7F}};

std::string json_escape(uint32_t c) {
  switch (c) {
    case '"': return "\\\"";
    case '\\': return "\\\\";
    case '\b': return "\\b";
    case '\f': return "\\f";
    case '\n': return "\\n";
    case '\r': return "\\r";
    case '\t': return "\\t";
    default: return fmt::format("\\u{:04x}", c);
  }
}

bool in_ranges(const Ranges& r, uint32_t c) {
  for (const Range& x : r)
    if (c >= x.lo && c <= x.hi) return true;
  return false;
}

class RegexCompiler {
 public:
  RegexCompiler(GrammarBuilder& b, std::string_view pattern, bool json)
      : b_(b), p_(decode_utf8(pattern)), json_(json) {}

  Sym compile() {
    if (!p_.empty() && p_[0] == '^') ++pos_;
    const Sym s = alternation();
    if (pos_ != p_.size()) error("unbalanced ')'");
    return s;
  }

 private:
  [[noreturn]] void error(const std::string& what) const { fail("regex: {} (at character {})", what, pos_); }
  bool more() const { return pos_ < p_.size(); }
  uint32_t peek() const { return uint32_t(p_[pos_]); }

  Sym alternation() {
    std::vector<Seq> alternatives{concat()};
    while (more() && peek() == '|') {
      ++pos_;
      alternatives.push_back(concat());
    }
    return b_.choice(std::move(alternatives));
  }

  Seq concat() {
    Seq seq;
    while (more() && peek() != '|' && peek() != ')') {
      if (peek() == '$') {
        if (pos_ + 1 != p_.size()) error("'$' is only supported at the end");
        ++pos_;
        continue;
      }
      seq.push_back(quantified(atom()));
    }
    return seq;
  }

  int64_t number() {
    if (!more() || peek() < '0' || peek() > '9') error("a number was expected in {n,m}");
    int64_t v = 0;
    while (more() && peek() >= '0' && peek() <= '9') {
      v = v * 10 + int64_t(peek() - '0');
      if (v > 100000) error("repetition counts above 100000 are not supported");
      ++pos_;
    }
    return v;
  }

  Sym quantified(Sym a) {
    while (more()) {
      const uint32_t c = peek();
      if (c == '*') a = b_.star(a);
      else if (c == '+') a = b_.plus(a);
      else if (c == '?') a = b_.optional(a);
      else if (c == '{') {
        ++pos_;
        const int64_t min = number();
        int64_t max = min;
        if (more() && peek() == ',') {
          ++pos_;
          max = more() && peek() == '}' ? -1 : number();
        }
        if (!more() || peek() != '}') error("'}' expected");
        if (max >= 0 && max < min) error("{n,m} with m < n");
        a = b_.repeat(a, min, max);
      } else {
        break;
      }
      ++pos_;
      if (more() && peek() == '?') ++pos_;  // lazy: the same strings
    }
    return a;
  }

  Sym chars(const Ranges& r) {
    if (!json_) return b_.codepoints(r);
    const Ranges plain = ranges_subtract(r, {{'"', '"'}, {'\\', '\\'}, {0, 0x1F}});
    std::vector<Seq> alternatives;
    if (!plain.empty()) alternatives.push_back({b_.codepoints(plain)});
    for (uint32_t c = 0; c < 0x20; ++c)
      if (in_ranges(r, c)) alternatives.push_back(b_.literal(json_escape(c)));
    for (uint32_t c : {uint32_t('"'), uint32_t('\\')})
      if (in_ranges(r, c)) alternatives.push_back(b_.literal(json_escape(c)));
    if (alternatives.empty()) error("a character class matches nothing");
    return b_.choice(std::move(alternatives));
  }

  uint32_t hex(int digits) {
    uint32_t v = 0;
    for (int i = 0; i < digits; ++i, ++pos_) {
      if (!more()) error("hex digits expected");
      const uint32_t c = peek();
      const int d = c >= '0' && c <= '9' ? int(c - '0') : c >= 'a' && c <= 'f' ? int(c - 'a' + 10)
                  : c >= 'A' && c <= 'F' ? int(c - 'A' + 10) : -1;
      if (d < 0) error("hex digits expected");
      v = v * 16 + uint32_t(d);
    }
    return v;
  }

  // After a backslash: a class (returned in `set`) or one character.
  Ranges escape() {
    if (!more()) error("a trailing backslash");
    const uint32_t c = peek();
    ++pos_;
    switch (c) {
      case 'd': return kDigit;
      case 'w': return kWord;
      case 's': return kSpace;
      case 'D': return ranges_subtract(kAscii, kDigit);
      case 'W': return ranges_subtract(kAscii, kWord);
      case 'S': return ranges_subtract(kAscii, kSpace);
      case 'n': return {{'\n', '\n'}};
      case 't': return {{'\t', '\t'}};
      case 'r': return {{'\r', '\r'}};
      case 'f': return {{'\f', '\f'}};
      case 'v': return {{'\v', '\v'}};
      case '0': return {{0, 0}};
      case 'x': {
        const uint32_t v = hex(2);
        return {{v, v}};
      }
      case 'u': {
        uint32_t v = 0;
        if (more() && peek() == '{') {
          ++pos_;
          while (more() && peek() != '}') v = v * 16 + hex(1);
          if (!more() || v > 0x10FFFF) error("bad \\u{...} escape");
          ++pos_;
        } else {
          v = hex(4);
        }
        return {{v, v}};
      }
      case 'b':
      case 'B': error("word boundaries (\\b, \\B) are not supported");
      default:
        if (c >= '1' && c <= '9') error("backreferences are not supported");
        if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z')) error(fmt::format("unknown escape \\{}", char(c)));
        return {{c, c}};
    }
  }

  Sym klass() {
    bool negate = false;
    if (more() && peek() == '^') {
      negate = true;
      ++pos_;
    }
    Ranges ranges;
    bool first = true;
    while (true) {
      if (!more()) error("unterminated character class");
      uint32_t c = peek();
      if (c == ']' && !first) {
        ++pos_;
        break;
      }
      first = false;
      ++pos_;
      Ranges item;
      if (c == '\\') item = escape();
      else item = {{c, c}};
      const bool single = item.size() == 1 && item[0].lo == item[0].hi;
      if (single && pos_ + 1 < p_.size() && peek() == '-' && p_[pos_ + 1] != ']') {
        ++pos_;
        uint32_t hi = peek();
        ++pos_;
        if (hi == '\\') {
          const Ranges e = escape();
          if (e.size() != 1 || e[0].lo != e[0].hi) error("a class cannot end a range");
          hi = e[0].lo;
        }
        if (hi < item[0].lo) error("a range out of order");
        item = {{item[0].lo, hi}};
      }
      ranges.insert(ranges.end(), item.begin(), item.end());
    }
    if (negate) ranges = ranges_complement(ranges);
    return chars(ranges);
  }

  Sym atom() {
    const uint32_t c = peek();
    ++pos_;
    switch (c) {
      case '(': {
        if (more() && peek() == '?') {
          ++pos_;
          if (more() && peek() == ':') {
            ++pos_;
          } else if (more() && (peek() == '<' || peek() == 'P')) {
            if (peek() == 'P') ++pos_;
            if (!more() || peek() != '<') error("bad group");
            ++pos_;
            if (more() && (peek() == '=' || peek() == '!')) error("lookbehind is not supported");
            while (more() && peek() != '>') ++pos_;
            if (!more()) error("unterminated group name");
            ++pos_;
          } else {
            error("lookahead and group flags are not supported");
          }
        }
        const Sym inner = alternation();
        if (!more() || peek() != ')') error("missing ')'");
        ++pos_;
        return inner;
      }
      case '[': return klass();
      case '.': return chars(ranges_subtract({{0, 0x10FFFF}}, {{'\n', '\n'}, {'\r', '\r'}, {0x2028, 0x2029}}));
      case '\\': return chars(escape());
      case '^': error("'^' is only supported at the start");
      case '*':
      case '+':
      case '?':
      case '{': error("a quantifier with nothing to repeat");
      default: return chars({{c, c}});
    }
  }

  GrammarBuilder& b_;
  std::u32string p_;
  bool json_;
  size_t pos_ = 0;
};

}  // namespace

Sym regex_rule(GrammarBuilder& b, std::string_view pattern, bool json_string) {
  return RegexCompiler(b, pattern, json_string).compile();
}

}  // namespace moet::server
