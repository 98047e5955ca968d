// The compute backend interface the models are written against. A backend owns its memory
// (weights are uploaded once at load, activations allocated per step) and implements every op
// of the supported architectures; kernels/ hold the pure compute it calls. The CPU backend is
// backend/cpu; the CUDA backend (backend/cuda) implements the same ops. Activations are FP32;
// weights keep their checkpoint dtype where the op supports it (BF16, F32; FP8-block weights,
// tensor.h, for matmul and matmul_group).
// A forward begins with begin_step(), which hands the backend the per-row inputs (token ids,
// positions, KV slots, block tables) once; embedding, rope, kv_write and attention read them
// from there, so a GPU backend uploads them in one copy per step and a captured graph reads
// them at fixed device addresses (docs/design.md, "CUDA backend").
// A forward whose shape recurs (a decode step) can go through run_graph(): a backend with CUDA
// graphs captures the work it enqueues once per key and replays it afterwards; the others just
// run it. What only benchmarks use (copy bandwidth, pure reads, the per-op profile) is the
// separate BenchOps interface (bench_ops.h) that the same backends implement.
#pragma once

#include "backend/expert_types.h"
#include "backend/tensor.h"
#include "core/error.h"
#include "core/host_tensor.h"
#include "core/op_params.h"
#include "core/paged_kv.h"

#include <algorithm>
#include <compare>
#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <vector>

