// GLM-5 / DeepSeek-V4 kernels (see sparse_ops.h). Each kernel is a programmatic dependent launch
// (launch.cuh) that waits for the previous kernel before touching memory.
#include "kernels/cuda/sparse_ops.h"

#include "formats/kv_codec.h"
#include "kernels/cuda/block_reduce.cuh"
#include "kernels/cuda/launch.cuh"

#include <cub/block/block_scan.cuh>

namespace moet::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kGatherThreads = 128;
constexpr int kMaxVPerThread = kAttentionMaxVDim / kGatherThreads;

__device__ __forceinline__ int64_t slot_of(const PagedKvArgs& c, const int32_t* table, int64_t position) {
  return int64_t(table[position / c.block_size]) * c.block_size + position % c.block_size;
}

// Value i of the slot `slot` of K (or V) of cache c, decoded.
__device__ __forceinline__ float slot_value(const PagedKvArgs& c, const uint8_t* base, int64_t slot, int64_t i) {
  const KvLayout layout = paged_kv_layout(c);
  return kv_slot_value(layout, kv_slot_layout(layout), base + slot * c.slot_bytes, i);
}

__device__ __forceinline__ float sigmoid(float x) { return 1.0f / (1.0f + expf(-x)); }

// ---------------------------------------------------------------- attention over chosen keys

// One (row, query head) per block: online softmax over the row's keys, source by source.
__global__ void __launch_bounds__(kGatherThreads) attention_gather_kernel(GatherArgs a, StepRowsArgs r) {
  __shared__ float scratch[32];
  pdl_trigger();
  pdl_wait();
  const int64_t t = blockIdx.x, h = blockIdx.y, pos = r.positions[t];
  const int32_t* table = r.block_tables + int64_t(r.row_seq[t]) * r.table_stride;
  const PagedKvArgs& first = a.sources[0].cache;
  const int64_t kv_head = h / (a.q_heads / first.kv_heads), k_dim = first.k_dim, v_dim = first.v_dim;
  const float* q = a.q + (t * a.q_heads + h) * a.q_stride;
  float m = a.sinks ? a.sinks[h] : -INFINITY, l = a.sinks ? 1.0f : 0.0f, o[kMaxVPerThread] = {};
  const auto key = [&](const PagedKvArgs& c, int64_t j) {
    const int64_t slot = slot_of(c, table, j);
    float dot = 0.0f;
    for (int64_t d = threadIdx.x; d < k_dim; d += kGatherThreads)
      dot += q[d] * slot_value(c, c.k, slot, kv_head * k_dim + d);
    const float s = block_reduce(dot, SumOp(), 0.0f, scratch) * a.scale;
    const float m_new = fmaxf(m, s), correction = expf(m - m_new), p = expf(s - m_new);
    l = l * correction + p;
    for (int i = 0; i < kMaxVPerThread; ++i) {
      const int64_t d = threadIdx.x + i * kGatherThreads;
      if (d < v_dim) o[i] = o[i] * correction + p * slot_value(c, c.v, slot, kv_head * v_dim + d);
    }
    m = m_new;
  };
  for (int s = 0; s < a.count; ++s) {
    const KeySourceArgs& src = a.sources[s];
    if (src.positions != nullptr) {
      for (int64_t i = 0; i < src.width; ++i) {
        const int64_t j = src.positions[t * src.width + i];
        if (j >= 0 && j <= pos) key(src.cache, j);
      }
      continue;
    }
    const int64_t lo = src.window > 0 ? max(int64_t(0), pos - src.window + 1) : 0;
    const int64_t first_key = lo + (src.stride - (lo + 1) % src.stride) % src.stride;
    for (int64_t j = first_key; j <= pos; j += src.stride) key(src.cache, j);
  }
  float* out = a.out + (t * a.q_heads + h) * v_dim;
  for (int i = 0; i < kMaxVPerThread; ++i) {
    const int64_t d = threadIdx.x + i * kGatherThreads;
    if (d < v_dim) out[d] = l > 0.0f ? o[i] / l : 0.0f;
  }
}

// ---------------------------------------------------------------- the lightning indexer

// Order-preserving key of a score (larger score, larger key; -0 as +0).
__device__ __forceinline__ uint32_t order_key(float x) {
  const uint32_t u = __float_as_uint(x == 0.0f ? 0.0f : x);
  return (u >> 31) ? ~u : (u | 0x80000000u);
}

