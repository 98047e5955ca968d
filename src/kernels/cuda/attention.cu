// Paged attention and KV writes (see attention.h), both launched as programmatic dependent
// launches (launch.cuh) that wait for the previous kernel before touching memory.
//
// A block (8 warps) serves H <= 4 query heads of one KV head and walks its leaves with two
// shared-memory buffers: while leaf i is computed, leaf i + 1's K (and V) rows are in flight
// (cp.async; 8 threads per key row, whose block-table entries were fetched one leaf earlier still).
// A leaf is computed in three phases separated by barriers: scores (T threads per (head, key)
// dot product, float4 over the head dim, a fixed shuffle tree), the softmax of each head over the
// leaf (one warp per head: max, exp, fixed-tree sum), and the output, one float4 of one head per
// thread slot, summed over the leaf's keys in key order and folded into the segment's partial.
// Staged K rows are padded so the score phase's float4 reads hit distinct banks; padding columns
// are zero when a head dim is not a multiple of 4. What a thread does in each phase depends only
// on its index and the plan, so it is worked out once per block (LaneRoles), and key indices
// within a row are 32-bit: no integer division inside the leaf loop.
#include "kernels/cuda/attention.h"

#include "formats/kv_codec.h"
#include "kernels/cuda/arrival_count.cuh"
#include "kernels/cuda/attention_fold.cuh"
#include "kernels/cuda/block_reduce.cuh"
#include "kernels/cuda/cp_async.cuh"
#include "kernels/cuda/launch.cuh"

#include <algorithm>

namespace moet::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kMaxHeads = 4;  // query heads per block
constexpr int kMaxLeaf = 64, kMinLeaf = 4;
constexpr int kCopyLanes = 8;  // threads staging one key row
constexpr int kKeysPerThread = kMaxLeaf * kCopyLanes / kThreads;
constexpr int kMaxSlots = int(kMaxHeads * kAttentionMaxVDim / 4 / kThreads);  // float4 outputs per thread
constexpr size_t kSharedBudget = size_t(96) << 10;  // fits every target (sm_120: 99 KiB per block)
constexpr int64_t kMaxLeafSplits = 32;              // split by leaf while a row has at most this many
// Rows of fewer leaves run in one block per head group: for two leaves the split's partials and
// combine cost more than the second leaf (H200: Qwen3-30B-A3B at contexts of 33-48 keys 2-4%
// faster end to end; from 3 leaves up the split wins, docs/gpu-history.md Run 14).
constexpr int64_t kMinSplitLeaves = 3;
constexpr int64_t kMaxPartialFloats = int64_t(1) << 26;  // split scratch (256 MiB) above this: fused
constexpr int kFoldAhead = 8;                            // partials the combining block loads at once
static_assert(kAttentionSegment % kMaxLeaf == 0, "a segment is whole leaves");

struct AttentionPlan {
  int heads;             // query heads per block (H)
  int leaf;              // keys per leaf (L)
  int dot_threads;       // threads per score dot product (T)
  int k_pitch, v_pitch;  // floats per staged K / V row; v_pitch 0: V is read from the K rows
  int64_t splits;        // blocks per (row, head group) along z; 1: fused
  bool by_leaf;          // split blocks hold one leaf each (else one segment each)
  bool vec;              // 16-byte copies (F32 caches)
};

__host__ __device__ inline int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }
__host__ __device__ inline int64_t round_up(int64_t a, int64_t b) { return ceil_div(a, b) * b; }
bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15) == 0; }
__host__ __device__ inline int64_t partial_width(int64_t v_dim) { return round_up(v_dim, 4) + 4; }  // m, l, 2 unused, o

size_t shared_bytes(const AttentionPlan& p) {
  const int stages = 2 * p.leaf * (p.k_pitch + p.v_pitch);
  return sizeof(float) * size_t(stages + p.heads * p.k_pitch + p.heads * p.leaf + 2 * p.heads);
}

