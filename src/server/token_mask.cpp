// TokenVocabulary and CompiledGrammar (see token_mask.h).
#include "server/token_mask.h"

#include "core/error.h"
#include "core/log.h"

#include <algorithm>
#include <cstring>

namespace moet::server {

TokenVocabulary::TokenVocabulary(const Tokenizer& tokenizer, int64_t vocab, std::vector<int32_t> end_ids)
    : end_ids_(std::move(end_ids)) {
  bytes_.resize(size_t(std::max<int64_t>(vocab, 0)));
  const int64_t known = std::min<int64_t>(vocab, int64_t(tokenizer.vocab_size()));
  for (int32_t id = 0; id < known; ++id)
    if (!tokenizer.is_special(id)) bytes_[size_t(id)] = tokenizer.token_bytes(id);
  for (int32_t id : end_ids_)
    if (id >= 0 && id < vocab) bytes_[size_t(id)].clear();
  build_trie();
}

TokenVocabulary::TokenVocabulary(std::vector<std::string> token_bytes, std::vector<int32_t> end_ids)
    : bytes_(std::move(token_bytes)), end_ids_(std::move(end_ids)) {
  for (int32_t id : end_ids_)
    if (id >= 0 && size_t(id) < bytes_.size()) bytes_[size_t(id)].clear();
  build_trie();
}

void TokenVocabulary::build_trie() {
  std::vector<int32_t> order;
  for (size_t i = 0; i < bytes_.size(); ++i)
    if (!bytes_[i].empty()) order.push_back(int32_t(i));
  std::sort(order.begin(), order.end(), [&](int32_t a, int32_t b) {
    return bytes_[size_t(a)] != bytes_[size_t(b)] ? bytes_[size_t(a)] < bytes_[size_t(b)] : a < b;
  });
  // Sorted order is the trie's preorder: each token adds the nodes past its common prefix with
  // the previous one.
  std::vector<uint32_t> path;
  const std::string* prev = nullptr;
  for (int32_t id : order) {
    const std::string& b = bytes_[size_t(id)];
    size_t lcp = 0;
    if (prev) {
      while (lcp < prev->size() && lcp < b.size() && (*prev)[lcp] == b[lcp]) ++lcp;
    }
    if (!(prev && lcp == b.size() && lcp == prev->size())) {
      path.resize(lcp);
      for (size_t d = lcp; d < b.size(); ++d) {
        const auto at = uint32_t(node_tokens_.size());
        nodes_.push_back({uint8_t(b[d]), uint16_t(std::min<size_t>(d + 1, UINT16_MAX)), 0, at, at});
        path.push_back(uint32_t(nodes_.size() - 1));
      }
    }
    node_tokens_.push_back(id);
    nodes_[path.back()].tokens_end = uint32_t(node_tokens_.size());
    max_depth_ = std::max(max_depth_, b.size());
    prev = &b;
  }
  MOET_CHECK(max_depth_ < UINT16_MAX, "token mask: a token of {} bytes is too long", max_depth_);
  std::vector<uint32_t> open;
  for (uint32_t i = 0; i < nodes_.size(); ++i) {
    while (!open.empty() && nodes_[open.back()].depth >= nodes_[i].depth) {
      nodes_[open.back()].subtree_end = i;
      open.pop_back();
    }
    open.push_back(i);
  }
  for (uint32_t i : open) nodes_[i].subtree_end = uint32_t(nodes_.size());
}

namespace {

// One request's position in a CompiledGrammar. If the grammar gives up (a limit of grammar.cpp:
// nesting beyond 4096 levels, or an explosion of ambiguity), the request is ended rather than the
// engine: only end tokens are allowed from then on, and the failure is logged.
class GrammarMatcher final : public TokenMatcher {
 public:
  explicit GrammarMatcher(std::shared_ptr<const CompiledGrammar> g) : g_(std::move(g)), state_(g_->initial()) {}