// One row per block: candidates j = stride - 1, 2 stride - 1, ... <= position; scores into the
// row's scratch, the k-th largest found by a 4-pass radix select, then the chosen positions
// written in ascending order (ties to the lower position).
__global__ void __launch_bounds__(kThreads) indexer_topk_kernel(IndexerArgs a, StepRowsArgs r) {
  using Scan = cub::BlockScan<int, kThreads>;
  __shared__ typename Scan::TempStorage scan;
  __shared__ int histogram[256];
  __shared__ uint32_t shared_prefix;
  __shared__ int shared_remaining;
  pdl_trigger();
  pdl_wait();
  const int64_t t = blockIdx.x, pos = r.positions[t], n = (pos + 1) / a.stride, k = a.k;
  int32_t* out = a.out + t * k;
  if (n <= k) {
    for (int64_t c = threadIdx.x; c < k; c += kThreads) out[c] = c < n ? int32_t((c + 1) * a.stride - 1) : -1;
    return;
  }
  const int32_t* table = r.block_tables + int64_t(r.row_seq[t]) * r.table_stride;
  float* scores = a.scores + t * a.max_candidates;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, dim = int(a.keys.k_dim);
  for (int64_t c = warp; c < n; c += kThreads / 32) {
    const int64_t slot = slot_of(a.keys, table, (c + 1) * a.stride - 1);
    float total = 0.0f;
    for (int64_t hd = 0; hd < a.heads; ++hd) {
      const float* q = a.q + (t * a.heads + hd) * dim;
      float dot = 0.0f;
      for (int d = lane; d < dim; d += 32) dot += q[d] * slot_value(a.keys, a.keys.k, slot, d);
      dot = warp_reduce(dot, SumOp());
      total += a.weights[t * a.heads + hd] * fmaxf(dot * a.scale, 0.0f);
    }
    if (lane == 0) scores[c] = total;
  }
  __syncthreads();
  uint32_t prefix = 0, mask = 0;
  int remaining = int(k);
  for (int shift = 24; shift >= 0; shift -= 8) {
    for (int b = threadIdx.x; b < 256; b += kThreads) histogram[b] = 0;
    __syncthreads();
    for (int64_t c = threadIdx.x; c < n; c += kThreads) {
      const uint32_t u = order_key(scores[c]);
      if ((u & mask) == prefix) atomicAdd(&histogram[(u >> shift) & 255], 1);
    }
    __syncthreads();
    if (threadIdx.x == 0) {
      int above = 0, digit = 255;
      for (; digit > 0 && above + histogram[digit] < remaining; --digit) above += histogram[digit];
      shared_prefix = prefix | (uint32_t(digit) << shift);
      shared_remaining = remaining - above;
    }
    __syncthreads();
    prefix = shared_prefix;
    remaining = shared_remaining;
    mask |= 255u << shift;
  }
  // prefix: the k-th largest key; take every larger key and the first `remaining` equal ones.
  int ties_before = 0, written = 0;
  for (int64_t base = 0; base < n; base += kThreads) {
    const int64_t c = base + threadIdx.x;
    const uint32_t u = c < n ? order_key(scores[c]) : 0u;
    const int tie = c < n && u == prefix;
    int tie_rank, ties;
    Scan(scan).ExclusiveSum(tie, tie_rank, ties);
    __syncthreads();
    const int chosen = c < n && (u > prefix || (tie && ties_before + tie_rank < remaining));
    int rank, count;
    Scan(scan).ExclusiveSum(chosen, rank, count);
    __syncthreads();
    if (chosen) out[written + rank] = int32_t((c + 1) * a.stride - 1);
    ties_before += ties;
    written += count;
  }
}

// ---------------------------------------------------------------- the KV compressor