namespace moet {

// The per-row inputs of one forward (host memory, valid until the next begin_step). Row t
// reads tokens[t] at positions[t] of sequence row_seq[t], whose block table is
// block_tables[row_seq[t]], and writes its K/V into slots[t].
struct StepInputs {
  int64_t rows = 0;
  const int32_t* tokens = nullptr;
  const int32_t* positions = nullptr;
  const int32_t* row_seq = nullptr;
  const int64_t* slots = nullptr;
  int64_t sequences = 0;
  const int32_t* const* block_tables = nullptr;
  int64_t block_size = 0;  // of the KV caches the tables index
  int64_t vocab = 0;       // > 0: begin_step() checks every token id is in [0, vocab) (replayed
                           // steps never call embedding(), so the check cannot live there)
  // A decode-like step (the step runner's rule, engine/step_runner.h): a backend whose kernels
  // change with the row count picks them here as if every step had one row per sequence, so that
  // each row's bits depend only on its own inputs (a verify row equals the decode step it replaces).
  bool row_invariant = false;
};

// Identifies a captured forward (run_graph): every host value the caller bakes into the work it
// enqueues besides the step inputs (which sit at fixed device addresses): the model, the memory of
// the KV cache it writes, the rows whose logits it returns. The backend adds its own step layout
// (rows, sequences, block-table stride, block size) from begin_step().
struct GraphKey {
  std::vector<int64_t> values;
  auto operator<=>(const GraphKey&) const = default;
};

struct GraphStats {
  int64_t captures = 0;   // graphs captured and instantiated
  int64_t replays = 0;    // launches of an already captured graph
  int64_t failures = 0;   // captures that failed (that key then runs eagerly)
  int64_t cached = 0;     // graphs held now
};

// A KV cache for one layer, in the layout PagedKv describes (storage owned by the backend).
struct KvLayerCache {
  Tensor k, v;  // v may share k's storage (MLA)
  PagedKv view;
};

// One product of Backend::matmul_group: y = x @ w^T (+ bias; null or empty: none).
struct MatmulPart {
  const Tensor* w;
  const Tensor* bias;
  Tensor* y;
};

// The shape of the F32 block scales of an FP8-block weight [n, k].
inline std::vector<int64_t> fp8_block_scale_shape(int64_t n, int64_t k) {
  return {(n + kFp8Block - 1) / kFp8Block, (k + kFp8Block - 1) / kFp8Block};
}

// Makes `codes`, a U8 plane [n, k] of e4m3 codes in backend memory, an FP8-block weight whose
// block_scales are `scales` (F32 [ceil(n/128), ceil(k/128)] in the same backend's memory).
inline Tensor fp8_block_weight(Tensor codes, Tensor scales, const std::string& name) {
  MOET_CHECK(codes.dtype == DType::u8 && codes.shape.size() == 2, "FP8-block weight '{}': codes must be a U8 plane [n, k]",
             name);
  const std::vector<int64_t> shape = fp8_block_scale_shape(codes.dim(0), codes.dim(1));
  MOET_CHECK(scales.dtype == DType::f32 && scales.shape == shape,
             "FP8-block weight '{}' [{}, {}]: block scales must be F32 [{}, {}]", name, codes.dim(0), codes.dim(1),
             shape[0], shape[1]);
  codes.dtype = DType::f8_e4m3;
  codes.block_scales = std::make_shared<const Tensor>(std::move(scales));
  return codes;
}

// The widest Backend::top_logits: the most best logits of a row a step can ask for.
constexpr int64_t kMaxTopLogits = 256;

// Checks the operands of Backend::top_logits.
inline void check_top_logits(const Tensor& logits, int64_t k, const Tensor& values, const Tensor& ids) {
  MOET_CHECK(logits.shape.size() == 2 && logits.dtype == DType::f32,
             "top_logits: logits must be an F32 [rows, vocab] tensor");
  const int64_t rows = logits.dim(0), vocab = logits.dim(1);
  MOET_CHECK(k >= 1 && k <= std::min(vocab, kMaxTopLogits),
             "top_logits: k must be in [1, {}] for a vocabulary of {} (got {})", std::min(vocab, kMaxTopLogits), vocab, k);
  const std::vector<int64_t> shape = {rows, k};
  MOET_CHECK(values.dtype == DType::f32 && ids.dtype == DType::i32 && values.shape == shape && ids.shape == shape,
             "top_logits: values must be F32 and ids I32, both [{}, {}]", rows, k);
}

// Checks the operands of Backend::logit_confidence.
inline void check_logit_confidence(const Tensor& logits, const Tensor& out) {
  MOET_CHECK(logits.shape.size() == 2 && logits.dtype == DType::f32,
             "logit_confidence: logits must be an F32 [rows, vocab] tensor");
  MOET_CHECK(out.dtype == DType::f32 && out.shape == std::vector<int64_t>({logits.dim(0), 2}),
             "logit_confidence: out must be F32 [{}, 2]", logits.dim(0));
}

// One set of keys of Backend::attention_gather (kernels/cpu/sparse_attention.h): a cache and
// either the positions a tensor lists (I32 [rows, width], -1 = none) or every position j <= the
// row's with (j + 1) % stride == 0 inside the last `window` positions (0: all of them).
struct AttentionKeys {
  KvLayerCache* cache = nullptr;
  const Tensor* positions = nullptr;
  int64_t window = 0;
  int64_t stride = 1;
};

// A hyper-connection's weights and settings (kernels/cpu/hyper_connection.h): fn
// [(2 + hc) * hc, hc * dim] (hc_head: [hc, hc * dim]), base, scale, all F32.
struct HyperConnectionWeights {
  const Tensor* fn = nullptr;
  const Tensor* base = nullptr;
  const Tensor* scale = nullptr;
  int64_t hc = 0;
  int64_t iters = 0;
  float eps = 0.0f;
  float norm_eps = 0.0f;
};

// How Backend::kv_compress builds a compressed KV entry per closed window (kernels/cpu/kv_compress.h).
struct KvCompressOp {
  int64_t ratio = 0;
  bool overlap = false;
  float eps = 0.0f;
  const Tensor* position_bias = nullptr;  // [ratio, coff * dim] F32
  const Tensor* norm = nullptr;           // [dim] F32
  const RopeTable* rope = nullptr;
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual std::string name() const = 0;

