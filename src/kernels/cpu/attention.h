// Causal attention over a paged KV cache, for prefill and decode alike: FP32 math over a cache of
// any KvDtype (core/paged_kv.h), whose writes quantize and whose reads dequantize with the
// reference codecs of formats/kv_codec.h. Each query row t belongs to one sequence and sees that
// sequence's keys at positions 0..positions[t]. Query head h reads kv head h / (q_heads / kv_heads).
// Rows are independent; each is computed by one thread with a fixed order (deterministic).
#pragma once

#include "core/paged_kv.h"
#include "core/thread_pool.h"
#include "core/cpu_isa.h"

#include <cstdint>

namespace moet {

// Writes k_src / v_src rows ([rows, kv_heads * dim] floats) into cache slots slot[t] (physical
// slot = block * block_size + offset), encoded in the cache's dtype. v_src may be null when V
// aliases K.
void kv_cache_write(const PagedKv& cache, const float* k_src, const float* v_src, int64_t rows,
                    const int64_t* slots);

// q: [rows, q_heads, q_stride] (first k_dim floats of each head are used);
// out: [rows, q_heads, v_dim].
void attention_paged(const PagedKv& cache, const AttentionRows& rows_info, const float* q,
                     int64_t rows, int64_t q_heads, int64_t q_stride, float scale, float* out,
                     ThreadPool& pool, CpuIsa isa);

}  // namespace moet