AttentionPlan plan_for(const AttentionArgs& a) {
  const PagedKvArgs& c = a.cache;
  const int64_t group = a.q_heads / c.kv_heads;
  AttentionPlan p{};
  p.heads = group % 4 == 0 ? 4 : group % 2 == 0 ? 2 : 1;
  p.v_pitch = c.v == c.k && c.kv_heads == 1 && c.v_dim <= c.k_dim ? 0 : int(round_up(c.v_dim, 4));
  for (p.leaf = kMaxLeaf;; p.leaf /= 2) {
    p.dot_threads = std::min(32, std::max(1, kThreads / (p.heads * p.leaf)));
    // K rows of T-thread dot products: the pitch in float4s is T mod 8 (mod 8), so the 8 threads
    // of a 128-bit shared-memory phase (8 / T keys x T parts) read distinct banks.
    p.k_pitch = int(4 * (round_up(ceil_div(c.k_dim, 4), 8) + p.dot_threads % 8));
    if (p.leaf == kMinLeaf || shared_bytes(p) <= kSharedBudget) break;
  }
  p.vec = c.k_dim % 4 == 0 && c.v_dim % 4 == 0 && c.slot_bytes % 16 == 0 && aligned16(c.k) && aligned16(c.v);
  const int64_t units = a.rows * (a.q_heads / p.heads), leaves = ceil_div(a.max_keys, p.leaf);
  p.by_leaf = leaves <= kMaxLeafSplits;
  p.splits = p.by_leaf ? leaves : ceil_div(a.max_keys, kAttentionSegment);
  if (a.counters == nullptr || units > kAttentionMaxSplitUnits || leaves < kMinSplitLeaves ||
      a.rows * a.q_heads * p.splits * partial_width(c.v_dim) > kMaxPartialFloats)
    p.splits = 1;
  return p;
}

// n floats from global src to shared dst, by the kCopyLanes threads of one row (lane 0..7).
__device__ __forceinline__ void copy_row(float* dst, const float* src, int n, int lane, bool vec) {
  if (vec) {
    for (int f = lane; f < n / 4; f += kCopyLanes) cp_async16(dst + 4 * f, src + 4 * f);
  } else {
    for (int f = lane; f < n; f += kCopyLanes) cp_async4(dst + f, src + f);
  }
}

// Values [first, first + n) of the slot at `slot` into shared dst as floats, by the kCopyLanes
// threads of one row: an F32 cache's by cp.async, the others' decoded (plain shared stores,
// published by the same barrier as the copies). D is layout.dtype, fixed per kernel instance.
template <KvDtype D>
__device__ __forceinline__ void stage_row(float* dst, const uint8_t* slot, KvLayout layout, const KvSlotLayout& s,
                                          int first, int n, int lane, bool vec) {
  if constexpr (D == KvDtype::f32) {
    copy_row(dst, reinterpret_cast<const float*>(slot) + first, n, lane, vec);
  } else {
    layout.dtype = D;  // lets the compiler drop the other dtypes' decoders
    if (vec) {  // whole float4s within one scale group (dims multiples of 4)
      for (int f = lane; f < n / 4; f += kCopyLanes) kv_slot_value4(layout, s, slot, first + 4 * f, dst + 4 * f);
    } else {
      for (int i = lane; i < n; i += kCopyLanes) dst[i] = kv_slot_value(layout, s, slot, first + i);
    }
  }
}

// Stages the K (and V) rows of one leaf; this thread copies its share of keys
// j = threadIdx.x / kCopyLanes + r * (kThreads / kCopyLanes), whose block-table entries
// fetch_table() loaded (one leaf ahead, so the copies never wait for the table).
template <KvDtype D>
struct LeafStager {
  const int32_t* table;
  const uint8_t* k;  // slot 0 of the K (V) cache
  const uint8_t* v;
  KvLayout layout;
  KvSlotLayout slot;
  int k_first, v_first;         // the KV head's first K / V value in a slot
  int block_size, block_shift;  // block_shift: log2(block_size), -1 if not a power of two
  int keys, k_dim, v_dim, leaf, k_pitch, v_pitch;
  bool vec;
  int32_t block[kKeysPerThread];