  // Copies a checkpoint tensor into backend memory, converting F16 to F32; BF16/F32 stay as is,
  // and U8 planes (quantized expert codes and scales) and I32 tables (hash routing) are copied
  // byte for byte.
  virtual Tensor upload(const HostTensor& info) = 0;
  // Stacks two [n_i, k] weights of one dtype into one [n_a + n_b, k] tensor (BF16, F32 and U8
  // byte planes as they are, other dtypes as F32).
  virtual Tensor upload_stacked(const HostTensor& a, const HostTensor& b) = 0;
  // Uploads a small tensor as F32 whatever its stored dtype (norm weights, biases).
  virtual Tensor upload_f32(const HostTensor& info) = 0;
  // Uninitialised activation memory (F32 unless told; I32 for expert ids).
  virtual Tensor alloc(std::vector<int64_t> shape, DType dtype = DType::f32) = 0;
  // A zeroed KV cache of `blocks` blocks of `block_size` slots laid out as `layout` says
  // (core/paged_kv.h; separate K and V caches need k_dim == v_dim).
  virtual KvLayerCache alloc_kv(int64_t blocks, int64_t block_size, const KvLayout& layout) = 0;
  virtual void to_host(const Tensor& src, void* dst) = 0;
  virtual void from_host(const void* src, Tensor& dst) = 0;
  // Builds the expert table of one MoE layer (once, at load). Every present expert must have
  // `layout`'s format and shapes (and, dense, one dtype); absent ones are allowed.
  virtual ExpertSet expert_set(const ExpertLayout& layout, std::vector<ExpertWeights> experts) = 0;
  // Points entries experts[i] of `set` at weights[i] (ExpertWeights{}: absent), each present one
  // of set.layout; the table stays where it is, so captured graphs read the new entries.
  virtual void expert_set_update(ExpertSet& set, std::span<const int64_t> experts,
                                 std::span<const ExpertWeights> weights) = 0;
  // Memory for `count` experts of `layout` whose host rows are laid out as `row` (W2 or FP4).
  virtual ExpertSlots alloc_expert_slots(const ExpertLayout& layout, const ExpertRowLayout& row, int64_t count) = 0;
  // Loads host rows (pinned memory from alloc_pinned() on CUDA: one batched copy) into slots
  // ids[i], converted to the backend's layout; afterwards slots.weights[ids[i]] is that expert.
  // Returns once the rows have been read (their memory may be reused); the conversion and the
  // steps after it are ordered on the backend's stream.
  virtual void expert_slots_load(ExpertSlots& slots, std::span<const int64_t> ids,
                                 std::span<const uint8_t* const> rows) = 0;
  // Exclusive tiering (an expert in the slots or on the host, never both): out_rows[i] receives
  // slot ids[i]'s expert as a host row (the layout of `row`, as a load reads it), then in_rows[i]
  // is loaded into that slot as expert_slots_load() does. Host rows in alloc_pinned() memory; an
  // out row never overlaps an in row. Returns once every row was read and written.
  virtual void expert_slots_exchange(ExpertSlots& slots, std::span<const int64_t> ids,
                                     std::span<const uint8_t* const> in_rows, std::span<uint8_t* const> out_rows) = 0;
  // Whether the MoE op reaches host-served experts (ExpertSet::host) through their HostMailbox
  // (the op runs away from the host: CUDA) rather than by calling the server.
  virtual bool host_experts_by_mailbox() const { return false; }
  // The same load without waiting (the FP4 tier's manager between steps): the rows must stay
  // valid, and no table may point at the slots, until expert_slots_ready(fence) is true (or
  // expert_slots_wait(fence) returned). Steps enqueued before the call finish reading the slots
  // first. This default loads at once (the CPU); CUDA copies FP4 rows on its copy stream.
  virtual ExpertLoadFence expert_slots_load_async(ExpertSlots& slots, std::span<const int64_t> ids,
                                                  std::span<const uint8_t* const> rows) {
    expert_slots_load(slots, ids, rows);
    return {};
  }
  virtual bool expert_slots_ready(const ExpertLoadFence& fence) {
    (void)fence;
    return true;
  }
  virtual void expert_slots_wait(const ExpertLoadFence& fence) { (void)fence; }
  // Lets `set` hold entries of `tier` (a block format) beside its own (ExpertSet::tier_format),
  // before any step that uses the set is captured.
  virtual void expert_set_add_tier(ExpertSet& set, ExpertFormat tier) = 0;
  // Host memory the backend copies from at full speed (page-locked on CUDA), 4 KiB aligned, not
  // initialised.
  virtual std::shared_ptr<uint8_t> alloc_pinned(size_t bytes) = 0;
  // t = 0 (inside a captured graph too).
  virtual void fill_zero(Tensor& t) = 0;
  // Bytes the backend could still allocate (CUDA: its budget minus what it holds; CPU: the
  // host's available memory).
  virtual uint64_t memory_available() const = 0;

