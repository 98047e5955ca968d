// Incremental detokenizer (see detokenizer.h).
#include "tokenizer/detokenizer.h"

#include "tokenizer/unicode.h"

#include <span>

namespace moet {

IncrementalDetokenizer::IncrementalDetokenizer(Tokenizer tokenizer, bool skip_special_tokens)
    : tokenizer_(std::move(tokenizer)), skip_special_tokens_(skip_special_tokens) {}

std::string IncrementalDetokenizer::push(int32_t id) {
  if (skip_special_tokens_ && tokenizer_.is_special(id)) return {};
  ids_.push_back(id);
  if (tokenizer_.is_partial_byte_token(id)) return {};
  return emit(false);
}

std::string IncrementalDetokenizer::finish() { return read_ == ids_.size() ? std::string() : emit(true); }

std::string IncrementalDetokenizer::emit(bool final) {
  const std::span<const int32_t> all(ids_);
  const std::string before = tokenizer_.decode(all.subspan(prefix_, read_ - prefix_), skip_special_tokens_);
  const std::string text = tokenizer_.decode(all.subspan(prefix_), skip_special_tokens_);
  if (!final && (text.size() <= before.size() || tok::utf8_ends_with_replacement(text))) return {};
  prefix_ = read_;
  read_ = ids_.size();
  return text.size() > before.size() ? text.substr(before.size()) : std::string();
}

}  // namespace moet