  __device__ int row_key(int r) const { return int(threadIdx.x / kCopyLanes) + r * (kThreads / kCopyLanes); }
  __device__ bool mine(int first_key, int r) const { return row_key(r) < leaf && first_key + row_key(r) < keys; }
  __device__ int block_of(int key) const { return block_shift >= 0 ? key >> block_shift : key / block_size; }
  __device__ int offset_in_block(int key) const {
    return block_shift >= 0 ? key & (block_size - 1) : key % block_size;
  }
  __device__ void fetch_table(int leaf_index) {
    const int first_key = leaf_index * leaf;
#pragma unroll
    for (int r = 0; r < kKeysPerThread; ++r)
      if (mine(first_key, r)) block[r] = table[block_of(first_key + row_key(r))];
  }
  __device__ void issue(int leaf_index, float* stage) const {
    const int first_key = leaf_index * leaf;
    const int lane = threadIdx.x % kCopyLanes;
#pragma unroll
    for (int r = 0; r < kKeysPerThread; ++r) {
      if (!mine(first_key, r)) continue;
      const int j = row_key(r);
      const int64_t row = (int64_t(block[r]) * block_size + offset_in_block(first_key + j)) * slot.bytes;
      stage_row<D>(stage + j * k_pitch, k + row, layout, slot, k_first, k_dim, lane, vec);
      if (v_pitch > 0)
        stage_row<D>(stage + leaf * k_pitch + j * v_pitch, v + row, layout, slot, v_first, v_dim, lane, vec);
    }
  }
};

// The tree above leaves: a partial folded into the open segment, which is folded into the total
// (and reopened) at a segment's end.
__device__ __forceinline__ void fold_leaf(Partial& total, Partial& segment, const Partial& leaf, bool segment_end) {
  fold(segment, leaf);
  if (segment_end) {
    fold(total, segment);
    segment = cleared();
  }
}

struct LeafShared {
  const float* stage;  // K rows (pitch k_pitch), then V rows (pitch v_pitch) unless V aliases K
  const float* q;      // [heads][k_pitch]
  float* p;            // [heads][leaf]: scores, then their exp(score - leaf max)
  float* leaf_m;       // [heads]
  float* leaf_l;       // [heads]
};

// This thread's parts of a leaf: score dot product `dot` (head h, key j), of which it sums part
// `part`; output slots slot[r] = threadIdx.x + r * kThreads (head head[r], float4 d4[r]) while
// below `slots`.
struct LaneRoles {
  int dot, part, h, j, slots;
  int slot[kMaxSlots], head[kMaxSlots], d4[kMaxSlots];
};

__device__ LaneRoles lane_roles(const AttentionPlan& p, int v4) {
  LaneRoles roles{};
  roles.dot = int(threadIdx.x) / p.dot_threads;
  roles.part = int(threadIdx.x) % p.dot_threads;
  roles.h = roles.dot / p.leaf;
  roles.j = roles.dot % p.leaf;
  roles.slots = p.heads * v4;
#pragma unroll
  for (int r = 0; r < kMaxSlots; ++r) {
    roles.slot[r] = int(threadIdx.x) + r * kThreads;
    roles.head[r] = roles.slot[r] / v4;
    roles.d4[r] = roles.slot[r] % v4;
  }
  return roles;
}

