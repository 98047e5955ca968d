// Grammar: a context-free grammar over bytes, the common form of every structured-output
// constraint (JSON schema, regex, choice, tool calls; see json_schema_grammar.h, regex_grammar.h).
// A rule is a list of alternatives; an alternative a sequence of symbols, each a byte set or a
// reference to a rule. Text is matched a byte at a time (UTF-8 is spelled out as byte sequences),
// so a token that holds part of a character is matched like any other.
// Matching keeps a set of stacks (as llama.cpp's GBNF matcher): each stack's top is the position
// of the terminal to match next, the positions below it are where to return; an empty stack means
// the text so far is a complete sentence. Grammars must not be left-recursive (the builders here
// make right-recursive repetitions), which keeps every expansion finite.
// GrammarBuilder makes grammars: literals, byte sets, code-point ranges (as UTF-8), repetition
// with bounds, and "any text up to a marker".
#pragma once

#include <array>
#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace moet::server {

using ByteSet = std::array<uint64_t, 4>;

inline bool byteset_has(const ByteSet& s, uint8_t b) { return (s[b >> 6] >> (b & 63)) & 1; }
inline void byteset_add(ByteSet& s, uint8_t b) { s[b >> 6] |= uint64_t(1) << (b & 63); }

struct Grammar {
  static constexpr int32_t kEnd = INT32_MIN;  // ends an alternative in `code`
  // Symbols: >= 0 a byte-set index into `sets`; otherwise ~rule. Alternatives end with kEnd.
  std::vector<int32_t> code;
  std::vector<std::vector<uint32_t>> alternatives;  // per rule: offsets into `code`
  std::vector<ByteSet> sets;
  uint32_t root = 0;
};

using GrammarStack = std::vector<uint32_t>;
using GrammarStacks = std::set<GrammarStack>;  // canonical (sorted, no duplicates)

// The stacks that start matching `rule` (every alternative expanded to a terminal or to the end).
GrammarStacks grammar_start(const Grammar& g, uint32_t rule);
// The stacks after matching one more byte; empty when the byte cannot continue any of them.
GrammarStacks grammar_advance(const Grammar& g, const GrammarStacks& stacks, uint8_t byte);
// True when some stack is empty: the bytes so far form a complete sentence.
bool grammar_complete(const GrammarStacks& stacks);
// Matches all of `text` from the root; true when it is a complete sentence (for tests).
bool grammar_matches(const Grammar& g, std::string_view text);
// True when `text` can still be extended to a sentence (a prefix of one).
bool grammar_prefix(const Grammar& g, std::string_view text);

class GrammarBuilder {
 public:
  using Sym = int32_t;
  using Seq = std::vector<Sym>;
  struct Range {
    uint32_t lo, hi;  // code points, inclusive
  };

  uint32_t new_rule();
  void add(uint32_t rule, Seq alternative);
  Sym ref(uint32_t rule) const { return ~int32_t(rule); }
  // A rule with these alternatives, as a symbol.
  Sym choice(std::vector<Seq> alternatives);
  Sym set(const ByteSet& s);
  Sym byte(uint8_t b);
  Sym byte_range(uint8_t lo, uint8_t hi);
  Seq literal(std::string_view bytes);
  Sym literal_sym(std::string_view bytes);
  // One code point out of these ranges (surrogates never), spelled as UTF-8.
  Sym codepoints(std::vector<Range> ranges);
  Sym star(Sym x);
  Sym plus(Sym x);
  Sym optional(Sym x);
  // min..max repetitions (max < 0: unbounded). Throws moet::Error beyond `limit` rules.
  Sym repeat(Sym x, int64_t min, int64_t max);
  // Any bytes, then `marker` (the first occurrence of it ends the text).
  Sym text_until(std::string_view marker);
  Grammar build(Sym root);
  size_t rules() const { return grammar_.alternatives.size(); }

 private:
  Grammar grammar_;
  std::map<ByteSet, Sym> set_ids_;
  std::map<std::pair<Sym, int>, Sym> memo_;  // (x, kind) -> star / plus / optional
};

// Code-point ranges minus `remove` (both sorted or not; the result is sorted and merged).
std::vector<GrammarBuilder::Range> ranges_subtract(std::vector<GrammarBuilder::Range> ranges,
                                                   const std::vector<GrammarBuilder::Range>& remove);
std::vector<GrammarBuilder::Range> ranges_complement(std::vector<GrammarBuilder::Range> ranges);

}  // namespace moet::server
