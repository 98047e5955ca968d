// KV cache allocation from layer specs (see kv_cache.h).
#include "kv/kv_cache.h"

#include "core/error.h"

#include <utility>

namespace moet {
namespace {

constexpr std::pair<std::string_view, KvDtype> kKvDtypeNames[] = {
    {"fp32", KvDtype::f32},         {"bf16", KvDtype::bf16},         {"fp8_e4m3", KvDtype::fp8_e4m3},
    {"fp8_e5m2", KvDtype::fp8_e5m2}, {"nvfp4", KvDtype::nvfp4},
};

int64_t row_bytes_of(const KvLayerSpec& spec) {
  const int64_t slot = kv_slot_layout(spec.layout()).bytes;
  return spec.kind == KvKind::latent ? slot : 2 * slot;
}

}  // namespace

KvLayerSpec KvLayerSpec::paged_heads(int64_t heads, int64_t dim, KvDtype dtype) {
  KvLayerSpec spec{KvKind::paged, dtype, heads, dim, dim, 0};
  spec.row_bytes = row_bytes_of(spec);
  return spec;
}

KvLayerSpec KvLayerSpec::latent_row(int64_t row, int64_t value_dim, KvDtype dtype) {
  KvLayerSpec spec{KvKind::latent, dtype, 1, row, value_dim, 0};
  spec.row_bytes = row_bytes_of(spec);
  return spec;
}

KvLayout KvLayerSpec::layout() const {
  return {dtype, heads, k_dim, v_dim, kind == KvKind::latent, k_scale, v_scale};
}

KvDtype kv_dtype_parse(std::string_view name) {
  if (name == "auto") return KvDtype::bf16;
  if (name == "fp8") return KvDtype::fp8_e4m3;
  for (const auto& [text, dtype] : kKvDtypeNames)
    if (name == text) return dtype;
  fail("--kv-cache-dtype: '{}' is not one of auto, fp32, bf16, fp8, fp8_e4m3, fp8_e5m2, nvfp4", name);
}

std::string_view kv_dtype_name(KvDtype dtype) {
  for (const auto& [text, value] : kKvDtypeNames)
    if (value == dtype) return text;
  return "?";
}

KvLayerSpec kv_layer_spec_with_dtype(const KvLayerSpec& spec, KvDtype dtype) {
  if (dtype == KvDtype::nvfp4) {
    MOET_CHECK(spec.kind == KvKind::latent,
               "--kv-cache-dtype nvfp4 packs MLA latent caches (DeepSeek-V3, Kimi-K2); this model's attention keeps "
               "GQA heads, for which there is no nvfp4 KV format: use fp8 or bf16");
    MOET_CHECK(spec.v_dim % kKvNvfp4Block == 0 && spec.k_dim >= spec.v_dim,
               "--kv-cache-dtype nvfp4 needs a latent of a multiple of {} values (this model's is {})", kKvNvfp4Block,
               spec.v_dim);
  }
  KvLayerSpec out = spec;
  out.dtype = dtype;
  out.row_bytes = row_bytes_of(out);
  return out;
}

KvCache kv_cache_create(Backend& backend, std::span<const KvLayerSpec> specs, int64_t blocks, int64_t block_size) {
  MOET_CHECK(blocks > 0 && block_size > 0, "a KV cache needs blocks and a block size ({} blocks of {})", blocks,
             block_size);
  KvCache cache{blocks, block_size, {}};
  cache.layers.reserve(specs.size());
  for (const KvLayerSpec& spec : specs) {
    MOET_CHECK(spec.kind != KvKind::recurrent_state, "recurrent-state KV layers are not supported yet");
    cache.layers.push_back(backend.alloc_kv(blocks, block_size, spec.layout()));
  }
  return cache;
}

int64_t kv_bytes_per_token(std::span<const KvLayerSpec> specs) {
  int64_t bytes = 0;
  for (const KvLayerSpec& spec : specs) bytes += spec.row_bytes;
  return bytes;
}

}  // namespace moet
