// BPE merge loop, symbol initialisation and the word cache (see bpe.h).
#include "tokenizer/bpe.h"

#include "core/error.h"
#include "tokenizer/unicode.h"

#include <fmt/format.h>

#include <algorithm>

namespace moet::tok {

namespace {

constexpr size_t kCacheMaxWordBytes = 256;
constexpr size_t kCacheCapacity = 1 << 16;

uint64_t pair_key(int32_t left, int32_t right) { return (uint64_t(uint32_t(left)) << 32) | uint32_t(right); }

}  // namespace

BpeModel::BpeModel(Vocab vocab, BpeOptions options) : vocab_(std::move(vocab)), options_(options) { index_bytes(); }

BpeModel::BpeModel(Vocab vocab, const std::vector<std::pair<std::string, std::string>>& merges, BpeOptions options)
    : BpeModel(std::move(vocab), options) {
  merges_.reserve(merges.size());
  for (size_t rank = 0; rank < merges.size(); ++rank) {
    const auto& [a, b] = merges[rank];
    const auto ia = vocab_.find(a), ib = vocab_.find(b), iab = vocab_.find(a + b);
    if (ia == vocab_.end() || ib == vocab_.end() || iab == vocab_.end()) continue;
    merges_[pair_key(ia->second, ib->second)] = {int32_t(rank), iab->second};
  }
}

BpeModel BpeModel::from_ranks(Vocab ranks) {
  BpeOptions options;
  options.byte_level = true;
  options.ignore_merges = true;
  BpeModel model(std::move(ranks), options);
  for (const auto& [token, rank] : model.vocab_) {
    const std::string_view t(token);
    for (size_t k = 1; k < t.size(); ++k) {
      const auto left = model.vocab_.find(t.substr(0, k));
      if (left == model.vocab_.end()) continue;
      const auto right = model.vocab_.find(t.substr(k));
      if (right == model.vocab_.end()) continue;
      model.merges_[pair_key(left->second, right->second)] = {rank, rank};
    }
  }
  return model;
}

BpeModel::BpeModel(BpeModel&& other) noexcept
    : vocab_(std::move(other.vocab_)),
      merges_(std::move(other.merges_)),
      options_(other.options_),
      byte_ids_(other.byte_ids_),
      fallback_ids_(other.fallback_ids_) {}

void BpeModel::index_bytes() {
  for (int b = 0; b < 256; ++b) {
    const auto single = vocab_.find(std::string(1, char(b)));
    byte_ids_[b] = single == vocab_.end() ? -1 : single->second;
    const auto fallback = vocab_.find(fmt::format("<0x{:02X}>", b));
    fallback_ids_[b] = fallback == vocab_.end() ? -1 : fallback->second;
  }
}

const BpeModel::MergeTarget* BpeModel::find_merge(int32_t left, int32_t right) const {
  const auto it = merges_.find(pair_key(left, right));
  return it == merges_.end() ? nullptr : &it->second;
}

void BpeModel::initial_symbols(std::string_view piece, std::vector<int32_t>& symbols) const {
  if (options_.byte_level) {
    for (char c : piece) {
      const int32_t id = byte_ids_[uint8_t(c)];
      if (id >= 0) symbols.push_back(id);
      else if (options_.unk_id) symbols.push_back(*options_.unk_id);
    }
    return;
  }
  bool previous_unk = false;
  for (size_t i = 0; i < piece.size();) {
    const size_t begin = i;
    utf8_next(piece, i);
    const std::string_view ch = piece.substr(begin, i - begin);
    if (const auto it = vocab_.find(ch); it != vocab_.end()) {
      symbols.push_back(it->second);
      previous_unk = false;
      continue;
    }
    if (options_.byte_fallback) {
      bool all = true;
      for (char c : ch) all = all && fallback_ids_[uint8_t(c)] >= 0;
      if (all) {
        for (char c : ch) symbols.push_back(fallback_ids_[uint8_t(c)]);
        previous_unk = false;
        continue;
      }
    }
    if (options_.unk_id) {
      if (!(options_.fuse_unk && previous_unk)) symbols.push_back(*options_.unk_id);
      previous_unk = true;
    }
  }
}

// Priority-queue merge over a doubly linked list of symbols; stale queue entries are detected
// by re-checking the pair at pop time (HF tokenizers' Word::merge_all).
void BpeModel::merge(std::vector<int32_t>& symbols) const {
  const int32_t n = int32_t(symbols.size());
  if (n < 2) return;
  struct Entry {
    int32_t rank, pos, id;
    bool operator>(const Entry& o) const { return rank != o.rank ? rank > o.rank : pos > o.pos; }
  };
  thread_local std::vector<int32_t> prev, next;
  thread_local std::vector<char> dead;
  thread_local std::vector<Entry> heap;
  prev.resize(n);
  next.resize(n);
  dead.assign(n, 0);
  heap.clear();
  const auto push = [&](Entry e) {
    heap.push_back(e);
    std::push_heap(heap.begin(), heap.end(), std::greater<>{});
  };
  for (int32_t i = 0; i < n; ++i) {
    prev[i] = i - 1;
    next[i] = i + 1 < n ? i + 1 : -1;
    if (i + 1 < n)
      if (const auto* m = find_merge(symbols[i], symbols[i + 1])) push({m->rank, i, m->id});
  }
  while (!heap.empty()) {
    std::pop_heap(heap.begin(), heap.end(), std::greater<>{});
    const Entry top = heap.back();
    heap.pop_back();
    if (dead[top.pos] || next[top.pos] < 0) continue;
    const int32_t right = next[top.pos];
    const auto* m = find_merge(symbols[top.pos], symbols[right]);
    if (!m || m->rank != top.rank || m->id != top.id) continue;
    symbols[top.pos] = top.id;
    dead[right] = true;
    next[top.pos] = next[right];
    if (next[right] >= 0) prev[next[right]] = top.pos;
    if (prev[top.pos] >= 0)
      if (const auto* pm = find_merge(symbols[prev[top.pos]], top.id)) push({pm->rank, prev[top.pos], pm->id});
    if (next[top.pos] >= 0)
      if (const auto* nm = find_merge(top.id, symbols[next[top.pos]])) push({nm->rank, top.pos, nm->id});
  }
  int32_t out = 0;
  for (int32_t i = 0; i >= 0; i = next[i]) symbols[out++] = symbols[i];
  symbols.resize(out);
}

void BpeModel::tokenize(std::string_view piece, std::vector<int32_t>& out) const {
  if (piece.empty()) return;
  if (options_.ignore_merges)
    if (const auto it = vocab_.find(piece); it != vocab_.end()) {
      out.push_back(it->second);
      return;
    }
  const bool cacheable = piece.size() <= kCacheMaxWordBytes;
  if (cacheable) {
    std::lock_guard lock(cache_mutex_);
    if (const auto it = cache_.find(piece); it != cache_.end()) {
      out.insert(out.end(), it->second.begin(), it->second.end());
      return;
    }
  }
  thread_local std::vector<int32_t> symbols;
  symbols.clear();
  initial_symbols(piece, symbols);
  merge(symbols);
  out.insert(out.end(), symbols.begin(), symbols.end());
  if (cacheable) {
    std::lock_guard lock(cache_mutex_);
    if (cache_.size() < kCacheCapacity) cache_.emplace(std::string(piece), symbols);
  }
}

}  // namespace moet::tok
