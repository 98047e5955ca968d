// KV cache allocation from layer specs (see kv_cache.h).
#include "kv/kv_cache.h"

#include "core/error.h"

namespace moet {

KvLayerSpec KvLayerSpec::paged_heads(int64_t heads, int64_t dim, DType dtype) {
  return {KvKind::paged, dtype, heads, dim, dim, 2 * heads * dim * int64_t(dtype_size(dtype))};
}

KvLayerSpec KvLayerSpec::latent_row(int64_t row, int64_t value_dim, DType dtype) {
  return {KvKind::latent, dtype, 1, row, value_dim, row * int64_t(dtype_size(dtype))};
}

KvCache kv_cache_create(Backend& backend, std::span<const KvLayerSpec> specs, int64_t blocks, int64_t block_size) {
  MOET_CHECK(blocks > 0 && block_size > 0, "a KV cache needs blocks and a block size ({} blocks of {})", blocks,
             block_size);
  KvCache cache{blocks, block_size, {}};
  cache.layers.reserve(specs.size());
  for (const KvLayerSpec& spec : specs) {
    MOET_CHECK(spec.kind != KvKind::recurrent_state, "recurrent-state KV layers are not supported yet");
    MOET_CHECK(spec.dtype == DType::f32, "KV cache dtype {} is not supported yet (f32)", dtype_name(spec.dtype));
    cache.layers.push_back(
        backend.alloc_kv(blocks, block_size, spec.heads, spec.k_dim, spec.v_dim, spec.kind == KvKind::latent));
  }
  return cache;
}

int64_t kv_bytes_per_token(std::span<const KvLayerSpec> specs) {
  int64_t bytes = 0;
  for (const KvLayerSpec& spec : specs) bytes += spec.row_bytes;
  return bytes;
}

}  // namespace moet
