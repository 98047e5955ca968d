// Internal state of moet::Tokenizer, shared by the tokenizer.json loader (tokenizer.cpp) and the
// tiktoken loader (tiktoken.cpp). Built once, then only read.
#pragma once

#include "tokenizer/added_vocab.h"
#include "tokenizer/bpe.h"
#include "tokenizer/decoder.h"
#include "tokenizer/normalizer.h"
#include "tokenizer/pre_tokenizer.h"
#include "tokenizer/tokenizer.h"

#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace moet {

struct Tokenizer::Impl {
  std::unique_ptr<tok::Normalizer> normalizer;
  std::unique_ptr<tok::PreTokenizer> pre_tokenizer;
  std::optional<tok::BpeModel> model;
  std::optional<tok::PostProcessor> post_processor;
  std::unique_ptr<tok::Decoder> decoder;
  std::unique_ptr<tok::AddedTokenMatcher> raw_matcher;         // normalized=false tokens
  std::unique_ptr<tok::AddedTokenMatcher> normalized_matcher;  // normalized=true tokens
  std::vector<std::string> id_to_token;  // HF spelling; empty string for an unused id
  std::vector<uint8_t> special;          // per id: a special added token
  tok::Vocab token_to_id;                // HF spelling -> id, added tokens included
  TokenizerInfo info;

  // Registers the added tokens (vocabulary spelling = content) and builds both matchers.
  void set_added_tokens(std::vector<tok::AddedToken> tokens);
  void set_token(int32_t id, const std::string& spelling);
  // Fills info from tokenizer_config.json (special tokens, add_bos_token).
  void read_config(const nlohmann::ordered_json& config);
};

// tiktoken.model (lines "base64 rank") + tokenizer_config.json -> tokenizer (Kimi-K2 layout).
std::shared_ptr<Tokenizer::Impl> tiktoken_load(const std::string& path, const nlohmann::ordered_json& config);

}  // namespace moet
