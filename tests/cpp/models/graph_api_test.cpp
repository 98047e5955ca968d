// The captured-forward API (Backend::run_graph) and the per-op profile on the CPU backend, which
// has no graphs: run_graph() calls the body every time and returns its tensor; decode steps under
// a graph key (ForwardBatch::graph, the graph path on CUDA) give the same logits as ones without;
// profiling names the outermost ops and never changes results.
#include "../cpu_isa_env.h"
#include "backend/bench_ops.h"
#include "backend/cpu/cpu_backend.h"
#include "io/checkpoint.h"
#include "models/model.h"

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <cstring>
#include <map>

namespace moet {
namespace {

const std::filesystem::path kFixtures = std::filesystem::path(MOET_SOURCE_DIR) / "tests" / "fixtures";

TEST(GraphApi, CpuRunsTheBodyEveryTime) {
  auto backend = cpu_backend_create({1, test_cpu_isa()});
  EXPECT_FALSE(backend->set_graphs(true));
  EXPECT_FALSE(backend->graphs());
  GraphKey key{{1, 2, 3}};
  int calls = 0;
  for (int i = 0; i < 3; ++i) {
    const Tensor t = backend->run_graph(key, [&] {
      ++calls;
      Tensor out = backend->alloc({1});
      const float value = float(i);
      backend->from_host(&value, out);
      return out;
    });
    float got = -1.0f;
    backend->to_host(t, &got);
    EXPECT_EQ(got, float(i));
  }
  EXPECT_EQ(calls, 3);
  const GraphStats stats = backend->graph_stats();
  EXPECT_EQ(stats.captures + stats.replays + stats.failures + stats.cached, 0);
  backend->clear_graphs();  // a no-op
}

TEST(GraphApi, KeysCompareByValue) {
  const GraphKey a{{1, 2}}, b{{1, 2}}, c{{1, 3}}, d{{1, 2, 0}};
  EXPECT_EQ(a, b);
  EXPECT_NE(a, c);
  EXPECT_LT(a, d);
}

struct Decoded {
  std::vector<std::vector<float>> logits;  // prefill's last row, then every decode step's
};

// Prefill of `prompt` then `steps` greedy decode steps straight through Model::forward, each
// decode step under a graph key (the CUDA graph path) or none.
Decoded run(Model& model, const std::vector<int32_t>& prompt, int64_t steps, bool graph_keys) {
  const int64_t block_size = 4, tokens_max = int64_t(prompt.size()) + steps;
  KvCache cache = kv_cache_create(model.backend(), model.kv_layer_specs(), (tokens_max + 3) / 4, block_size);
  std::vector<int32_t> table(size_t(cache.blocks));
  for (size_t i = 0; i < table.size(); ++i) table[i] = int32_t(i);
  const GraphKey key{{42}};
  const auto forward = [&](const std::vector<int32_t>& tokens, int64_t begin, int64_t end, bool decode) {
    ForwardBatch batch;
    for (int64_t pos = begin; pos < end; ++pos) {
      batch.tokens.push_back(tokens[size_t(pos)]);
      batch.positions.push_back(int32_t(pos));
      batch.row_seq.push_back(0);
      batch.slots.push_back(pos);
    }
    batch.block_tables.push_back(table.data());
    batch.logit_rows = {int32_t(end - begin - 1)};
    batch.graph = decode && graph_keys ? &key : nullptr;
    return model.forward(batch, cache).logits;
  };
  std::vector<int32_t> tokens = prompt;
  Decoded out;
  out.logits.push_back(forward(tokens, 0, int64_t(tokens.size()), false));
  const int64_t vocab = model.config().vocab_size;
  for (int64_t i = 0; i < steps; ++i) {
    const auto& last = out.logits.back();
    tokens.push_back(int32_t(std::max_element(last.begin(), last.end()) - last.begin()));
    const int64_t pos = int64_t(tokens.size()) - 1;
    out.logits.push_back(forward(tokens, pos, pos + 1, true));
    EXPECT_EQ(int64_t(out.logits.back().size()), vocab);
  }
  return out;
}

TEST(GraphApi, DecodeStepsGiveTheSameLogitsOnCpu) {
  const Checkpoint checkpoint = Checkpoint::open(kFixtures / "qwen3_moe");
  auto backend = cpu_backend_create({2, test_cpu_isa()});
  auto model = model_load(checkpoint, *backend);
  const std::vector<int32_t> prompt = {3, 17, 42, 99, 7, 250, 11};
  const Decoded marked = run(*model, prompt, 10, true), plain = run(*model, prompt, 10, false);
  ASSERT_EQ(marked.logits.size(), plain.logits.size());
  for (size_t i = 0; i < marked.logits.size(); ++i)
    EXPECT_EQ(0, std::memcmp(marked.logits[i].data(), plain.logits[i].data(), plain.logits[i].size() * sizeof(float)))
        << "step " << i;
}

TEST(GraphApi, CpuProfileNamesOpsAndKeepsResults) {
  const Checkpoint checkpoint = Checkpoint::open(kFixtures / "qwen3_moe");
  auto backend = cpu_backend_create({2, test_cpu_isa()});
  auto model = model_load(checkpoint, *backend);
  const std::vector<int32_t> prompt = {3, 17, 42, 99, 7};
  const Decoded plain = run(*model, prompt, 2, true);
  BenchOps& ops_api = bench_ops(*backend);
  EXPECT_TRUE(ops_api.take_profile().empty());  // off by default
  ops_api.set_profiling(true);
  const Decoded profiled = run(*model, prompt, 2, true);
  ops_api.set_profiling(false);
  for (size_t i = 0; i < plain.logits.size(); ++i)
    EXPECT_EQ(0, std::memcmp(plain.logits[i].data(), profiled.logits[i].data(), plain.logits[i].size() * sizeof(float)));
  const std::vector<OpProfile> ops = ops_api.take_profile();
  std::map<std::string, OpProfile> by_name;
  for (const OpProfile& op : ops) by_name[op.op] = op;
  const ModelConfig& c = model->config();
  const int64_t forwards = 3;  // prefill + 2 decode steps
  EXPECT_EQ(by_name["attention"].calls, forwards * c.num_hidden_layers);
  EXPECT_EQ(by_name["embedding"].calls, forwards);
  EXPECT_EQ(by_name[fmt::format("matmul[n={},k={}]", c.vocab_size, c.hidden_size)].calls, forwards);
  // qwen3_moe: layers 0 and 2 are MoE (layer 1 is a dense MLP); the experts' own products inside
  // moe_experts are not counted separately.
  EXPECT_EQ(by_name["moe_experts"].calls, forwards * 2);
  EXPECT_EQ(by_name["silu_mul"].calls, forwards * 1);
  for (size_t i = 1; i < ops.size(); ++i) EXPECT_GE(ops[i - 1].seconds, ops[i].seconds);
  EXPECT_TRUE(ops_api.take_profile().empty());
}

}  // namespace
}  // namespace moet
