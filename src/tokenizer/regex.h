// Regex: a compiled PCRE2 pattern (UTF + UCP, JIT when available) used by the pre-tokenizers and
// normalizers. Patterns come from tokenizer.json (Oniguruma syntax, which PCRE2 accepts for the
// constructs tokenizers use). A Regex is immutable after construction and safe to share between
// threads; each matching call uses its own match data and a thread-local JIT stack.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <string_view>

namespace moet::tok {

class Regex {
 public:
  explicit Regex(const std::string& pattern);
  ~Regex();
  Regex(const Regex&) = delete;
  Regex& operator=(const Regex&) = delete;

  // Calls on_match(begin, end) for every non-overlapping match, left to right. The subject must
  // be valid UTF-8. An empty match advances by one character.
  void for_each_match(std::string_view subject,
                      const std::function<void(size_t, size_t)>& on_match) const;

 private:
  std::string pattern_;
  void* code_ = nullptr;  // pcre2_code_8*
  bool jit_ = false;
};

// Escapes a literal string for use inside a pattern.
std::string regex_escape(std::string_view literal);

}  // namespace moet::tok