// One row per block; rows that close no window return at once.
__global__ void __launch_bounds__(kThreads) kv_compress_kernel(CompressArgs a, StepRowsArgs r) {
  extern __shared__ float entry[];  // [dim]
  __shared__ float scratch[32];
  pdl_trigger();
  pdl_wait();
  const int64_t t = blockIdx.x, pos = r.positions[t], m = a.ratio, dim = a.dim;
  if ((pos + 1) % m != 0) return;
  const int64_t w = pos / m, width = (a.overlap ? 2 : 1) * dim;
  const int32_t* table = r.block_tables + int64_t(r.row_seq[t]) * r.table_stride;
  const auto kv = [&](int64_t position, int64_t half, int64_t c) {
    return slot_value(a.state, a.state.k, slot_of(a.state, table, position), half * dim + c);
  };
  const auto gate = [&](int64_t position, int64_t i, int64_t half, int64_t c) {
    return slot_value(a.state, a.state.k, slot_of(a.state, table, position), width + half * dim + c) +
           a.position_bias[i * width + half * dim + c];
  };
  const bool previous = a.overlap && w > 0;
  const int64_t half = a.overlap ? 1 : 0;
  float sq = 0.0f;
  for (int64_t c = threadIdx.x; c < dim; c += kThreads) {
    float mx = -INFINITY;
    if (previous)
      for (int64_t i = 0; i < m; ++i) mx = fmaxf(mx, gate((w - 1) * m + i, i, 0, c));
    for (int64_t i = 0; i < m; ++i) mx = fmaxf(mx, gate(w * m + i, i, half, c));
    float sum = 0.0f, acc = 0.0f;
    if (previous)
      for (int64_t i = 0; i < m; ++i) sum += expf(gate((w - 1) * m + i, i, 0, c) - mx);
    for (int64_t i = 0; i < m; ++i) sum += expf(gate(w * m + i, i, half, c) - mx);
    if (previous)
      for (int64_t i = 0; i < m; ++i)
        acc += kv((w - 1) * m + i, 0, c) * (expf(gate((w - 1) * m + i, i, 0, c) - mx) / sum);
    for (int64_t i = 0; i < m; ++i) acc += kv(w * m + i, half, c) * (expf(gate(w * m + i, i, half, c) - mx) / sum);
    entry[c] = acc;
    sq += acc * acc;
  }
  const float inv = 1.0f / sqrtf(block_reduce(sq, SumOp(), 0.0f, scratch) / float(dim) + a.eps);
  for (int64_t c = threadIdx.x; c < dim; c += kThreads) entry[c] = a.norm[c] * (entry[c] * inv);
  __syncthreads();
  const int pairs = a.rope.pairs;
  for (int i = threadIdx.x; i < pairs; i += kThreads) {
    float* v = entry + dim - 2 * pairs + 2 * i;
    const float angle = float(w * m) * a.rope.inv_freq[i];
    const float cs = cosf(angle) * a.rope.scale, sn = sinf(angle) * a.rope.scale, x0 = v[0], x1 = v[1];
    v[0] = x0 * cs - x1 * sn;
    v[1] = x1 * cs + x0 * sn;
  }
  __syncthreads();
  const KvLayout layout = paged_kv_layout(a.out);
  const KvSlotLayout s = kv_slot_layout(layout);
  uint8_t* slot = a.out.k + slot_of(a.out, table, pos) * a.out.slot_bytes;
  for (int64_t b = threadIdx.x; b < s.bytes; b += kThreads) slot[b] = 0;
  __syncthreads();
  for (int64_t u = threadIdx.x; u < kv_slot_units(layout, s); u += kThreads)
    kv_encode_unit(layout, s, entry, a.out.k_scale, slot, u);
}

// ---------------------------------------------------------------- hyper-connections

// The row's streams normalised as one vector, dotted with fn rows [0, mixes): mix in shared.
__device__ void hyper_mix(const HyperArgs& a, const float* x, int mixes, float* mix, float* scratch) {
  const int64_t n = a.hc * a.dim;
  float sq = 0.0f;
  for (int64_t i = threadIdx.x; i < n; i += kThreads) sq += x[i] * x[i];
  const float inv = 1.0f / sqrtf(block_reduce(sq, SumOp(), 0.0f, scratch) / float(n) + a.norm_eps);
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  for (int mi = warp; mi < mixes; mi += kThreads / 32) {
    float dot = 0.0f;
    for (int64_t i = lane; i < n; i += 32) dot += x[i] * inv * a.fn[mi * n + i];
    dot = warp_reduce(dot, SumOp());
    if (lane == 0) mix[mi] = dot;
  }
  __syncthreads();
}

