// BPE model: turns one pre-tokenized piece into ids. The vocabulary is keyed by "model bytes":
// raw bytes for byte-level vocabularies (GPT-2 style tokenizer.json and tiktoken), the UTF-8 token
// text otherwise (SentencePiece style, "▁" and <0xNN> byte-fallback tokens). Merges are applied
// lowest rank first (ties: leftmost) with a priority queue over a linked list of symbols, the same
// order as HF tokenizers' Word::merge_all and tiktoken's byte_pair_merge. Results for pieces up
// to 256 bytes are cached (bounded, mutex-guarded), so a BpeModel is safe to share between threads.
#pragma once

#include <array>
#include <cstdint>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

namespace moet::tok {

struct StringHash {
  using is_transparent = void;
  size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
};
using Vocab = std::unordered_map<std::string, int32_t, StringHash, std::equal_to<>>;

struct BpeOptions {
  bool byte_level = false;     // pieces are raw bytes; every byte has a single-byte token
  bool byte_fallback = false;  // unknown characters become <0xNN> tokens
  bool ignore_merges = false;  // a piece that is a whole vocabulary entry is emitted directly
  bool fuse_unk = false;
  std::optional<int32_t> unk_id;
};

class BpeModel {
 public:
  // merges: pairs in model bytes, in rank order.
  BpeModel(Vocab vocab, const std::vector<std::pair<std::string, std::string>>& merges, BpeOptions options);
  // tiktoken: ranks are ids; a pair merges when its concatenation is a token, at that token's rank.
  static BpeModel from_ranks(Vocab ranks);

  void tokenize(std::string_view piece, std::vector<int32_t>& out) const;

  BpeModel(BpeModel&& other) noexcept;

 private:
  struct MergeTarget {
    int32_t rank;
    int32_t id;
  };
  BpeModel(Vocab vocab, BpeOptions options);
  void index_bytes();
  void initial_symbols(std::string_view piece, std::vector<int32_t>& symbols) const;
  void merge(std::vector<int32_t>& symbols) const;
  const MergeTarget* find_merge(int32_t left, int32_t right) const;

  Vocab vocab_;
  std::unordered_map<uint64_t, MergeTarget> merges_;
  BpeOptions options_;
  std::array<int32_t, 256> byte_ids_{};      // byte-level: id of each single byte
  std::array<int32_t, 256> fallback_ids_{};  // byte_fallback: id of <0xNN>
  mutable std::mutex cache_mutex_;
  mutable std::unordered_map<std::string, std::vector<int32_t>, StringHash, std::equal_to<>> cache_;
};

}  // namespace moet::tok
