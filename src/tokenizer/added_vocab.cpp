// Added-token matching (see added_vocab.h).
#include "tokenizer/added_vocab.h"

#include "tokenizer/unicode.h"

#include <utf8proc.h>

namespace moet::tok {

namespace {

bool is_word_char(char32_t c) {
  if (c == '_') return true;
  const auto cat = utf8proc_category(utf8proc_int32_t(c));
  return (cat >= UTF8PROC_CATEGORY_LU && cat <= UTF8PROC_CATEGORY_LO) ||
         (cat >= UTF8PROC_CATEGORY_ND && cat <= UTF8PROC_CATEGORY_NO);
}

bool is_space(char32_t c) {
  return c == ' ' || (c >= 0x09 && c <= 0x0D) || utf8proc_category(utf8proc_int32_t(c)) == UTF8PROC_CATEGORY_ZS ||
         c == 0x85 || c == 0x2028 || c == 0x2029;
}

// Code point ending at byte offset end (which must be a character boundary).
char32_t char_before(std::string_view s, size_t end) {
  size_t begin = end - 1;
  while (begin > 0 && (uint8_t(s[begin]) & 0xC0) == 0x80) --begin;
  return utf8_next(s, begin);
}

}  // namespace

AddedTokenMatcher::AddedTokenMatcher(std::vector<AddedToken> tokens, std::vector<std::string> patterns)
    : tokens_(std::move(tokens)) {
  terminal_.push_back(-1);
  for (size_t t = 0; t < tokens_.size(); ++t) {
    const std::string& pattern = patterns[t];
    if (pattern.empty()) continue;
    first_byte_[uint8_t(pattern[0])] = true;
    int32_t node = 0;
    for (char c : pattern) {
      const uint64_t key = (uint64_t(node) << 8) | uint8_t(c);
      auto it = edges_.find(key);
      if (it == edges_.end()) {
        it = edges_.emplace(key, int32_t(terminal_.size())).first;
        terminal_.push_back(-1);
      }
      node = it->second;
    }
    if (terminal_[node] < 0) terminal_[node] = int32_t(t);
  }
}

std::pair<int32_t, size_t> AddedTokenMatcher::longest_at(std::string_view text, size_t pos) const {
  std::pair<int32_t, size_t> best{-1, 0};
  int32_t node = 0;
  for (size_t i = pos; i < text.size(); ++i) {
    const auto it = edges_.find((uint64_t(node) << 8) | uint8_t(text[i]));
    if (it == edges_.end()) break;
    node = it->second;
    if (terminal_[node] >= 0) best = {terminal_[node], i + 1 - pos};
  }
  return best;
}

void AddedTokenMatcher::split(std::string_view text,
                              const std::function<void(std::string_view, int32_t)>& on_segment) const {
  size_t emitted = 0;  // text before this offset has been handed out
  size_t pos = 0;
  while (pos < text.size()) {
    if (!first_byte_[uint8_t(text[pos])]) {
      ++pos;
      continue;
    }
    const auto [index, length] = longest_at(text, pos);
    if (index < 0) {
      ++pos;
      continue;
    }
    const AddedToken& token = tokens_[index];
    size_t start = pos, stop = pos + length;
    pos = stop;
    if (token.single_word) {
      const bool start_ok = start == 0 || !is_word_char(char_before(text, start));
      size_t after = stop;
      const bool stop_ok = stop == text.size() || !is_word_char(utf8_next(text, after));
      if (!start_ok || !stop_ok) continue;
    }
    if (token.lstrip)
      while (start > emitted && is_space(char_before(text, start))) {
        size_t b = start - 1;
        while (b > 0 && (uint8_t(text[b]) & 0xC0) == 0x80) --b;
        start = b;
      }
    if (token.rstrip)
      while (stop < text.size()) {
        size_t next = stop;
        if (!is_space(utf8_next(text, next))) break;
        stop = next;
      }
    if (start > emitted) on_segment(text.substr(emitted, start - emitted), -1);
    on_segment(text.substr(start, stop - start), token.id);
    emitted = stop;
    pos = std::max(pos, stop);
  }
  if (emitted < text.size()) on_segment(text.substr(emitted), -1);
}

}  // namespace moet::tok
