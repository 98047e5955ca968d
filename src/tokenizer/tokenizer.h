// moet::Tokenizer: the public tokenizer API the engine and server use. Loads a model folder
// (tokenizer.json or tokenizer.json.gz, or tiktoken.model; plus tokenizer_config.json and
// generation_config.json for special tokens and eos ids) and encodes/decodes exactly like HF
// `tokenizers`: added tokens are split out first, the rest is normalized, pre-tokenized, run
// through BPE and post-processed; decode maps ids to token strings and runs the decoder chain.
// A Tokenizer is immutable and cheap to copy (shared state); all methods are thread-safe.
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace moet {

// Special-token facts from tokenizer_config.json / generation_config.json.
struct TokenizerInfo {
  std::optional<std::string> bos_token, eos_token, pad_token, unk_token;
  std::optional<int32_t> bos_id;
  std::vector<int32_t> eos_ids;  // generation_config eos_token_id, else the eos_token's id
  bool add_bos_token = false;    // tokenizer_config add_bos_token (callers that build prompts use it)
};

class Tokenizer {
 public:
  // dir holds tokenizer.json[.gz] or tiktoken.model, optionally tokenizer_config.json and
  // generation_config.json. Throws moet::Error naming the file at fault.
  static Tokenizer from_dir(const std::string& dir);
  // A tokenizer.json document; config is the (optional) tokenizer_config.json object.
  static Tokenizer from_json(const nlohmann::json& tokenizer_json,
                             const nlohmann::ordered_json& config = nlohmann::ordered_json::object());

  // Invalid UTF-8 in text is first repaired (U+FFFD), as HF only accepts valid strings.
  std::vector<int32_t> encode(std::string_view text, bool add_special_tokens = true) const;
  // Unknown ids are skipped, like HF.
  std::string decode(std::span<const int32_t> ids, bool skip_special_tokens = false) const;

  // The bytes one token adds to a decoded text (after other tokens): a byte-level token's raw
  // bytes even when they are part of a UTF-8 character, a "<0xNN>" token's byte. Empty for an
  // unknown id.
  std::string token_bytes(int32_t id) const;
  size_t vocab_size() const;  // largest id + 1
  std::optional<int32_t> token_to_id(std::string_view token) const;
  std::optional<std::string> id_to_token(int32_t id) const;
  bool is_special(int32_t id) const;
  // True when the decoder merges this token with its neighbours (a "<0xNN>" byte-fallback token):
  // its text is not final until a different token follows.
  bool is_partial_byte_token(int32_t id) const;
  const TokenizerInfo& info() const;

  struct Impl;

 private:
  explicit Tokenizer(std::shared_ptr<const Impl> impl) : impl_(std::move(impl)) {}
  std::shared_ptr<const Impl> impl_;
};

}  // namespace moet
