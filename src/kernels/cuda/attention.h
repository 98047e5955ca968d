// Paged causal attention on the GPU, for decode rows and every row the tensor-core prefill
// kernel does not take, GQA and MLA (V aliasing K: the latent cache), with the semantics of
// kernels/cpu/attention.h: query row t, head h sees keys 0..positions[t] of its sequence through
// the block table. Which kernel serves what: runs of two or more consecutive positions of one
// sequence in eager steps, GQA with separate K and V caches and head dims 64 / 128 or MLA's
// latent cache (576 / 512), go to prefill_attention.h (tensor cores); the other rows (decode rows,
// captured steps) to a split-K kernel where one takes the cache (splitk_attention.h,
// splitk_mla_attention.cu: BF16 / FP8 / NVFP4), else to attention_launch here, possibly in the
// same op as prefill rows (AttentionArgs::row_ids). The kernels give a row different last bits.
//
// Flash-decoding style, with nothing sized by a host-side key count (so a captured CUDA graph
// stays valid as contexts grow): each row reads its key count from positions[t] on the device.
// A block serves up to 4 query heads that share a KV head (GQA packing: K/V are read once for
// them) and stages keys through shared memory (cp.async, two buffers: the next leaf loads while
// this one is computed). Keys are cut into leaves of L keys (16..64, fixed by the head dims) and
// segments of kAttentionSegment keys. A leaf gives a partial (max m, sum l, unnormalised output
// o); a segment's leaves are folded in order, then the segments in order (fold: M = max, L and O
// rescaled and added, explicitly rounded). That tree is the same whichever way a step runs:
// fused (a block per (row, head group) evaluates all of it; also rows of up to two leaves),
// split by leaf (short contexts: a block per leaf) or split by segment (a block per segment);
// split blocks write partials and the last one of a row (an atomic counter) folds them. So a
// row's bits depend neither on the mode nor on the other rows of the step; reductions use fixed
// trees: bit-identical run to run.
// The cache may be of any KvDtype (core/paged_kv.h): an F32 cache's rows are staged with cp.async,
// the others' are decoded into the same FP32 staging rows with the reference codec
// (formats/kv_codec.h), so the rest of the kernel is the same for every dtype.
// Also the KV write of a step's rows, encoding them in the cache's dtype (the bytes of the CPU's
// kv_cache_write: the same per-unit encoder, one thread per unit).
#pragma once

#include "core/paged_kv.h"

#include <cuda_runtime_api.h>

#include <cstdint>

namespace moet::cuda {

constexpr int64_t kAttentionSegment = 256;         // keys per segment (a multiple of every leaf)
constexpr int64_t kAttentionMaxKDim = 1024;        // floats of a query/key head (MLA: 576)
constexpr int64_t kAttentionMaxVDim = 512;         // floats of a value head (MLA latent: 512)
constexpr int64_t kAttentionMaxSplitUnits = 256;   // (row, head group) pairs a split step may have

// The cache as kernels see it: core/paged_kv.h's view (byte slots of any KvDtype).
using PagedKvArgs = PagedKv;

struct AttentionArgs {
  PagedKvArgs cache;
  const int32_t* positions;     // [step rows]
  const int32_t* row_seq;       // [step rows]
  const int32_t* block_tables;  // [sequences, table_stride]
  int64_t table_stride;
  const float* q;               // [step rows, q_heads, q_stride]
  int64_t rows, q_heads, q_stride;  // rows: those this launch serves
  float scale;
  float* out;                   // [step rows, q_heads, v_dim]
  int64_t max_keys;             // keys a row can have at most (table_stride * block_size)
  float* partials;              // attention_partial_floats(*this) floats (split steps)
  int32_t* counters;            // kAttentionMaxSplitUnits zeros; the kernel leaves them zero
  const int32_t* row_ids = nullptr;  // [rows]: the step rows served (positions, q, out); null: 0..rows-1
};

// Scratch floats the launch needs in `partials`: 0 when the step runs fused. Depends only on the
// shapes and max_keys (not on device values).
int64_t attention_partial_floats(const AttentionArgs& a);
void attention_launch(const AttentionArgs& a, cudaStream_t stream);

// cache slot slots[t] <- row t of k (and of v when v is not null), encoded in the cache's dtype;
// rows of kv_heads * dim floats.
void kv_write_launch(const PagedKvArgs& cache, const float* k, const float* v, const int64_t* slots,
                     int64_t rows, cudaStream_t stream);

}  // namespace moet::cuda