  const uint64_t* allowed(int64_t vocab) override {
    words_.assign(std::max(g_->vocab_words(), size_t((vocab + 63) / 64)), 0);
    if (!failed_) {
      try {
        g_->mask(state_, words_.data());
        return words_.data();
      } catch (const Error& e) {
        MOET_LOG_WARN("structured output: {}; ending the request", e.what());
        failed_ = true;
        std::fill(words_.begin(), words_.end(), 0);
      }
    }
    for (int32_t id : g_->vocabulary().end_ids())
      if (id >= 0 && size_t(id) < words_.size() * 64) words_[size_t(id) >> 6] |= uint64_t(1) << (id & 63);
    return words_.data();
  }

  void accept(int32_t token) override {
    if (failed_) return;
    int32_t next = CompiledGrammar::kDead;
    try {  // the mask's walk already made these transitions, so this only reads them
      next = g_->advance(state_, token);
    } catch (const Error& e) {
      MOET_LOG_WARN("structured output: {}; ending the request", e.what());
    }
    if (next == CompiledGrammar::kDead) failed_ = true;  // only end tokens from now on
    else state_ = next;
  }

 private:
  std::shared_ptr<const CompiledGrammar> g_;
  int32_t state_;
  bool failed_ = false;
  std::vector<uint64_t> words_;
};

GrammarStacks decode_key(const std::string& bytes) {
  std::vector<uint32_t> key(bytes.size() / sizeof(uint32_t));
  std::memcpy(key.data(), bytes.data(), bytes.size());
  GrammarStacks stacks;
  for (size_t i = 0; i < key.size();) {
    const uint32_t n = key[i++];
    stacks.insert(GrammarStack(key.begin() + std::ptrdiff_t(i), key.begin() + std::ptrdiff_t(i + n)));
    i += n;
  }
  return stacks;
}

}  // namespace

CompiledGrammar::CompiledGrammar(Grammar grammar, std::shared_ptr<const TokenVocabulary> vocab)
    : grammar_(std::move(grammar)), vocab_(std::move(vocab)) {
  std::lock_guard lock(mutex_);
  MOET_CHECK(intern(grammar_start(grammar_, grammar_.root)) == 0, "structured output: the grammar matches nothing");
}

std::unique_ptr<TokenMatcher> CompiledGrammar::start() const {
  return std::make_unique<GrammarMatcher>(shared_from_this());
}

int32_t CompiledGrammar::intern(const GrammarStacks& stacks) const {
  if (stacks.empty()) return kDead;
  std::vector<uint32_t> key;
  for (const GrammarStack& s : stacks) {
    key.push_back(uint32_t(s.size()));
    key.insert(key.end(), s.begin(), s.end());
  }
  std::string bytes(reinterpret_cast<const char*>(key.data()), key.size() * sizeof(uint32_t));
  const auto it = ids_.find(bytes);
  if (it != ids_.end()) return it->second;
  const size_t cost = 2 * bytes.size() + 256 * sizeof(int32_t) + sizeof(State) + 64;
  if (state_bytes_ + cost > kMaxStateBytes) exhausted_ = true;
  MOET_CHECK(!exhausted_,
             "the grammar's automaton outgrew its memory budget ({} MiB, {} states)", kMaxStateBytes >> 20,
             states_.size());
  state_bytes_ += cost;
  const auto id = int32_t(states_.size());
  const auto [entry, _] = ids_.emplace(std::move(bytes), id);  // node keys do not move on rehash
  auto state = std::make_unique<State>();
  state->key = &entry->first;
  state->next.assign(256, kUnknown);
  state->complete = grammar_complete(stacks);
  states_.push_back(std::move(state));
  return id;
}

int32_t CompiledGrammar::step(int32_t state, uint8_t byte) const {
  State& s = *states_[size_t(state)];  // States do not move when states_ grows
  if (s.next[byte] != kUnknown) return s.next[byte];
  return s.next[byte] = intern(grammar_advance(grammar_, decode_key(*s.key), byte));
}

int32_t CompiledGrammar::advance_bytes(int32_t state, std::string_view bytes) const {
  std::lock_guard lock(mutex_);
  for (char c : bytes) {
    if (state == kDead) break;
    state = step(state, uint8_t(c));
  }
  return state;
}

int32_t CompiledGrammar::advance(int32_t state, int32_t token) const {
  const auto& ends = vocab_->end_ids();
  if (std::find(ends.begin(), ends.end(), token) != ends.end()) return complete(state) ? state : kDead;
  if (token < 0 || token >= vocab_->size() || vocab_->bytes(token).empty()) return kDead;
  return advance_bytes(state, vocab_->bytes(token));
}

bool CompiledGrammar::complete(int32_t state) const {
  std::lock_guard lock(mutex_);
  return states_[size_t(state)]->complete;
}

size_t CompiledGrammar::states() const {
  std::lock_guard lock(mutex_);
  return states_.size();
}

void CompiledGrammar::compute_mask(int32_t state, uint64_t* words) const {
  std::memset(words, 0, vocab_words() * sizeof(uint64_t));
  const auto& nodes = vocab_->nodes();
  const auto& tokens = vocab_->node_tokens();
  std::vector<int32_t> at(vocab_->max_depth() + 1);
  at[0] = state;
  for (size_t i = 0; i < nodes.size();) {
    const TokenVocabulary::Node& node = nodes[i];
    const int32_t next = step(at[node.depth - 1], node.byte);
    if (next == kDead) {
      i = node.subtree_end;
      continue;
    }
    at[node.depth] = next;
    for (uint32_t t = node.tokens_begin; t < node.tokens_end; ++t)
      words[size_t(tokens[t]) >> 6] |= uint64_t(1) << (tokens[t] & 63);
    ++i;
  }
  if (states_[size_t(state)]->complete) {
    for (int32_t id : vocab_->end_ids())
      if (id >= 0 && id < vocab_->size()) words[size_t(id) >> 6] |= uint64_t(1) << (id & 63);
  }
}

void CompiledGrammar::mask(int32_t state, uint64_t* words) const {
  std::lock_guard lock(mutex_);
  State& s = *states_[size_t(state)];
  if (!s.mask.empty()) {
    std::memcpy(words, s.mask.data(), s.mask.size() * sizeof(uint64_t));
    return;
  }
  compute_mask(state, words);
  if (mask_bytes_ + vocab_words() * sizeof(uint64_t) <= kMaxMaskBytes) {
    s.mask.assign(words, words + vocab_words());
    mask_bytes_ += vocab_words() * sizeof(uint64_t);
  }
}

std::shared_ptr<const CompiledGrammar> GrammarCache::get(const std::string& key, const std::function<Grammar()>& make,
                                                         const Tokenizer& tokenizer,
                                                         const std::vector<int32_t>& eos_ids) {
  {
    std::lock_guard lock(mutex_);
    if (const auto it = index_.find(key); it != index_.end() && !it->second->second->exhausted()) {
      lru_.splice(lru_.begin(), lru_, it->second);
      ++hits_;
      return it->second->second;
    }
    if (!vocab_) vocab_ = std::make_shared<TokenVocabulary>(tokenizer, int64_t(tokenizer.vocab_size()), eos_ids);
  }
  // Built outside the lock (a large schema takes a while); a racing twin is harmless.
  std::shared_ptr<const CompiledGrammar> compiled = std::make_shared<CompiledGrammar>(make(), vocab_);
  std::lock_guard lock(mutex_);
  ++misses_;
  if (const auto it = index_.find(key); it != index_.end()) {
    if (!it->second->second->exhausted()) return it->second->second;
    lru_.erase(it->second);
    index_.erase(it);
  }
  lru_.emplace_front(key, compiled);
  index_[key] = lru_.begin();
  while (lru_.size() > capacity_) {
    index_.erase(lru_.back().first);
    lru_.pop_back();
  }
  return compiled;
}

int64_t GrammarCache::hits() const {
  std::lock_guard lock(mutex_);
  return hits_;
}

int64_t GrammarCache::misses() const {
  std::lock_guard lock(mutex_);
  return misses_;
}

}  // namespace moet::server