// The leaf's n keys against the block's queries; folds each of this thread's output slots'
// leaf partial into segment[] (and total[] at a segment's end). Contains two block barriers.
__device__ void leaf_pass(const AttentionArgs& a, const AttentionPlan& p, const LeafShared& s, const LaneRoles& roles,
                          int n, bool segment_end, Partial (&total)[kMaxSlots], Partial (&segment)[kMaxSlots]) {
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, dots = p.heads * p.leaf;
  {  // scores
    const int dot = roles.dot, part = roles.part, h = roles.h, j = roles.j;
    float sum = 0.0f;
    const int k4_count = int(ceil_div(a.cache.k_dim, 4));
    if (dot < dots && j < n) {
      const auto* q4 = reinterpret_cast<const float4*>(s.q + h * p.k_pitch);
      const auto* k4 = reinterpret_cast<const float4*>(s.stage + j * p.k_pitch);
      float4 acc = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
      for (int f = part; f < k4_count; f += p.dot_threads) {
        const float4 qv = q4[f], kv = k4[f];
        acc = make_float4(fmaf(qv.x, kv.x, acc.x), fmaf(qv.y, kv.y, acc.y), fmaf(qv.z, kv.z, acc.z),
                          fmaf(qv.w, kv.w, acc.w));
      }
      sum = __fadd_rn(__fadd_rn(acc.x, acc.y), __fadd_rn(acc.z, acc.w));
    }
    for (int offset = p.dot_threads / 2; offset > 0; offset >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, offset);
    if (part == 0 && dot < dots) s.p[dot] = j < n ? __fmul_rn(sum, a.scale) : -INFINITY;
  }
  __syncthreads();
  if (warp < p.heads) {  // softmax of head `warp` over the leaf
    float* scores = s.p + warp * p.leaf;
    float m = -INFINITY;
    for (int j = lane; j < p.leaf; j += 32) m = fmaxf(m, scores[j]);
    m = warp_reduce(m, MaxOp());
    float l = 0.0f;
    for (int j = lane; j < p.leaf; j += 32) {
      const float e = expf(scores[j] - m);  // 0 past the leaf's keys
      scores[j] = e;
      l = __fadd_rn(l, e);
    }
    l = warp_reduce(l, SumOp());
    if (lane == 0) {
      s.leaf_m[warp] = m;
      s.leaf_l[warp] = l;
    }
  }
  __syncthreads();
  const float* v_rows = p.v_pitch > 0 ? s.stage + p.leaf * p.k_pitch : s.stage;
  const int v_pitch = p.v_pitch > 0 ? p.v_pitch : p.k_pitch;
#pragma unroll
  for (int r = 0; r < kMaxSlots; ++r) {
    if (roles.slot[r] >= roles.slots) break;
    const int h = roles.head[r], d4 = roles.d4[r];
    const float* weights = s.p + h * p.leaf;
    float4 acc = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
#pragma unroll 4
    for (int j = 0; j < n; ++j) {  // key order
      const float w = weights[j];
      const float4 v = *reinterpret_cast<const float4*>(v_rows + j * v_pitch + 4 * d4);
      acc = make_float4(fmaf(w, v.x, acc.x), fmaf(w, v.y, acc.y), fmaf(w, v.z, acc.z), fmaf(w, v.w, acc.w));
    }
    fold_leaf(total[r], segment[r], {s.leaf_m[h], s.leaf_l[h], acc}, segment_end);
  }
}

__device__ __forceinline__ void write_out(const AttentionArgs& a, const LaneRoles& roles, int64_t t, int64_t head0,
                                          const Partial (&total)[kMaxSlots]) {
#pragma unroll
  for (int r = 0; r < kMaxSlots; ++r) {
    if (roles.slot[r] >= roles.slots) break;
    const int h = roles.head[r], d = 4 * roles.d4[r];
    store_normalised(a.out + (t * a.q_heads + head0 + h) * a.cache.v_dim + d, total[r], int(a.cache.v_dim) - d);
  }
}