// out[d] = sum_i pre[i] * stream_i[d].
__device__ void hyper_collapse(const HyperArgs& a, const float* x, const float* pre, float* out) {
  for (int64_t d = threadIdx.x; d < a.dim; d += kThreads) {
    float v = 0.0f;
    for (int64_t i = 0; i < a.hc; ++i) v += pre[i] * x[i * a.dim + d];
    out[d] = v;
  }
}

__global__ void __launch_bounds__(kThreads) hc_pre_kernel(HyperArgs a, const float* streams, float* post, float* comb,
                                                          float* collapsed) {
  __shared__ float scratch[32], mix[(2 + kMaxHyperStreams) * kMaxHyperStreams], pre[kMaxHyperStreams];
  pdl_trigger();
  pdl_wait();
  const int64_t t = blockIdx.x, hc = a.hc;
  const float* x = streams + t * hc * a.dim;
  hyper_mix(a, x, int((2 + hc) * hc), mix, scratch);
  if (threadIdx.x == 0) {  // pre, post, and Sinkhorn's comb (kernels/cpu/hyper_connection.cpp's order)
    float c[kMaxHyperStreams * kMaxHyperStreams];
    for (int64_t i = 0; i < hc; ++i) {
      pre[i] = sigmoid(mix[i] * a.scale[0] + a.base[i]) + a.eps;
      post[t * hc + i] = 2.0f * sigmoid(mix[hc + i] * a.scale[1] + a.base[hc + i]);
    }
    for (int64_t i = 0; i < hc * hc; ++i) c[i] = mix[2 * hc + i] * a.scale[2] + a.base[2 * hc + i];
    for (int64_t j = 0; j < hc; ++j) {
      float mx = -INFINITY, sum = 0.0f;
      for (int64_t q = 0; q < hc; ++q) mx = fmaxf(mx, c[j * hc + q]);
      for (int64_t q = 0; q < hc; ++q) sum += (c[j * hc + q] = expf(c[j * hc + q] - mx));
      for (int64_t q = 0; q < hc; ++q) c[j * hc + q] = c[j * hc + q] / sum + a.eps;
    }
    for (int64_t it = 0; it < a.iters; ++it) {
      if (it > 0)
        for (int64_t j = 0; j < hc; ++j) {
          float sum = 0.0f;
          for (int64_t q = 0; q < hc; ++q) sum += c[j * hc + q];
          for (int64_t q = 0; q < hc; ++q) c[j * hc + q] /= sum + a.eps;
        }
      for (int64_t q = 0; q < hc; ++q) {
        float sum = 0.0f;
        for (int64_t j = 0; j < hc; ++j) sum += c[j * hc + q];
        for (int64_t j = 0; j < hc; ++j) c[j * hc + q] /= sum + a.eps;
      }
    }
    for (int64_t i = 0; i < hc * hc; ++i) comb[t * hc * hc + i] = c[i];
  }
  __syncthreads();
  hyper_collapse(a, x, pre, collapsed + t * a.dim);
}

__global__ void __launch_bounds__(kThreads) hc_post_kernel(HyperArgs a, float* streams, const float* block_out,
                                                           const float* post, const float* comb) {
  pdl_trigger();
  pdl_wait();
  const int64_t t = blockIdx.x, hc = a.hc, dim = a.dim;
  float* x = streams + t * hc * dim;
  for (int64_t d = threadIdx.x; d < dim; d += kThreads) {
    float old[kMaxHyperStreams];
    for (int64_t j = 0; j < hc; ++j) old[j] = x[j * dim + d];
    for (int64_t k = 0; k < hc; ++k) {
      float v = post[t * hc + k] * block_out[t * dim + d];
      for (int64_t j = 0; j < hc; ++j) v += comb[(t * hc + j) * hc + k] * old[j];
      x[k * dim + d] = v;
    }
  }
}

__global__ void __launch_bounds__(kThreads) hc_head_kernel(HyperArgs a, const float* streams, float* out) {
  __shared__ float scratch[32], mix[kMaxHyperStreams], pre[kMaxHyperStreams];
  pdl_trigger();
  pdl_wait();
  const int64_t t = blockIdx.x;
  const float* x = streams + t * a.hc * a.dim;
  hyper_mix(a, x, int(a.hc), mix, scratch);
  if (threadIdx.x < a.hc) pre[threadIdx.x] = sigmoid(mix[threadIdx.x] * a.scale[0] + a.base[threadIdx.x]) + a.eps;
  __syncthreads();
  hyper_collapse(a, x, pre, out + t * a.dim);
}