  virtual void begin_step(const StepInputs& step) = 0;
  // out[t, :] = table[step.tokens[t] - first_row, :] when the token is one of the table's rows
  // [first_row, first_row + rows), else zeros (a vocab-parallel rank's part of the embedding; the
  // ranks' rows sum to the whole lookup exactly). A token outside the vocabulary is an error.
  virtual void embedding(const Tensor& table, int64_t first_row, Tensor& out) = 0;
  // Normalises each `dim`-wide group of x (rows of width dim, or per head when dim < cols).
  virtual void rmsnorm(const Tensor& x, const Tensor& weight, float eps, Tensor& out) = 0;
  // The decoder's residual step: residual += delta, then out = rmsnorm(residual) per row (same
  // result as add() then rmsnorm(); out must not alias residual or delta).
  virtual void add_rmsnorm(Tensor& residual, const Tensor& delta, const Tensor& weight, float eps, Tensor& out) = 0;
  // y = x @ w^T (+ bias); w is [n, k] in BF16, F32 or FP8-block (F8_E4M3 with block_scales).
  virtual void matmul(const Tensor& x, const Tensor& w, const Tensor* bias, Tensor& y) = 0;
  // Products of one input: parts[i].y = x @ parts[i].w^T (+ parts[i].bias). The same results as
  // one matmul() per part, which this default makes; the CUDA backend runs up to 4 parts of one
  // weight type as one launch (GQA's q, k and v projections).
  virtual void matmul_group(const Tensor& x, std::span<const MatmulPart> parts) {
    for (const MatmulPart& part : parts) matmul(x, *part.w, part.bias, *part.y);
  }
  virtual void add(Tensor& y, const Tensor& x) = 0;
  virtual void silu_mul(const Tensor& gate_up, Tensor& out) = 0;
  // Rotates x[..., offset : offset + rot_dim] of each of `heads` heads (head_stride apart) of
  // row t by the angle of step.positions[t].
  virtual void rope(const RopeTable& table, Tensor& x, int64_t heads, int64_t head_stride,
                    int64_t offset) = 0;
  // The GQA attention prologue, in place: each head_dim-wide head of q [rows, q_heads * head_dim]
  // and k [rows, k_heads * head_dim] is RMS-normalised with q_norm / k_norm [head_dim] (an empty
  // tensor: no norm), then roped on its first 2 * table.inv_freq.size() values (offset 0). Same
  // result as rmsnorm() per head then rope().
  virtual void qk_norm_rope(const RopeTable& table, Tensor& q, int64_t q_heads, Tensor& k, int64_t k_heads,
                            int64_t head_dim, const Tensor& q_norm, const Tensor& k_norm, float eps) = 0;
  // Writes row t of k (and v) into KV slot step.slots[t], encoded in the cache's dtype.
  virtual void kv_write(KvLayerCache& cache, const Tensor& k, const Tensor* v) = 0;
  // The GQA prologue and KV write as one op: qk_norm_rope(), then row t of the normalised and
  // roped k and of v [rows, k_heads * head_dim] into KV slot step.slots[t] of `cache` (k_heads
  // heads of head_dim, V not aliasing K). Same results (q and k in place, the cache) as the two
  // calls, which this default makes; the CUDA backend runs it as one launch.
  virtual void qk_norm_rope_kv_write(const RopeTable& table, Tensor& q, int64_t q_heads, Tensor& k, int64_t k_heads,
                                     int64_t head_dim, const Tensor& q_norm, const Tensor& k_norm, float eps,
                                     const Tensor& v, KvLayerCache& cache) {
    qk_norm_rope(table, q, q_heads, k, k_heads, head_dim, q_norm, k_norm, eps);
    kv_write(cache, k, &v);
  }
  // Causal attention of the step's rows over the cache (the semantics of kernels/cpu/attention.h).
  virtual void attention(KvLayerCache& cache, const Tensor& q, int64_t q_heads, int64_t q_stride,
                         float scale, Tensor& out) = 0;
  // logits [rows, experts] -> expert_ids [rows, top_k] (I32) and weights [rows, top_k]; both
  // stay in backend memory (the CUDA backend never syncs on routing). A correction bias in
  // `params` points into backend memory.
  virtual void router(const RouterParams& params, const Tensor& logits, Tensor& expert_ids,
                      Tensor& weights) = 0;
  // out = sum over each row's chosen experts of weight * down(silu(gate) * up)(x); rows routed
  // to one expert are gathered and run together; accumulation order is fixed (expert index; in
  // a layer with a tier, the layer format's experts first, then the tier's).
  // A chosen id outside [0, experts) or naming an absent expert contributes nothing (absent ones
  // are recorded in experts.tracking). accumulate: out += the sum, continuing from out's values
  // (so that the experts of a layer run in ascending chunks give the one-run bits).
  virtual void moe_experts(const Tensor& x, const ExpertSet& experts, const Tensor& expert_ids,
                           const Tensor& weights, Tensor& out, bool accumulate = false) = 0;
  // dst[r, dst_offset : +width] = src[r, src_offset : +width] for r < rows, where a row is
  // src_stride / dst_stride 4-byte elements (F32 or I32: copied bit for bit; heads of a [T, H, D]
  // tensor are rows of stride D; an offset may pass a row's end: it counts elements from the start).
  virtual void copy_columns(const Tensor& src, int64_t src_stride, int64_t src_offset, Tensor& dst,
                            int64_t dst_stride, int64_t dst_offset, int64_t rows, int64_t width) = 0;
  // values[r, :] / ids[r, :] = the k best logits of row r of logits [rows, vocab] and their
  // token ids, best first, in the order of kernels/cpu/top_logits.h (ties to the lower id, NaN
  // last), values bit for bit as in the row; 1 <= k <= min(vocab, kMaxTopLogits). The CUDA
  // backend's result is bit-identical to the CPU's and capturable (no host synchronisation).
  virtual void top_logits(const Tensor& logits, int64_t k, Tensor& values, Tensor& ids) = 0;
  // out[r, 0] = the largest softmax probability of row r of logits [rows, vocab] and out[r, 1] =
  // it minus the second largest (the confidence gate's signals, engine/confidence_gate.h), as
  // kernels/cpu/logit_confidence.h computes them (NaN logits have no probability). CUDA: within
  // float rounding of the CPU's, capturable.
  virtual void logit_confidence(const Tensor& logits, Tensor& out) = 0;
  // Per-head matmul: x [rows, heads, x_stride] (first k floats of each head used), w [heads, n, k]
  // -> y [rows, heads, y_stride] (first n floats of each head written).
  virtual void head_matmul(const Tensor& x, int64_t heads, int64_t x_stride, const Tensor& w,
                           Tensor& y, int64_t y_stride) = 0;

