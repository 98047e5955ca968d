// The KV block pool: hands out physical block ids of the paged KV cache, shares full blocks between
// sequences with the same prompt prefix, and takes blocks back. A sequence's block table is the
// list of ids it holds; slot = block * block_size + offset.
//
// Prefix caching (vLLM v1 style): a *full* block is identified by the hash chain
// h_i = hash(h_{i-1}, tokens of block i); commit() records the hashes of a table's full blocks, and
// match_prefix() returns the cached blocks of the longest matching chain (the tokens are compared
// too, so a hash collision can never alias two different prefixes).
//
// Invariants: every block has a refcount (number of tables holding it). A block with refcount 0 is
// in the free queue; if it still carries a hash it is a *cached free* block: reusable by a prefix
// hit (taken out of the queue) or evictable by an allocation (hash dropped). Allocation pops from
// the queue head, release() appends at the tail (a table's blocks in reverse order, so a sequence's
// tail is evicted before its head): the least recently freed cached block is evicted first (LRU).
#pragma once

#include <cstddef>
#include <cstdint>
#include <unordered_map>
#include <vector>

namespace moet {

struct KvPoolStats {
  int64_t total = 0;
  int64_t used = 0;            // refcount > 0
  int64_t cached_free = 0;     // refcount 0 but still holding a prefix hash
  int64_t prefix_queries = 0;  // prompt tokens looked up
  int64_t prefix_hits = 0;     // of those, tokens found in the cache
};

class KvBlockPool {
 public:
  KvBlockPool(int64_t blocks, int64_t block_size, bool enable_prefix_caching = false);

  int64_t block_size() const { return block_size_; }
  int64_t total() const { return int64_t(blocks_.size()); }
  // Blocks an allocation can take (free, including cached free ones).
  int64_t free_count() const { return free_count_; }
  bool prefix_caching() const { return prefix_caching_; }
  // Blocks needed to hold `tokens` tokens.
  int64_t blocks_for(int64_t tokens) const { return (tokens + block_size_ - 1) / block_size_; }

  // The cached blocks holding the longest prefix of `tokens` made of full blocks, each with its
  // refcount raised (the caller owns them like allocated ones).
  std::vector<int32_t> match_prefix(const std::vector<int32_t>& tokens);
  // Adds one admitted lookup to the hit statistics (`queried` prompt tokens, `hit` found cached).
  void note_prefix_lookup(int64_t queried, int64_t hit) {
    prefix_queries_ += queried;
    prefix_hits_ += hit;
  }
  // Grows `table` until it covers `tokens` tokens; false (table unchanged) if the pool is short.
  bool ensure(std::vector<int32_t>& table, int64_t tokens);
  // Records the prefix hashes of the full blocks of `table` among the first `computed` tokens.
  void commit(const std::vector<int32_t>& table, const std::vector<int32_t>& tokens, int64_t computed);
  // Drops one reference to every block of `table` and clears it.
  void release(std::vector<int32_t>& table);

  int32_t refcount(int32_t block) const { return blocks_[size_t(block)].refs; }
  KvPoolStats stats() const;

 private:
  struct Block {
    int32_t refs = 0;
    int32_t prev = -1, next = -1;  // free-queue links
    bool in_queue = false;
    bool hashed = false;
    uint64_t hash = 0;
    uint64_t parent = 0;          // hash of the previous block (0 for the first)
    std::vector<int32_t> tokens;  // the block's tokens, checked on lookup
  };

  void queue_push_back(int32_t id);
  void queue_remove(int32_t id);
  int32_t take_free();
  void drop_hash(int32_t id);
  int32_t lookup(uint64_t hash, uint64_t parent, const int32_t* tokens) const;

  int64_t block_size_;
  bool prefix_caching_;
  std::vector<Block> blocks_;
  int32_t head_ = -1, tail_ = -1;
  int64_t free_count_ = 0;
  std::unordered_multimap<uint64_t, int32_t> by_hash_;
  int64_t prefix_queries_ = 0, prefix_hits_ = 0;
};

// h = hash(parent, tokens[0..n)): the prefix-cache hash chain step (FNV-1a over 32-bit ids).
uint64_t kv_block_hash(uint64_t parent, const int32_t* tokens, int64_t n);

}  // namespace moet