// grid (q_heads / H, rows, splits). Fused (splits 1): the block evaluates the row's whole tree
// and writes the output. Split: block z computes leaf z (by leaf) or segment z, writes its partial;
// the last block of the row (counter) folds the partials through the same tree, loading
// kFoldAhead of them before folding them in order.
template <KvDtype D>
__global__ void __launch_bounds__(kThreads) attention_kernel(AttentionArgs a, AttentionPlan p) {
  extern __shared__ float4 shared4[];
  __shared__ int last_block;
  pdl_trigger();
  pdl_wait();  // q and the KV cache come from the previous kernels
  const int group = int(blockIdx.x), z = int(blockIdx.z);
  const int64_t unit = blockIdx.y, t = a.row_ids ? a.row_ids[unit] : unit;  // scratch by unit, data by row t
  const int keys = a.positions[t] + 1, leaves = int(ceil_div(keys, p.leaf));
  const int per_segment = int(kAttentionSegment) / p.leaf;
  const int used = p.splits == 1 ? 1 : p.by_leaf ? leaves : int(ceil_div(keys, kAttentionSegment));
  if (z >= used) return;  // this row needs fewer blocks than the grid has (whole block)
  const int first = p.splits == 1 ? 0 : p.by_leaf ? z : z * per_segment;
  const int end = p.splits == 1 ? leaves : p.by_leaf ? z + 1 : min(leaves, first + per_segment);
  const int64_t head0 = int64_t(group) * p.heads, kv_head = head0 / (a.q_heads / a.cache.kv_heads);
  const int v4 = int(ceil_div(a.cache.v_dim, 4));
  const LaneRoles roles = lane_roles(p, v4);

  float* const stages = reinterpret_cast<float*>(shared4);
  const int stage_floats = p.leaf * (p.k_pitch + p.v_pitch);
  float* const q = stages + 2 * stage_floats;
  LeafShared s{nullptr, q, q + p.heads * p.k_pitch, nullptr, nullptr};
  s.leaf_m = s.p + p.heads * p.leaf;
  s.leaf_l = s.leaf_m + p.heads;
  const int block_size = int(a.cache.block_size);
  const KvLayout layout = paged_kv_layout(a.cache);
  LeafStager<D> stager{a.block_tables + int64_t(a.row_seq[t]) * a.table_stride,
                    a.cache.k, a.cache.v, layout, kv_slot_layout(layout), int(kv_head * a.cache.k_dim),
                    int(kv_head * a.cache.v_dim), block_size,
                    (block_size & (block_size - 1)) == 0 ? __ffs(block_size) - 1 : -1,
                    keys, int(a.cache.k_dim), int(a.cache.v_dim), p.leaf, p.k_pitch, p.v_pitch, p.vec, {}};
  stager.fetch_table(first);
  if ((a.cache.k_dim | a.cache.v_dim) % 4 != 0) {  // float4 reads cover padding columns: zero them
    for (int i = threadIdx.x; i < stage_floats / 2; i += kThreads) shared4[i] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    __syncthreads();  // before any copy lands in them
  }
  stager.issue(first, stages);
  cp_async_commit();
  if (first + 1 < end) stager.fetch_table(first + 1);
  for (int i = threadIdx.x; i < p.heads * p.k_pitch; i += kThreads) {  // published by the loop's first barrier
    const int h = i / p.k_pitch, d = i % p.k_pitch;
    q[i] = d < a.cache.k_dim ? a.q[(t * a.q_heads + head0 + h) * a.q_stride + d] : 0.0f;
  }
  Partial total[kMaxSlots], segment[kMaxSlots];
#pragma unroll
  for (int r = 0; r < kMaxSlots; ++r) total[r] = segment[r] = cleared();
  for (int leaf = first; leaf < end; ++leaf) {
    const int buffer = (leaf - first) & 1;
    if (leaf + 1 < end) stager.issue(leaf + 1, stages + (buffer ^ 1) * stage_floats);
    cp_async_commit();
    if (leaf + 2 < end) stager.fetch_table(leaf + 2);
    cp_async_wait_all_but_newest();
    __syncthreads();  // every thread's copies of this leaf have landed
    s.stage = stages + buffer * stage_floats;
    const int n = min(p.leaf, keys - leaf * p.leaf);
    leaf_pass(a, p, s, roles, n, (leaf + 1) % per_segment == 0 || leaf + 1 == end, total, segment);
    __syncthreads();  // this buffer and the scores are free again
  }
  if (p.splits == 1) {
    write_out(a, roles, t, head0, total);
    return;
  }

  const int64_t width = partial_width(a.cache.v_dim);
  auto partial_at = [&](int h, int split) {
    return a.partials + ((unit * a.q_heads + head0 + h) * p.splits + split) * width;
  };
#pragma unroll
  for (int r = 0; r < kMaxSlots; ++r) {
    if (roles.slot[r] >= roles.slots) break;
    float* dst = partial_at(roles.head[r], z);
    if (roles.d4[r] == 0) {
      dst[0] = total[r].m;
      dst[1] = total[r].l;
    }
    reinterpret_cast<float4*>(dst + 4)[roles.d4[r]] = total[r].o;
  }
  __syncthreads();  // every thread's partials before thread 0's arrival (arrival_count.cuh)
  int32_t* counter = a.counters + unit * (a.q_heads / p.heads) + group;
  if (threadIdx.x == 0) last_block = count_arrival(reinterpret_cast<uint32_t*>(counter)) == uint32_t(used - 1);
  __syncthreads();
  if (!last_block) return;
  const int combine_per_segment = p.by_leaf ? per_segment : 1;  // partials per segment
#pragma unroll
  for (int r = 0; r < kMaxSlots; ++r) {
    if (roles.slot[r] >= roles.slots) break;
    total[r] = segment[r] = cleared();
    for (int i0 = 0; i0 < used; i0 += kFoldAhead) {
      Partial ahead[kFoldAhead];
#pragma unroll
      for (int b = 0; b < kFoldAhead; ++b)
        if (i0 + b < used) ahead[b] = load_partial(partial_at(roles.head[r], i0 + b), roles.d4[r]);
#pragma unroll
      for (int b = 0; b < kFoldAhead; ++b) {
        const int i = i0 + b;
        if (i < used) fold_leaf(total[r], segment[r], ahead[b], (i + 1) % combine_per_segment == 0 || i + 1 == used);
      }
    }
  }
  write_out(a, roles, t, head0, total);
  if (threadIdx.x == 0) *counter = 0;  // ready for the next launch
}

