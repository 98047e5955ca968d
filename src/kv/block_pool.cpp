// KvBlockPool implementation (see block_pool.h).
#include "kv/block_pool.h"

#include "core/error.h"

namespace moet {

KvBlockPool::KvBlockPool(int64_t blocks, int64_t block_size) : total_(blocks), block_size_(block_size) {
  MOET_CHECK(blocks > 0 && block_size > 0, "KV pool needs positive blocks ({}) and block size ({})", blocks, block_size);
  for (int64_t i = 0; i < blocks; ++i) free_.push_back(int32_t(i));
}

bool KvBlockPool::ensure(std::vector<int32_t>& table, int64_t tokens) {
  const int64_t needed = blocks_for(tokens) - int64_t(table.size());
  if (needed <= 0) return true;
  if (needed > free_count()) return false;
  for (int64_t i = 0; i < needed; ++i) {
    table.push_back(free_.front());
    free_.pop_front();
  }
  return true;
}

void KvBlockPool::release(std::vector<int32_t>& table) {
  for (int32_t id : table) free_.push_back(id);
  table.clear();
}

}  // namespace moet