// ---------------------------------------------------------------- rope, LayerNorm, clamp, hash routing

// One row per block; heads one after the other through a shared copy of the rotated span.
__global__ void __launch_bounds__(kThreads) rope_rotate_kernel(RopeArgs rope, bool in_place, bool inverse, float* x,
                                                               int64_t heads, int64_t row_stride, int64_t head_stride,
                                                               int64_t offset, const int32_t* positions) {
  __shared__ float rotated[2 * kMaxRopePairs];
  pdl_trigger();
  pdl_wait();
  const int64_t t = blockIdx.x;
  const int pairs = rope.pairs;
  const bool pairs_layout = rope.interleaved;
  for (int64_t h = 0; h < heads; ++h) {
    float* v = x + t * row_stride + h * head_stride + offset;
    for (int i = threadIdx.x; i < pairs; i += kThreads) {
      const float angle = float(positions[t]) * rope.inv_freq[i];
      const float cs = cosf(angle) * rope.scale, sn = (inverse ? -sinf(angle) : sinf(angle)) * rope.scale;
      const float p0 = pairs_layout ? v[2 * i] : v[i], p1 = pairs_layout ? v[2 * i + 1] : v[i + pairs];
      const float r0 = p0 * cs - p1 * sn, r1 = p1 * cs + p0 * sn;
      rotated[in_place && pairs_layout ? 2 * i : i] = r0;
      rotated[in_place && pairs_layout ? 2 * i + 1 : i + pairs] = r1;
    }
    __syncthreads();
    for (int i = threadIdx.x; i < 2 * pairs; i += kThreads) v[i] = rotated[i];
    __syncthreads();
  }
}

__global__ void __launch_bounds__(kThreads) layernorm_kernel(const float* x, int64_t dim, const float* weight,
                                                             const float* bias, float eps, float* out) {
  __shared__ float scratch[32];
  pdl_trigger();
  pdl_wait();
  const float* in = x + int64_t(blockIdx.x) * dim;
  float sum = 0.0f;
  for (int64_t i = threadIdx.x; i < dim; i += kThreads) sum += in[i];
  const float mean = block_reduce(sum, SumOp(), 0.0f, scratch) / float(dim);
  float var = 0.0f;
  for (int64_t i = threadIdx.x; i < dim; i += kThreads) var += (in[i] - mean) * (in[i] - mean);
  const float inv = 1.0f / sqrtf(block_reduce(var, SumOp(), 0.0f, scratch) / float(dim) + eps);
  __syncthreads();  // every thread has read its inputs (out may alias x)
  for (int64_t i = threadIdx.x; i < dim; i += kThreads)
    out[int64_t(blockIdx.x) * dim + i] = (in[i] - mean) * inv * weight[i] + bias[i];
}

__global__ void silu_mul_clamped_kernel(const float* gate_up, int64_t rows, int64_t inner, float limit, float* out) {
  pdl_trigger();
  pdl_wait();
  const int64_t n = rows * inner;
  for (int64_t idx = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; idx < n; idx += int64_t(gridDim.x) * blockDim.x) {
    const int64_t t = idx / inner, i = idx % inner;
    const float g = fminf(gate_up[t * 2 * inner + i], limit);
    const float u = fminf(fmaxf(gate_up[t * 2 * inner + inner + i], -limit), limit);
    out[idx] = g / (1.0f + expf(-g)) * u;
  }
}

__global__ void router_hash_kernel(const float* logits, int64_t rows, int64_t experts, int64_t top_k,
                                   const int32_t* tokens, const int32_t* table, int64_t vocab, bool normalize,
                                   float scaling, int32_t* ids, float* weights) {
  pdl_trigger();
  pdl_wait();
  const int64_t t = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (t >= rows) return;
  const int32_t token = tokens[t];
  float total = 0.0f;
  for (int64_t i = 0; i < top_k; ++i) {
    const int32_t e = token >= 0 && token < vocab ? table[int64_t(token) * top_k + i] : -1;
    const float x = e >= 0 && e < experts ? logits[t * experts + e] : 0.0f;
    ids[t * top_k + i] = e;
    weights[t * top_k + i] = e >= 0 && e < experts ? sqrtf(x > 20.0f ? x : log1pf(expf(x))) : 0.0f;
    total += weights[t * top_k + i];
  }
  for (int64_t i = 0; i < top_k; ++i)
    weights[t * top_k + i] = (normalize ? weights[t * top_k + i] / (total + 1e-20f) : weights[t * top_k + i]) * scaling;
}

}  // namespace

