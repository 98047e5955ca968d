// The KV block pool: hands out physical block ids of the paged KV cache and takes them back.
// A sequence's block table is the list of ids it holds; slot = block * block_size + offset.
// Invariant: every id is either free (in the free queue) or held by exactly one owner.
#pragma once

#include <cstdint>
#include <deque>
#include <vector>

namespace moet {

class KvBlockPool {
 public:
  KvBlockPool(int64_t blocks, int64_t block_size);

  int64_t block_size() const { return block_size_; }
  int64_t total() const { return total_; }
  int64_t free_count() const { return int64_t(free_.size()); }
  // Blocks needed to hold `tokens` tokens.
  int64_t blocks_for(int64_t tokens) const { return (tokens + block_size_ - 1) / block_size_; }

  // Grows `table` until it covers `tokens` tokens; false (table unchanged) if the pool is short.
  bool ensure(std::vector<int32_t>& table, int64_t tokens);
  // Returns every block of `table` to the pool and clears it.
  void release(std::vector<int32_t>& table);

 private:
  int64_t total_;
  int64_t block_size_;
  std::deque<int32_t> free_;
};

}  // namespace moet
