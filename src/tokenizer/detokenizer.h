// IncrementalDetokenizer: streaming decode for the engine. Ids are pushed one at a time; each push
// returns the new text (possibly empty). Invariant: the concatenation of all deltas plus finish()
// equals tokenizer.decode(all pushed ids, skip_special_tokens), and no delta ends inside a UTF-8
// character. Method (vLLM/HF DecodeStream): decode a short window [prefix, end) and emit what
// extends decode([prefix, read)); text that ends in U+FFFD (an unfinished character) or whose last
// token is a byte-fallback <0xNN> token (which a later byte may turn invalid) is held back. The
// window only ever starts after a token whose text was final, so windows agree with the full decode.
#pragma once

#include "tokenizer/tokenizer.h"

#include <cstdint>
#include <string>
#include <vector>

namespace moet {

class IncrementalDetokenizer {
 public:
  explicit IncrementalDetokenizer(Tokenizer tokenizer, bool skip_special_tokens = false);
  std::string push(int32_t id);
  // Emits whatever is still held back (e.g. a trailing incomplete character as U+FFFD).
  std::string finish();
  const std::vector<int32_t>& ids() const { return ids_; }

 private:
  std::string emit(bool final);

  Tokenizer tokenizer_;
  bool skip_special_tokens_;
  std::vector<int32_t> ids_;  // pushed ids, skipped special tokens left out
  size_t prefix_ = 0, read_ = 0;
};

}  // namespace moet
