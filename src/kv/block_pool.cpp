// KvBlockPool implementation (see block_pool.h). The free queue is an intrusive doubly linked list
// over the block array, so taking a cached block out of the middle on a prefix hit is O(1).
#include "kv/block_pool.h"

#include "core/error.h"

#include <algorithm>

namespace moet {

uint64_t kv_block_hash(uint64_t parent, const int32_t* tokens, int64_t n) {
  uint64_t h = 1469598103934665603ull ^ (parent * 0x9E3779B97F4A7C15ull);
  for (int64_t i = 0; i < n; ++i) {
    uint32_t v = uint32_t(tokens[i]);
    for (int b = 0; b < 4; ++b, v >>= 8) h = (h ^ (v & 0xFF)) * 1099511628211ull;
  }
  return h == 0 ? 1 : h;  // 0 means "no parent"
}

KvBlockPool::KvBlockPool(int64_t blocks, int64_t block_size, bool enable_prefix_caching)
    : block_size_(block_size), prefix_caching_(enable_prefix_caching) {
  MOET_CHECK(blocks > 0 && block_size > 0, "KV pool needs positive blocks ({}) and block size ({})", blocks, block_size);
  MOET_CHECK(blocks < INT32_MAX, "KV pool of {} blocks is too large", blocks);
  blocks_.resize(size_t(blocks));
  for (int32_t i = 0; i < int32_t(blocks); ++i) queue_push_back(i);
}

void KvBlockPool::queue_push_back(int32_t id) {
  Block& b = blocks_[size_t(id)];
  b.prev = tail_;
  b.next = -1;
  b.in_queue = true;
  if (tail_ >= 0) blocks_[size_t(tail_)].next = id; else head_ = id;
  tail_ = id;
  ++free_count_;
}

void KvBlockPool::queue_remove(int32_t id) {
  Block& b = blocks_[size_t(id)];
  if (b.prev >= 0) blocks_[size_t(b.prev)].next = b.next; else head_ = b.next;
  if (b.next >= 0) blocks_[size_t(b.next)].prev = b.prev; else tail_ = b.prev;
  b.prev = b.next = -1;
  b.in_queue = false;
  --free_count_;
}

void KvBlockPool::drop_hash(int32_t id) {
  Block& b = blocks_[size_t(id)];
  if (!b.hashed) return;
  auto [first, last] = by_hash_.equal_range(b.hash);
  for (auto it = first; it != last; ++it) {
    if (it->second == id) {
      by_hash_.erase(it);
      break;
    }
  }
  b.hashed = false;
  b.tokens.clear();
}

int32_t KvBlockPool::take_free() {
  const int32_t id = head_;
  queue_remove(id);
  drop_hash(id);  // evicts a cached free block (the least recently freed one)
  blocks_[size_t(id)].refs = 1;
  return id;
}

int32_t KvBlockPool::lookup(uint64_t hash, uint64_t parent, const int32_t* tokens) const {
  auto [first, last] = by_hash_.equal_range(hash);
  for (auto it = first; it != last; ++it) {
    const Block& b = blocks_[size_t(it->second)];
    if (b.parent == parent && std::equal(b.tokens.begin(), b.tokens.end(), tokens)) return it->second;
  }
  return -1;
}

std::vector<int32_t> KvBlockPool::match_prefix(const std::vector<int32_t>& tokens) {
  std::vector<int32_t> hit;
  if (!prefix_caching_) return hit;
  uint64_t parent = 0;
  for (int64_t begin = 0; begin + block_size_ <= int64_t(tokens.size()); begin += block_size_) {
    const int32_t* block_tokens = tokens.data() + begin;
    const uint64_t hash = kv_block_hash(parent, block_tokens, block_size_);
    const int32_t id = lookup(hash, parent, block_tokens);
    if (id < 0) break;
    Block& b = blocks_[size_t(id)];
    if (b.in_queue) queue_remove(id);
    ++b.refs;
    hit.push_back(id);
    parent = hash;
  }
  return hit;
}

bool KvBlockPool::ensure(std::vector<int32_t>& table, int64_t tokens) {
  const int64_t needed = blocks_for(tokens) - int64_t(table.size());
  if (needed <= 0) return true;
  if (needed > free_count_) return false;
  for (int64_t i = 0; i < needed; ++i) table.push_back(take_free());
  return true;
}

void KvBlockPool::commit(const std::vector<int32_t>& table, const std::vector<int32_t>& tokens, int64_t computed) {
  if (!prefix_caching_) return;
  const int64_t full = std::min<int64_t>(computed / block_size_, int64_t(table.size()));
  uint64_t parent = 0;
  for (int64_t i = 0; i < full; ++i) {
    Block& b = blocks_[size_t(table[size_t(i)])];
    if (!b.hashed) {
      const int32_t* block_tokens = tokens.data() + i * block_size_;
      b.hash = kv_block_hash(parent, block_tokens, block_size_);
      b.parent = parent;
      b.tokens.assign(block_tokens, block_tokens + block_size_);
      b.hashed = true;
      by_hash_.emplace(b.hash, table[size_t(i)]);
    }
    parent = b.hash;
  }
}

void KvBlockPool::release(std::vector<int32_t>& table) {
  for (auto it = table.rbegin(); it != table.rend(); ++it) {
    Block& b = blocks_[size_t(*it)];
    MOET_CHECK(b.refs > 0, "KV block {} released more often than taken", *it);
    if (--b.refs == 0) {
      if (!prefix_caching_) drop_hash(*it);
      queue_push_back(*it);
    }
  }
  table.clear();
}

KvPoolStats KvBlockPool::stats() const {
  KvPoolStats s;
  s.total = total();
  s.used = total() - free_count_;
  for (const auto& [hash, id] : by_hash_)
    if (blocks_[size_t(id)].refs == 0) ++s.cached_free;
  s.prefix_queries = prefix_queries_;
  s.prefix_hits = prefix_hits_;
  return s;
}

}  // namespace moet