void attention_gather_launch(const GatherArgs& a, const StepRowsArgs& rows, cudaStream_t stream) {
  launch_dependent_kernel<attention_gather_kernel>(dim3(unsigned(rows.rows), unsigned(a.q_heads)), dim3(kGatherThreads),
                                                   0, 1, stream, a, rows);
}

void indexer_topk_launch(const IndexerArgs& a, const StepRowsArgs& rows, cudaStream_t stream) {
  launch_dependent_kernel<indexer_topk_kernel>(dim3(unsigned(rows.rows)), dim3(kThreads), 0, 1, stream, a, rows);
}

void kv_compress_launch(const CompressArgs& a, const StepRowsArgs& rows, cudaStream_t stream) {
  launch_dependent_kernel<kv_compress_kernel>(dim3(unsigned(rows.rows)), dim3(kThreads), size_t(a.dim) * sizeof(float),
                                              1, stream, a, rows);
}

void hc_pre_launch(const HyperArgs& a, const float* streams, int64_t rows, float* post, float* comb, float* collapsed,
                   cudaStream_t stream) {
  launch_dependent_kernel<hc_pre_kernel>(dim3(unsigned(rows)), dim3(kThreads), 0, 1, stream, a, streams, post, comb,
                                         collapsed);
}

void hc_post_launch(const HyperArgs& a, float* streams, int64_t rows, const float* block_out, const float* post,
                    const float* comb, cudaStream_t stream) {
  launch_dependent_kernel<hc_post_kernel>(dim3(unsigned(rows)), dim3(kThreads), 0, 1, stream, a, streams, block_out,
                                          post, comb);
}

void hc_head_launch(const HyperArgs& a, const float* streams, int64_t rows, float* out, cudaStream_t stream) {
  launch_dependent_kernel<hc_head_kernel>(dim3(unsigned(rows)), dim3(kThreads), 0, 1, stream, a, streams, out);
}

void rope_rotate_launch(const RopeArgs& rope, bool pairs_in_place, bool inverse, float* x, int64_t rows,
                        int64_t heads, int64_t row_stride, int64_t head_stride, int64_t offset,
                        const int32_t* positions, cudaStream_t stream) {
  launch_dependent_kernel<rope_rotate_kernel>(dim3(unsigned(rows)), dim3(kThreads), 0, 1, stream, rope, pairs_in_place,
                                              inverse, x, heads, row_stride, head_stride, offset, positions);
}

void layernorm_launch(const float* x, int64_t rows, int64_t dim, const float* weight, const float* bias, float eps,
                      float* out, cudaStream_t stream) {
  launch_dependent_kernel<layernorm_kernel>(dim3(unsigned(rows)), dim3(kThreads), 0, 1, stream, x, dim, weight, bias,
                                            eps, out);
}

void silu_mul_clamped_launch(const float* gate_up, int64_t rows, int64_t inner, float limit, float* out,
                             cudaStream_t stream) {
  launch_dependent_kernel<silu_mul_clamped_kernel>(dim3(grid_for(rows * inner, kThreads)), dim3(kThreads), 0, 1,
                                                   stream, gate_up, rows, inner, limit, out);
}

void router_hash_launch(const float* logits, int64_t rows, int64_t experts, int64_t top_k, const int32_t* tokens,
                        const int32_t* table, int64_t vocab, bool normalize, float scaling, int32_t* expert_ids,
                        float* weights, cudaStream_t stream) {
  launch_dependent_kernel<router_hash_kernel>(dim3(grid_for(rows, 64)), dim3(64), 0, 1, stream, logits, rows, experts,
                                              top_k, tokens, table, vocab, normalize, scaling, expert_ids, weights);
}

}  // namespace moet::cuda
