// The KV memory of a model: one cache per layer, allocated from what each layer declares it keeps
// per token (a KvLayerSpec), over a pool of `blocks` blocks of `block_size` token slots that the
// block pool (block_pool.h) hands out to sequences. An architecture's attention block says what
// its layer caches (heads and dims, and an FP8 checkpoint's per-tensor k_scale / v_scale); the
// cache dtype (--kv-cache-dtype) is applied to the model's specs once after load
// (kv_layer_spec_with_dtype), before any cache exists. A new cache dtype or a linear-attention
// state is a new spec, not a new path through the model. kv_bytes_per_token() counts the bytes a
// token's slots really take (codes, scales and padding: core/paged_kv.h), which is what the
// engine sizes its pool by.
#pragma once

#include "backend/backend.h"
#include "core/paged_kv.h"

#include <cstdint>
#include <memory>
#include <span>
#include <string_view>
#include <vector>

namespace moet {

enum class KvKind {
  paged,            // separate K and V rows per token: heads x k_dim and heads x v_dim (GQA)
  latent,           // one row per token whose first v_dim values are also V (MLA's latent + rope key)
  recurrent_state,  // a fixed-size state per sequence (linear attention); declared, not allocatable yet
};

struct KvLayerSpec {
  KvKind kind = KvKind::paged;
  KvDtype dtype = KvDtype::f32;
  int64_t heads = 0;      // KV heads (1 for latent)
  int64_t k_dim = 0;      // per head
  int64_t v_dim = 0;      // per head (latent: the prefix of K that is V)
  int64_t row_bytes = 0;  // bytes one token occupies in this layer
  float k_scale = 0.0f;   // a checkpoint's per-tensor fp8 scales (0: none; fp8 then scales per
  float v_scale = 0.0f;   // token and head)

  // GQA: `heads` heads of `dim` for K and again for V.
  static KvLayerSpec paged_heads(int64_t heads, int64_t dim, KvDtype dtype = KvDtype::f32);
  // MLA: one row of `row` values per token, the first `value_dim` of which are V.
  static KvLayerSpec latent_row(int64_t row, int64_t value_dim, KvDtype dtype = KvDtype::f32);
  // What a backend allocates for this layer.
  KvLayout layout() const;
};

// --kv-cache-dtype names: auto (= bf16), fp32, bf16, fp8 (= fp8_e4m3), fp8_e4m3, fp8_e5m2, nvfp4.
KvDtype kv_dtype_parse(std::string_view name);
std::string_view kv_dtype_name(KvDtype dtype);
// `spec` stored as `dtype` (row_bytes recomputed). Fails with a one-line error naming
// --kv-cache-dtype for a combination no backend can hold: nvfp4 is for MLA latent caches whose
// value part is a multiple of 16 (GQA heads have no nvfp4 variant).
KvLayerSpec kv_layer_spec_with_dtype(const KvLayerSpec& spec, KvDtype dtype);

struct KvCache {
  int64_t blocks = 0;
  int64_t block_size = 0;
  std::vector<KvLayerCache> layers;
  // A model split over ranks (models/parallel_model.h): the caches of ranks 1, 2, ... (the same
  // specs, blocks and slots, each in its rank's backend); `layers` is rank 0's.
  std::vector<KvCache> ranks;
  // Split over nodes (models/remote_nodes.h): the id the other nodes know this cache by (releasing
  // the last copy tells them to release theirs).
  std::shared_ptr<const int64_t> remote;
};

// Allocates one cache per spec in the backend's memory (zeroed). Fails with a clear error for a
// spec the backends cannot hold yet (recurrent state).
KvCache kv_cache_create(Backend& backend, std::span<const KvLayerSpec> specs, int64_t blocks, int64_t block_size);
// Bytes one token occupies over all layers.
int64_t kv_bytes_per_token(std::span<const KvLayerSpec> specs);

}  // namespace moet
