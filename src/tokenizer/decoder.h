// Decoders and post-processors of tokenizer.json. A decoder turns the token strings of an id
// sequence (vocabulary spelling, e.g. "Ġhello" or "▁hello" or "<0x0A>") into text through a chain
// of steps (ByteLevel, Metaspace, ByteFallback, Fuse, Strip, Replace, Sequence), each a pure
// function of the whole token list as in HF tokenizers. The post-processor adds the special tokens
// of TemplateProcessing around a single sequence when add_special_tokens is set.
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

namespace moet::tok {

class Decoder {
 public:
  virtual ~Decoder() = default;
  virtual void apply(std::vector<std::string>& tokens) const = 0;
  // True when this decoder (or a step of it) merges "<0xNN>" tokens across token boundaries.
  virtual bool uses_byte_fallback() const { return false; }
};

// nullptr for a JSON null.
std::unique_ptr<Decoder> decoder_from_json(const nlohmann::json& spec);
// The ByteLevel decoder alone (tiktoken vocabularies use it).
std::unique_ptr<Decoder> make_byte_level_decoder();

// Parses "<0xNN>" (exactly six characters); -1 otherwise.
int byte_fallback_value(const std::string& token);

class PostProcessor {
 public:
  // spec: the post_processor JSON (null for none).
  explicit PostProcessor(const nlohmann::json& spec);
  void apply(std::vector<int32_t>& ids, bool add_special_tokens) const;

 private:
  std::vector<int32_t> prefix_, suffix_;  // special ids around sequence A
};

}  // namespace moet::tok
