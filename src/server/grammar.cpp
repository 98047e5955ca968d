// Grammar matching and building (see grammar.h). UTF-8 ranges are split into byte-range
// sequences the way regex engines do (a range of one encoded length at a time, then cut where
// the continuation bytes would not cover their whole span).
#include "server/grammar.h"

#include "core/error.h"

#include <algorithm>

namespace moet::server {
namespace {

constexpr size_t kMaxRules = 400000;
constexpr size_t kMaxDepth = 512;       // stack height: nesting (JSON: about 170 levels), or left recursion
constexpr size_t kMaxClosure = 200000;  // intermediate stacks of one expansion

// Expands every stack of `work` until its top is a terminal (or it is empty) and adds the results
// to `out`. Each intermediate stack is expanded once (nested optional or nullable rules reach the
// same continuation many ways: without this, exponentially often), and the work is capped, so a
// hostile grammar fails (moet::Error) instead of running away.
void closure(const Grammar& g, std::vector<GrammarStack> work, GrammarStacks& out) {
  std::set<GrammarStack> seen;
  while (!work.empty()) {
    GrammarStack stack = std::move(work.back());
    work.pop_back();
    if (!seen.insert(stack).second) continue;
    MOET_CHECK(seen.size() <= kMaxClosure, "grammar: too ambiguous (more than {} ways to continue)", kMaxClosure);
    MOET_CHECK(stack.size() <= kMaxDepth, "grammar: nesting deeper than {} (or a left-recursive rule)", kMaxDepth);
    if (stack.empty()) {
      out.insert(std::move(stack));
      continue;
    }
    const uint32_t pos = stack.back();
    const int32_t sym = g.code[pos];
    if (sym == Grammar::kEnd) {
      stack.pop_back();
      work.push_back(std::move(stack));
      continue;
    }
    if (sym >= 0) {
      out.insert(std::move(stack));
      continue;
    }
    const uint32_t rule = uint32_t(~sym);
    stack.back() = pos + 1;
    if (g.code[pos + 1] == Grammar::kEnd) stack.pop_back();  // a tail reference: nothing to return to
    for (uint32_t start : g.alternatives[rule]) {
      GrammarStack next = stack;
      next.push_back(start);
      work.push_back(std::move(next));
    }
  }
}

void utf8_encode(uint32_t cp, uint8_t* out, int& n) {
  if (cp < 0x80) {
    out[0] = uint8_t(cp);
    n = 1;
  } else if (cp < 0x800) {
    out[0] = uint8_t(0xC0 | (cp >> 6));
    out[1] = uint8_t(0x80 | (cp & 0x3F));
    n = 2;
  } else if (cp < 0x10000) {
    out[0] = uint8_t(0xE0 | (cp >> 12));
    out[1] = uint8_t(0x80 | ((cp >> 6) & 0x3F));
    out[2] = uint8_t(0x80 | (cp & 0x3F));
    n = 3;
  } else {
    out[0] = uint8_t(0xF0 | (cp >> 18));
    out[1] = uint8_t(0x80 | ((cp >> 12) & 0x3F));
    out[2] = uint8_t(0x80 | ((cp >> 6) & 0x3F));
    out[3] = uint8_t(0x80 | (cp & 0x3F));
    n = 4;
  }
}

int utf8_length(uint32_t cp) { return cp < 0x80 ? 1 : cp < 0x800 ? 2 : cp < 0x10000 ? 3 : 4; }

// [lo, hi] of one encoded length -> sequences of byte ranges.
void utf8_sequences(uint32_t lo, uint32_t hi, std::vector<std::vector<std::pair<uint8_t, uint8_t>>>& out) {
  const int n = utf8_length(lo);
  for (int i = 1; i < n; ++i) {
    const uint32_t m = (uint32_t(1) << (6 * i)) - 1;
    if ((lo & ~m) != (hi & ~m)) {
      if ((lo & m) != 0) {
        utf8_sequences(lo, lo | m, out);
        utf8_sequences((lo | m) + 1, hi, out);
        return;
      }
      if ((hi & m) != m) {
        utf8_sequences(lo, (hi & ~m) - 1, out);
        utf8_sequences(hi & ~m, hi, out);
        return;
      }
    }
  }
  uint8_t a[4], b[4];
  int na = 0, nb = 0;
  utf8_encode(lo, a, na);
  utf8_encode(hi, b, nb);
  std::vector<std::pair<uint8_t, uint8_t>> seq;
  for (int i = 0; i < na; ++i) seq.emplace_back(a[i], b[i]);
  out.push_back(std::move(seq));
}

std::vector<GrammarBuilder::Range> normalize(std::vector<GrammarBuilder::Range> r) {
  std::sort(r.begin(), r.end(), [](const auto& x, const auto& y) { return x.lo < y.lo; });
  std::vector<GrammarBuilder::Range> out;
  for (const auto& x : r) {
    if (x.lo > x.hi) continue;
    if (!out.empty() && x.lo <= out.back().hi + 1) out.back().hi = std::max(out.back().hi, x.hi);
    else out.push_back(x);
  }
  return out;
}

}  // namespace

GrammarStacks grammar_start(const Grammar& g, uint32_t rule) {
  std::vector<GrammarStack> work;
  for (uint32_t start : g.alternatives[rule]) work.push_back(GrammarStack{start});
  GrammarStacks out;
  closure(g, std::move(work), out);
  return out;
}

GrammarStacks grammar_advance(const Grammar& g, const GrammarStacks& stacks, uint8_t byte) {
  std::vector<GrammarStack> work;
  for (const GrammarStack& stack : stacks) {
    if (stack.empty()) continue;
    const uint32_t pos = stack.back();
    if (!byteset_has(g.sets[size_t(g.code[pos])], byte)) continue;
    work.push_back(stack);
    work.back().back() = pos + 1;
  }
  GrammarStacks out;
  closure(g, std::move(work), out);
  return out;
}

bool grammar_complete(const GrammarStacks& stacks) { return !stacks.empty() && stacks.begin()->empty(); }

bool grammar_prefix(const Grammar& g, std::string_view text) {
  GrammarStacks s = grammar_start(g, g.root);
  for (char c : text) {
    s = grammar_advance(g, s, uint8_t(c));
    if (s.empty()) return false;
  }
  return true;
}

bool grammar_matches(const Grammar& g, std::string_view text) {
  GrammarStacks s = grammar_start(g, g.root);
  for (char c : text) {
    s = grammar_advance(g, s, uint8_t(c));
    if (s.empty()) return false;
  }
  return grammar_complete(s);
}

std::vector<GrammarBuilder::Range> ranges_subtract(std::vector<GrammarBuilder::Range> ranges,
                                                   const std::vector<GrammarBuilder::Range>& remove) {
  std::vector<GrammarBuilder::Range> out = normalize(std::move(ranges));
  for (const auto& r : normalize(remove)) {
    std::vector<GrammarBuilder::Range> next;
    for (const auto& x : out) {
      if (r.hi < x.lo || r.lo > x.hi) {
        next.push_back(x);
        continue;
      }
      if (x.lo < r.lo) next.push_back({x.lo, r.lo - 1});
      if (x.hi > r.hi) next.push_back({r.hi + 1, x.hi});
    }
    out = std::move(next);
  }
  return out;
}

std::vector<GrammarBuilder::Range> ranges_complement(std::vector<GrammarBuilder::Range> ranges) {
  return ranges_subtract({{0, 0x10FFFF}}, ranges);
}

uint32_t GrammarBuilder::new_rule() {
  MOET_CHECK(grammar_.alternatives.size() < kMaxRules, "grammar: more than {} rules (the schema is too large)",
             kMaxRules);
  grammar_.alternatives.emplace_back();
  return uint32_t(grammar_.alternatives.size() - 1);
}

void GrammarBuilder::add(uint32_t rule, Seq alternative) {
  grammar_.alternatives[rule].push_back(uint32_t(grammar_.code.size()));
  grammar_.code.insert(grammar_.code.end(), alternative.begin(), alternative.end());
  grammar_.code.push_back(Grammar::kEnd);
}

GrammarBuilder::Sym GrammarBuilder::choice(std::vector<Seq> alternatives) {
  if (alternatives.size() == 1 && alternatives[0].size() == 1 && alternatives[0][0] < 0) return alternatives[0][0];
  const uint32_t r = new_rule();
  for (auto& a : alternatives) add(r, std::move(a));
  return ref(r);
}

GrammarBuilder::Sym GrammarBuilder::set(const ByteSet& s) {
  const auto it = set_ids_.find(s);
  if (it != set_ids_.end()) return it->second;
  grammar_.sets.push_back(s);
  const Sym id = Sym(grammar_.sets.size() - 1);
  set_ids_.emplace(s, id);
  return id;
}

GrammarBuilder::Sym GrammarBuilder::byte(uint8_t b) { return byte_range(b, b); }

GrammarBuilder::Sym GrammarBuilder::byte_range(uint8_t lo, uint8_t hi) {
  ByteSet s{};
  for (int b = lo; b <= hi; ++b) byteset_add(s, uint8_t(b));
  return set(s);
}

GrammarBuilder::Seq GrammarBuilder::literal(std::string_view bytes) {
  Seq seq;
  for (char c : bytes) seq.push_back(byte(uint8_t(c)));
  return seq;
}

GrammarBuilder::Sym GrammarBuilder::literal_sym(std::string_view bytes) { return choice({literal(bytes)}); }

GrammarBuilder::Sym GrammarBuilder::codepoints(std::vector<Range> ranges) {
  ranges = ranges_subtract(std::move(ranges), {{0xD800, 0xDFFF}});
  std::vector<Seq> alternatives;
  ByteSet ascii{};
  bool has_ascii = false;
  for (const Range& r : ranges) {
    // Split at the encoded-length boundaries, then into byte-range sequences.
    for (const auto [lo, hi] : {std::pair<uint32_t, uint32_t>{0, 0x7F}, {0x80, 0x7FF}, {0x800, 0xFFFF},
                                {0x10000, 0x10FFFF}}) {
      const uint32_t a = std::max(lo, r.lo), b = std::min(hi, r.hi);
      if (a > b) continue;
      if (hi == 0x7F) {
        for (uint32_t c = a; c <= b; ++c) byteset_add(ascii, uint8_t(c));
        has_ascii = true;
        continue;
      }
      std::vector<std::vector<std::pair<uint8_t, uint8_t>>> seqs;
      utf8_sequences(a, b, seqs);
      for (const auto& seq : seqs) {
        Seq s;
        for (const auto [x, y] : seq) s.push_back(byte_range(x, y));
        alternatives.push_back(std::move(s));
      }
    }
  }
  if (has_ascii) alternatives.insert(alternatives.begin(), Seq{set(ascii)});
  MOET_CHECK(!alternatives.empty(), "grammar: an empty character class matches nothing");
  if (alternatives.size() == 1 && alternatives[0].size() == 1) return alternatives[0][0];
  return choice(std::move(alternatives));
}

GrammarBuilder::Sym GrammarBuilder::star(Sym x) {
  const auto key = std::make_pair(x, 0);
  if (const auto it = memo_.find(key); it != memo_.end()) return it->second;
  const uint32_t r = new_rule();
  add(r, {x, ref(r)});
  add(r, {});
  return memo_[key] = ref(r);
}

GrammarBuilder::Sym GrammarBuilder::plus(Sym x) {
  const auto key = std::make_pair(x, 1);
  if (const auto it = memo_.find(key); it != memo_.end()) return it->second;
  const Sym rest = star(x);
  return memo_[key] = choice({{x, rest}});
}

GrammarBuilder::Sym GrammarBuilder::optional(Sym x) {
  const auto key = std::make_pair(x, 2);
  if (const auto it = memo_.find(key); it != memo_.end()) return it->second;
  return memo_[key] = choice({{x}, {}});
}

GrammarBuilder::Sym GrammarBuilder::repeat(Sym x, int64_t min, int64_t max) {
  MOET_CHECK(min >= 0 && (max < 0 || max >= min), "grammar: bad repetition bounds {{{},{}}}", min, max);
  MOET_CHECK(min <= 100000 && max <= 100000, "grammar: repetition bounds above 100000 are not supported");
  // The optional tail: T_k = x T_{k+1} | empty, k < max - min (or x* when unbounded).
  Sym tail = max < 0 ? star(x) : choice({{}});
  if (max >= 0) {
    for (int64_t k = 0; k < max - min; ++k) tail = choice({{x, tail}, {}});
  }
  Seq seq(size_t(min), x);
  seq.push_back(tail);
  return choice({std::move(seq)});
}

GrammarBuilder::Sym GrammarBuilder::text_until(std::string_view marker) {
  // One rule per matched prefix length of `marker` (a KMP automaton); the full match ends it.
  const size_t m = marker.size();
  MOET_CHECK(m > 0, "grammar: text_until needs a marker");
  std::vector<size_t> fail(m + 1, 0);
  for (size_t i = 1, k = 0; i < m; ++i) {
    while (k > 0 && marker[i] != marker[k]) k = fail[k];
    if (marker[i] == marker[k]) ++k;
    fail[i + 1] = k;
  }
  std::vector<uint32_t> state(m);
  for (size_t i = 0; i < m; ++i) state[i] = new_rule();
  for (size_t i = 0; i < m; ++i) {
    // Group the bytes by the state they lead to.
    std::map<size_t, ByteSet> by_target;
    for (int c = 0; c < 256; ++c) {
      size_t k = i;
      while (k > 0 && uint8_t(marker[k]) != c) k = fail[k];
      if (uint8_t(marker[k]) == c) ++k;
      byteset_add(by_target[k], uint8_t(c));
    }
    for (const auto& [target, bytes] : by_target) {
      if (target == m) add(state[i], {set(bytes)});
      else add(state[i], {set(bytes), ref(state[target])});
    }
  }
  return ref(state[0]);
}

Grammar GrammarBuilder::build(Sym root) {
  const uint32_t r = new_rule();
  add(r, {root});
  grammar_.root = r;
  return std::move(grammar_);
}

}  // namespace moet::server
