// The CUDA kernels of GLM-5 / DeepSeek-V4 (kernels/cuda/sparse_ops.h, the sqrtsoftplus router)
// against the CPU backend, the reference: attention over chosen keys (position lists with holes,
// a sliding window, strided entries, sinks; a bf16 cache too), the lightning indexer's choice
// (exact positions), the KV compressor (both window kinds, the entries' slots), hyper-connections,
// rope with pairs in place and every inverse, LayerNorm, the SwiGLU clamp, sqrtsoftplus and hash
// routing; and a step's attention_gather run twice is bit-identical. Skips when no GPU is visible.
#include "gpu_test_util.h"

#include "kv/kv_cache.h"

namespace moet::test {
namespace {

constexpr double kTol = 2e-5;

// One sequence of `rows` tokens at positions 0.., blocks of 4 out of order, every row a query.
struct Step {
  std::vector<int32_t> tokens, positions, row_seq, table;
  std::vector<int64_t> slots;
  const int32_t* tables[1];
  explicit Step(int32_t rows) {
    for (int32_t b = 0; b < (rows + 3) / 4; ++b) table.push_back((b * 5 + 3) % ((rows + 3) / 4 + 2));
    for (int32_t t = 0; t < rows; ++t) {
      tokens.push_back(t % 7);
      positions.push_back(t);
      row_seq.push_back(0);
      slots.push_back(int64_t(table[size_t(t / 4)]) * 4 + t % 4);
    }
    tables[0] = table.data();
  }
  StepInputs inputs() const {
    return {int64_t(tokens.size()), tokens.data(), positions.data(), row_seq.data(), slots.data(), 1, tables, 4, 0};
  }
  int64_t blocks() const { return *std::max_element(table.begin(), table.end()) + 1; }
};

// A latent cache (one row of dim per slot) in both backends holding the same random rows.
std::pair<KvLayerCache, KvLayerCache> latent_cache(BackendPair& p, const Step& step, int64_t dim, KvDtype dtype,
                                                   uint64_t seed) {
  const KvLayout layout{dtype, 1, dim, dim, true};
  std::pair<KvLayerCache, KvLayerCache> c{p.cpu->alloc_kv(step.blocks(), 4, layout),
                                          p.gpu->alloc_kv(step.blocks(), 4, layout)};
  const int64_t rows_n = int64_t(step.tokens.size());
  auto rows = p.activation(random_floats(size_t(rows_n * dim), seed), {rows_n, dim});
  p.cpu->kv_write(c.first, rows.first, nullptr);
  p.gpu->kv_write(c.second, rows.second, nullptr);
  return c;
}

TEST(CudaSparseOps, AttentionGatherMatchesCpu) {
  MOET_SKIP_WITHOUT_GPU();
  BackendPair p;
  const Step step(23);
  const int64_t rows = 23, heads = 4, dim = 64, width = 5;
  p.begin_step(step.inputs());
  for (KvDtype dtype : {KvDtype::f32, KvDtype::bf16}) {
    auto a = latent_cache(p, step, dim, dtype, 1), b = latent_cache(p, step, dim, dtype, 2);
    std::vector<int32_t> lists(size_t(rows * width));
    for (int64_t t = 0; t < rows; ++t)
      for (int64_t i = 0; i < width; ++i) lists[size_t(t * width + i)] = int32_t((t * 7 + i * 5) % (t + 3)) - 1;
    auto list = p.alloc({rows, width}, DType::i32);
    p.cpu->from_host(lists.data(), list.first);
    p.gpu->from_host(lists.data(), list.second);
    auto q = p.activation(random_floats(size_t(rows * heads * dim), 3), {rows, heads, dim});
    auto sinks = p.activation(random_floats(size_t(heads), 4), {heads});
    auto out = p.alloc({rows, heads, dim});
    const AttentionKeys cpu_keys[] = {{&a.first, nullptr, 6, 1}, {&b.first, &list.first, 0, 1},
                                      {&b.first, nullptr, 0, 4}};
    const AttentionKeys gpu_keys[] = {{&a.second, nullptr, 6, 1}, {&b.second, &list.second, 0, 1},
                                      {&b.second, nullptr, 0, 4}};
    p.cpu->attention_gather(cpu_keys, q.first, heads, dim, 0.2f, &sinks.first, out.first);
    p.gpu->attention_gather(gpu_keys, q.second, heads, dim, 0.2f, &sinks.second, out.second);
    EXPECT_LT(max_rel_diff(p, out), kTol) << "dtype " << kv_dtype_name(dtype);
    auto again = p.alloc({rows, heads, dim});
    p.gpu->attention_gather(gpu_keys, q.second, heads, dim, 0.2f, &sinks.second, again.second);
    const auto x = host(*p.gpu, out.second), y = host(*p.gpu, again.second);
    EXPECT_EQ(std::memcmp(x.data(), y.data(), x.size() * sizeof(float)), 0);
  }
}

TEST(CudaSparseOps, IndexerChoosesTheCpusKeys) {
  MOET_SKIP_WITHOUT_GPU();
  BackendPair p;
  const Step step(40);
  const int64_t rows = 40, heads = 8, dim = 32, k = 6;
  p.begin_step(step.inputs());
  for (int64_t stride : {1, 4}) {
    auto keys = latent_cache(p, step, dim, KvDtype::bf16, 10 + uint64_t(stride));
    auto q = p.activation(random_floats(size_t(rows * heads * dim), 11), {rows, heads * dim});
    auto w = p.activation(random_floats(size_t(rows * heads), 12), {rows, heads});
    auto out = p.alloc({rows, k}, DType::i32);
    p.cpu->indexer_topk(keys.first, q.first, heads, w.first, 0.18f, stride, out.first);
    p.gpu->indexer_topk(keys.second, q.second, heads, w.second, 0.18f, stride, out.second);
    EXPECT_EQ(host<int32_t>(*p.cpu, out.first), host<int32_t>(*p.gpu, out.second)) << "stride " << stride;
  }
}

TEST(CudaSparseOps, KvCompressMatchesCpu) {
  MOET_SKIP_WITHOUT_GPU();
  BackendPair p;
  const Step step(17);
  const int64_t dim = 64, ratio = 4;
  p.begin_step(step.inputs());
  RopeTable rope;
  rope.inv_freq = {0.5f, 0.05f, 0.005f, 0.0005f};
  rope.interleaved = rope.pairs_in_place = true;
  for (bool overlap : {false, true}) {
    const int64_t width = (overlap ? 2 : 1) * dim;
    auto state = latent_cache(p, step, 2 * width, KvDtype::f32, 20);
    const KvLayout out_layout{KvDtype::f32, 1, dim, dim, true};
    std::pair<KvLayerCache, KvLayerCache> out{p.cpu->alloc_kv(step.blocks(), 4, out_layout),
                                              p.gpu->alloc_kv(step.blocks(), 4, out_layout)};
    auto bias = p.activation(random_floats(size_t(ratio * width), 21), {ratio, width});
    auto norm = p.activation(random_floats(size_t(dim), 22), {dim});
    p.cpu->kv_compress({ratio, overlap, 1e-6f, &bias.first, &norm.first, &rope}, state.first, out.first);
    p.gpu->kv_compress({ratio, overlap, 1e-6f, &bias.second, &norm.second, &rope}, state.second, out.second);
    EXPECT_LT(max_rel_diff(p, {out.first.k, out.second.k}), kTol) << "overlap " << overlap;
  }
}

TEST(CudaSparseOps, HyperConnectionsMatchCpu) {
  MOET_SKIP_WITHOUT_GPU();
  BackendPair p;
  const int64_t rows = 3, hc = 4, dim = 96, mixes = (2 + hc) * hc;
  auto streams = p.activation(random_floats(size_t(rows * hc * dim), 30), {rows, hc, dim});
  auto fn = p.activation(random_floats(size_t(mixes * hc * dim), 31, 0.2f), {mixes, hc * dim});
  auto base = p.activation(random_floats(size_t(mixes), 32, 0.1f), {mixes});
  const std::vector<float> scales = {1.1f, 0.9f, 1.3f};
  auto scale = p.activation(scales, {3});
  const HyperConnectionWeights cpu_w{&fn.first, &base.first, &scale.first, hc, 20, 1e-6f, 1e-6f};
  const HyperConnectionWeights gpu_w{&fn.second, &base.second, &scale.second, hc, 20, 1e-6f, 1e-6f};
  auto post = p.alloc({rows, hc}), comb = p.alloc({rows, hc, hc}), collapsed = p.alloc({rows, dim});
  p.cpu->hc_pre(cpu_w, streams.first, post.first, comb.first, collapsed.first);
  p.gpu->hc_pre(gpu_w, streams.second, post.second, comb.second, collapsed.second);
  EXPECT_LT(max_rel_diff(p, post), kTol);
  EXPECT_LT(max_rel_diff(p, comb), kTol);
  EXPECT_LT(max_rel_diff(p, collapsed), kTol);
  auto block = p.activation(random_floats(size_t(rows * dim), 33), {rows, dim});
  p.cpu->hc_post(cpu_w, streams.first, block.first, post.first, comb.first);
  p.gpu->hc_post(gpu_w, streams.second, block.second, post.second, comb.second);
  EXPECT_LT(max_rel_diff(p, streams), kTol);
  auto head = p.alloc({rows, dim});
  p.cpu->hc_head(cpu_w, streams.first, head.first);
  p.gpu->hc_head(gpu_w, streams.second, head.second);
  EXPECT_LT(max_rel_diff(p, head), kTol);
}

TEST(CudaSparseOps, RopeLayerNormClampAndRoutersMatchCpu) {
  MOET_SKIP_WITHOUT_GPU();
  BackendPair p;
  const Step step(5);
  const int64_t rows = 5;
  p.begin_step(step.inputs());
  for (const auto& [interleaved, in_place] : {std::pair{false, false}, std::pair{true, false}, std::pair{true, true}}) {
    RopeTable table;
    table.inv_freq = {1.0f, 0.3f, 0.01f};
    table.interleaved = interleaved;
    table.pairs_in_place = in_place;
    auto x = p.activation(random_floats(size_t(rows * 2 * 10), 40), {rows, 20});
    p.cpu->rope(table, x.first, 2, 10, 3);
    p.gpu->rope(table, x.second, 2, 10, 3);
    EXPECT_LT(max_rel_diff(p, x), kTol) << interleaved << in_place;
    p.cpu->rope_inverse(table, x.first, 2, 10, 3);
    p.gpu->rope_inverse(table, x.second, 2, 10, 3);
    EXPECT_LT(max_rel_diff(p, x), kTol) << "inverse " << interleaved << in_place;
  }
  auto x = p.activation(random_floats(size_t(rows * 48), 41, 3.0f), {rows, 48});
  auto w = p.activation(random_floats(48, 42), {48});
  auto b = p.activation(random_floats(48, 43), {48});
  auto y = p.alloc({rows, 48});
  p.cpu->layernorm(x.first, w.first, b.first, 1e-6f, y.first);
  p.gpu->layernorm(x.second, w.second, b.second, 1e-6f, y.second);
  EXPECT_LT(max_rel_diff(p, y), kTol);
  auto act = p.alloc({rows, 24});
  p.cpu->silu_mul_clamped(x.first, 1.5f, act.first);
  p.gpu->silu_mul_clamped(x.second, 1.5f, act.second);
  EXPECT_LT(max_rel_diff(p, act), kTol);
  const int64_t experts = 16, top_k = 3;
  auto logits = p.activation(random_floats(size_t(rows * experts), 44, 2.0f), {rows, experts});
  auto bias = p.activation(random_floats(size_t(experts), 45, 0.3f), {experts});
  auto ids = p.alloc({rows, top_k}, DType::i32);
  auto weights = p.alloc({rows, top_k});
  const RouterParams cpu_params{experts, top_k, false, true, 1.5f, 1, 1, bias.first.as<float>(), true};
  const RouterParams gpu_params{experts, top_k, false, true, 1.5f, 1, 1, bias.second.as<float>(), true};
  p.cpu->router(cpu_params, logits.first, ids.first, weights.first);
  p.gpu->router(gpu_params, logits.second, ids.second, weights.second);
  EXPECT_EQ(host<int32_t>(*p.cpu, ids.first), host<int32_t>(*p.gpu, ids.second));
  EXPECT_LT(max_rel_diff(p, weights), kTol);
  std::vector<int32_t> table_values(size_t(7 * top_k));
  for (size_t i = 0; i < table_values.size(); ++i) table_values[i] = int32_t((i * 5 + 1) % size_t(experts));
  auto table = p.weight(table_values.data(), DType::i32, {7, top_k});
  p.cpu->router_hash(cpu_params, logits.first, table.first, ids.first, weights.first);
  p.gpu->router_hash(gpu_params, logits.second, table.second, ids.second, weights.second);
  EXPECT_EQ(host<int32_t>(*p.cpu, ids.first), host<int32_t>(*p.gpu, ids.second));
  EXPECT_LT(max_rel_diff(p, weights), kTol);
}

}  // namespace
}  // namespace moet::test
