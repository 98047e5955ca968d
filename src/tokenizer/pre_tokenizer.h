// Pre-tokenizers of tokenizer.json ("pre_tokenizer" field): Split (regex or string, with the five
// delimiter behaviours and invert), ByteLevel, Metaspace, Digits, Whitespace, WhitespaceSplit and
// Sequence. A pre-tokenizer rewrites a list of pieces into a finer list; empty pieces are dropped.
// Byte-level BPE here works on raw bytes, so ByteLevel does no byte->unicode remapping: it only
// adds the prefix space and applies the GPT-2 regex when asked (the vocabulary is stored as bytes).
#pragma once

#include <nlohmann/json.hpp>

#include <memory>
#include <string>
#include <vector>

namespace moet::tok {

struct Piece {
  std::string text;
  bool at_start = false;  // starts at offset 0 of the original input (Metaspace "first")
};

class PreTokenizer {
 public:
  virtual ~PreTokenizer() = default;
  virtual void apply(std::vector<Piece>& pieces) const = 0;
};

// nullptr for a JSON null.
std::unique_ptr<PreTokenizer> pre_tokenizer_from_json(const nlohmann::json& spec);

// True when the spec (or a member of its Sequence) is ByteLevel: the vocabulary is byte-level.
bool pre_tokenizer_is_byte_level(const nlohmann::json& spec);

// The Split pre-tokenizer, public so the tiktoken loader can build one from its pat_str.
std::unique_ptr<PreTokenizer> make_split_pre_tokenizer(const std::string& regex,
                                                       const std::string& behavior, bool invert);

}  // namespace moet::tok
