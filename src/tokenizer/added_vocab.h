// Added tokens (tokenizer.json "added_tokens", tokenizer_config.json "added_tokens_decoder"):
// strings matched in the input before the model runs, leftmost-longest like HF tokenizers'
// Aho-Corasick matcher, with the single_word / lstrip / rstrip rules. Tokens with normalized=false
// are matched on the raw text, tokens with normalized=true on the normalized text (their pattern
// is the normalized content). Immutable after construction.
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace moet::tok {

struct AddedToken {
  std::string content;
  int32_t id = -1;
  bool special = false;
  bool lstrip = false;
  bool rstrip = false;
  bool normalized = false;
  bool single_word = false;
};

class AddedTokenMatcher {
 public:
  // patterns[i] is the string matched for tokens[i].
  AddedTokenMatcher(std::vector<AddedToken> tokens, std::vector<std::string> patterns);
  // Splits text into segments: on_segment(text, -1) for plain text, (text, id) for a token.
  void split(std::string_view text, const std::function<void(std::string_view, int32_t)>& on_segment) const;
  bool empty() const { return tokens_.empty(); }

 private:
  // Longest pattern starting at text[pos]: index into tokens_ and its length, or {-1, 0}.
  std::pair<int32_t, size_t> longest_at(std::string_view text, size_t pos) const;

  std::vector<AddedToken> tokens_;
  std::unordered_map<uint64_t, int32_t> edges_;  // (node << 8 | byte) -> child node
  std::vector<int32_t> terminal_;                // node -> token index or -1
  std::array<bool, 256> first_byte_{};
};

}  // namespace moet::tok