// One block per row: each thread encodes its units of the row's K (then V) slot with the CPU's
// encoder (kv_codec.h), so the bytes are the CPU's; padding keeps the zeros of the allocation.
__global__ void kv_write_kernel(PagedKvArgs cache, const float* k, const float* v, const int64_t* slots) {
  pdl_trigger();
  pdl_wait();  // k, v and the slots come from the previous kernels and copies
  const int64_t t = blockIdx.x;
  const KvLayout layout = paged_kv_layout(cache);
  const KvSlotLayout s = kv_slot_layout(layout);
  const int64_t units = kv_slot_units(layout, s);
  for (int64_t u = threadIdx.x; u < units; u += blockDim.x)
    kv_encode_unit(layout, s, k + t * s.values, cache.k_scale, cache.k + slots[t] * s.bytes, u);
  if (v == nullptr) return;
  for (int64_t u = threadIdx.x; u < units; u += blockDim.x)
    kv_encode_unit(layout, s, v + t * s.values, cache.v_scale, cache.v + slots[t] * s.bytes, u);
}

template <KvDtype D>
void launch(const AttentionArgs& a, cudaStream_t stream) {
  static const cudaError_t opt_in =  // once per instance: every plan's shared memory fits the budget
      cudaFuncSetAttribute(attention_kernel<D>, cudaFuncAttributeMaxDynamicSharedMemorySize, int(kSharedBudget));
  (void)opt_in;
  const AttentionPlan p = plan_for(a);
  const dim3 grid(unsigned(a.q_heads / p.heads), unsigned(a.rows), unsigned(p.splits));
  launch_dependent_kernel<attention_kernel<D>>(grid, dim3(kThreads), shared_bytes(p), 1, stream, a, p);
}

}  // namespace

int64_t attention_partial_floats(const AttentionArgs& a) {
  const AttentionPlan p = plan_for(a);
  return p.splits == 1 ? 0 : a.rows * a.q_heads * p.splits * partial_width(a.cache.v_dim);
}

void attention_launch(const AttentionArgs& a, cudaStream_t stream) {
  switch (a.cache.dtype) {
    case KvDtype::f32: return launch<KvDtype::f32>(a, stream);
    case KvDtype::bf16: return launch<KvDtype::bf16>(a, stream);
    case KvDtype::fp8_e4m3: return launch<KvDtype::fp8_e4m3>(a, stream);
    case KvDtype::fp8_e5m2: return launch<KvDtype::fp8_e5m2>(a, stream);
    case KvDtype::nvfp4: return launch<KvDtype::nvfp4>(a, stream);
  }
}

void kv_write_launch(const PagedKvArgs& cache, const float* k, const float* v, const int64_t* slots,
                     int64_t rows, cudaStream_t stream) {
  launch_dependent_kernel<kv_write_kernel>(dim3(unsigned(rows)), dim3(256), 0, 1, stream, cache, k, v, slots);
}

}  // namespace moet::cuda