  // Ops of GLM-5 (DeepSeek sparse attention) and DeepSeek-V4. The CPU backend implements them;
  // a backend without them fails with a one-line error naming the op.
  // out = LayerNorm(x) per row of weight.numel() values (weight and bias F32).
  virtual void layernorm(const Tensor& x, const Tensor& weight, const Tensor& bias, float eps, Tensor& out) {
    (void)x, (void)weight, (void)bias, (void)eps, (void)out;
    unsupported("layernorm");
  }
  // rope() rotated back: by minus each row's angles.
  virtual void rope_inverse(const RopeTable& table, Tensor& x, int64_t heads, int64_t head_stride, int64_t offset) {
    (void)table, (void)x, (void)heads, (void)head_stride, (void)offset;
    unsupported("rope_inverse");
  }
  // silu_mul() with the gate clamped to at most `limit` and the up value to [-limit, limit].
  virtual void silu_mul_clamped(const Tensor& gate_up, float limit, Tensor& out) {
    (void)gate_up, (void)limit, (void)out;
    unsupported("silu_mul_clamped");
  }
  // Attention of the step's rows over the union of `sources` (kernels/cpu/sparse_attention.h);
  // sinks: F32 [q_heads] or null.
  virtual void attention_gather(std::span<const AttentionKeys> sources, const Tensor& q, int64_t q_heads,
                                int64_t q_stride, float scale, const Tensor* sinks, Tensor& out) {
    (void)sources, (void)q, (void)q_heads, (void)q_stride, (void)scale, (void)sinks, (void)out;
    unsupported("attention_gather");
  }
  // The lightning indexer's choice (kernels/cpu/sparse_attention.h): q [rows, heads, dim], weights
  // [rows, heads], positions I32 [rows, k].
  virtual void indexer_topk(KvLayerCache& keys, const Tensor& q, int64_t heads, const Tensor& weights, float scale,
                            int64_t stride, Tensor& positions) {
    (void)keys, (void)q, (void)heads, (void)weights, (void)scale, (void)stride, (void)positions;
    unsupported("indexer_topk");
  }
  // Compressed KV entries of the windows the step's rows close (kernels/cpu/kv_compress.h).
  virtual void kv_compress(const KvCompressOp& op, KvLayerCache& state, KvLayerCache& out) {
    (void)op, (void)state, (void)out;
    unsupported("kv_compress");
  }
  // Hyper-connections (kernels/cpu/hyper_connection.h): streams [rows, hc, dim].
  virtual void hc_pre(const HyperConnectionWeights& w, const Tensor& streams, Tensor& post, Tensor& comb,
                      Tensor& collapsed) {
    (void)w, (void)streams, (void)post, (void)comb, (void)collapsed;
    unsupported("hc_pre");
  }
  virtual void hc_post(const HyperConnectionWeights& w, Tensor& streams, const Tensor& block_out, const Tensor& post,
                       const Tensor& comb) {
    (void)w, (void)streams, (void)block_out, (void)post, (void)comb;
    unsupported("hc_post");
  }
  virtual void hc_head(const HyperConnectionWeights& w, const Tensor& streams, Tensor& out) {
    (void)w, (void)streams, (void)out;
    unsupported("hc_head");
  }
  // Hash routing (kernels/cpu/router.h router_hash): experts from table [vocab, top_k] (I32) at the
  // step's tokens, weights from the logits' sqrtsoftplus scores.
  virtual void router_hash(const RouterParams& params, const Tensor& logits, const Tensor& table, Tensor& expert_ids,
                           Tensor& weights) {
    (void)params, (void)logits, (void)table, (void)expert_ids, (void)weights;
    unsupported("router_hash");
  }

  // Runs a forward after begin_step(): body() enqueues its ops and returns the output tensor.
  // With graphs on, the CUDA backend captures the work body() enqueues the first time it sees
  // `key` with the current step layout (the returned tensor then lives in memory the graph owns)
  // and later replays it without calling body(); the caller copies the output with to_host()
  // before the next forward. body() must be replay-safe (docs/design.md, "CUDA graphs"): no host
  // value that changes between steps of one key may reach a launch. Other backends, and CUDA
  // with graphs off, call body() every time.
  virtual Tensor run_graph(const GraphKey& key, const std::function<Tensor()>& body) {
    (void)key;
    return body();
  }
  // Turns graph capture/replay on or off; returns whether it is on now (false: not supported).
  virtual bool set_graphs(bool enabled) {
    (void)enabled;
    return false;
  }
  virtual bool graphs() const { return false; }
  virtual GraphStats graph_stats() const { return {}; }
  // Destroys every captured graph (their memory goes back to the backend's cache).
  virtual void clear_graphs() {}

 protected:
  [[noreturn]] void unsupported(const char* op) const {
    fail("the {} backend has no {} op yet (GLM-5 / DeepSeek-V4 run on --device cpu)", name(), op);
  }
};

}  // namespace moet
