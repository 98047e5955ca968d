// Token masks for structured output: which tokens of the vocabulary may come next under a
// Grammar (grammar.h). TokenVocabulary holds every token's bytes (Tokenizer::token_bytes) in a
// trie, built once per server; special tokens never match text (with skip_special_tokens they
// add none) and are allowed only as end tokens (eos) once the grammar is complete.
// CompiledGrammar turns the grammar into a deterministic automaton lazily: a state is a canonical
// set of matcher stacks, interned, with a 256-entry transition table filled on first use, so
// walking bytes is a table lookup. A state's mask comes from one walk of the trie (a subtree is
// skipped as soon as its prefix is dead) and is kept: generation inside a JSON string, a number or
// between values revisits the same few states, so after the first tokens nearly every mask is a
// lookup. A CompiledGrammar is shared by every request with the same constraint (it is cached per
// schema, structured_output.h) and is thread-safe (one mutex; the sampler threads of a step may
// use it at once). Its memory is bounded (kMaxStateBytes, kMaxMaskBytes).
#pragma once

#include "engine/sampler.h"
#include "server/grammar.h"
#include "tokenizer/tokenizer.h"

#include <atomic>
#include <functional>
#include <list>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

namespace moet::server {

class TokenVocabulary {
 public:
  // vocab: the logit row width (the model's vocab_size, which may exceed the tokenizer's);
  // end_ids: the tokens that end a complete sentence (eos).
  TokenVocabulary(const Tokenizer& tokenizer, int64_t vocab, std::vector<int32_t> end_ids);
  // For tests: explicit token bytes (empty = never allowed).
  TokenVocabulary(std::vector<std::string> token_bytes, std::vector<int32_t> end_ids);

  int64_t size() const { return int64_t(bytes_.size()); }
  const std::string& bytes(int32_t id) const { return bytes_[size_t(id)]; }
  const std::vector<int32_t>& end_ids() const { return end_ids_; }

  struct Node {
    uint8_t byte;
    uint16_t depth;         // 1 for a first byte
    uint32_t subtree_end;   // index of the next node outside this subtree
    uint32_t tokens_begin;  // into node_tokens(): the tokens whose bytes end here
    uint32_t tokens_end;
  };
  const std::vector<Node>& nodes() const { return nodes_; }  // preorder
  const std::vector<int32_t>& node_tokens() const { return node_tokens_; }
  size_t max_depth() const { return max_depth_; }

 private:
  void build_trie();

  std::vector<std::string> bytes_;
  std::vector<int32_t> end_ids_;
  std::vector<Node> nodes_;
  std::vector<int32_t> node_tokens_;
  size_t max_depth_ = 0;
};

class CompiledGrammar : public TokenConstraint, public std::enable_shared_from_this<CompiledGrammar> {
 public:
  // Throws moet::Error when the grammar matches nothing.
  static constexpr int32_t kDead = -1;
  // Memory bounds of one grammar's automaton: states (their stacks and transition tables) may
  // take kMaxStateBytes (beyond, the request that needs a new state is ended; see
  // GrammarMatcher), masks are kept while they take less than kMaxMaskBytes.
  static constexpr size_t kMaxStateBytes = size_t(32) << 20;
  static constexpr size_t kMaxMaskBytes = size_t(16) << 20;

  CompiledGrammar(Grammar grammar, std::shared_ptr<const TokenVocabulary> vocab);
  std::unique_ptr<TokenMatcher> start() const override;

  int32_t initial() const { return 0; }
  // The state after `token` (kDead when not allowed; an end token keeps the state).
  int32_t advance(int32_t state, int32_t token) const;
  int32_t advance_bytes(int32_t state, std::string_view bytes) const;
  bool complete(int32_t state) const;
  // Fills `words` (vocab_words() words) with the state's allowed tokens.
  void mask(int32_t state, uint64_t* words) const;
  size_t vocab_words() const { return size_t((vocab_->size() + 63) / 64); }
  const TokenVocabulary& vocabulary() const { return *vocab_; }
  size_t states() const;
  // The state budget ran out (a request wandered far); the cache then compiles a fresh one, so
  // one such request does not end the others that use the same schema.
  bool exhausted() const { return exhausted_.load(); }

 private:
  struct State {
    const std::string* key;     // in ids_: the flattened stacks (size, positions, size, ...) as bytes
    std::vector<int32_t> next;  // per byte: a state, kDead, or kUnknown
    bool complete = false;
    std::vector<uint64_t> mask;  // empty until computed (and kept)
  };
  static constexpr int32_t kUnknown = -2;

  // The automaton is a cache: built as it is used, under mutex_, by const methods.
  int32_t intern(const GrammarStacks& stacks) const;
  int32_t step(int32_t state, uint8_t byte) const;
  void compute_mask(int32_t state, uint64_t* words) const;

  const Grammar grammar_;
  const std::shared_ptr<const TokenVocabulary> vocab_;
  mutable std::mutex mutex_;
  mutable std::vector<std::unique_ptr<State>> states_;
  mutable std::unordered_map<std::string, int32_t> ids_;
  mutable size_t state_bytes_ = 0, mask_bytes_ = 0;
  mutable std::atomic<bool> exhausted_{false};
};

// Compiled grammars by source text (schema, pattern, ...), least recently used dropped beyond
// the capacity; the vocabulary they share is built on the first miss.
class GrammarCache {
 public:
  GrammarCache() = default;
  explicit GrammarCache(size_t capacity) : capacity_(capacity) {}
  static constexpr size_t kDefaultCapacity = 32;  // at most 32 x 48 MiB of automata
  // The compiled grammar for key; on a miss `make` builds its Grammar (throwing ApiError as it
  // sees fit) and the least recently used entry beyond the capacity is dropped.
  std::shared_ptr<const CompiledGrammar> get(const std::string& key, const std::function<Grammar()>& make,
                                             const Tokenizer& tokenizer, const std::vector<int32_t>& eos_ids);
  int64_t hits() const;
  int64_t misses() const;

 private:
  size_t capacity_ = kDefaultCapacity;
  mutable std::mutex mutex_;
  std::shared_ptr<const TokenVocabulary> vocab_;  // built on the first structured request
  std::list<std::pair<std::string, std::shared_ptr<const CompiledGrammar>>> lru_;
  std::unordered_map<std::string, decltype(lru_)::iterator> index_;
  int64_t hits_ = 0, misses_ = 0;
};

}  // namespace moet::server
