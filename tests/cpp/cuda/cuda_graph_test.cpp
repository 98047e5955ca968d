// CUDA graphs: decode steps replayed from captured graphs give logits bit-identical to the same
// steps run eagerly (a second backend with graphs off), for batch 1 and a batch of 3 sequences
// with scattered block tables, over consecutive steps whose positions cross KV block boundaries
// and whose contexts grow past two table-stride buckets (block size 4: 3 -> 5 -> 9 blocks, so
// graphs for strides 4, 8 and 16; the first two replayed on later steps). Also the graph bookkeeping
// (captures, replays, no failures), the per-op profile not changing results, and the memory a
// graph owns surviving other allocations. Decode steps asking for the best k logits per row (k
// alternating between 1 and 50) replay bit-identically too, and give the best k of the step's
// whole logits. A step the runner's hook replays (the second pass a graph replay) gives the
// single pass's bits. Every step goes through a StepRunner. Skips with a message when no GPU is
// visible.
#include "gpu_test_util.h"

#include "backend/bench_ops.h"
#include "engine/sampler.h"
#include "engine/sequence_batch.h"
#include "engine/step_runner.h"
#include "kernels/cpu/top_logits.h"
#include "io/checkpoint.h"

#include <fmt/format.h>

#include <nlohmann/json.hpp>

#include <filesystem>
#include <map>
#include <numeric>

namespace moet::test {
namespace {

const std::filesystem::path kFixtures = std::filesystem::path(MOET_SOURCE_DIR) / "tests" / "fixtures";
constexpr int64_t kBlockSize = 4;

// A step of the sequences listed: each from its first uncomputed token to its last known one,
// returning the last row's logits (the best `top` of them when top > 0).
StepPlan plan_of(std::vector<Sequence>& seqs, const std::vector<size_t>& which, int64_t top = 0) {
  StepPlan plan;
  for (size_t s : which) {
    Sequence& seq = seqs[s];
    plan.chunks.push_back({&seq, seq.num_computed, int64_t(seq.tokens.size()) - seq.num_computed, ChunkRows::last});
    plan.num_tokens += plan.chunks.back().count;
  }
  plan.top_logits = top;
  return plan;
}

struct GraphCase {
  std::string fixture;
  int batch;
};

class CudaGraphs : public ::testing::TestWithParam<GraphCase> {};

TEST_P(CudaGraphs, ReplayMatchesEagerBitForBit) {
  MOET_SKIP_WITHOUT_GPU();
  const GraphCase c = GetParam();
  const auto dir = kFixtures / c.fixture;
  const nlohmann::json golden = json_read_file(dir / "golden_w2.json");
  const auto prompt = golden["prompt_ids"].get<std::vector<int32_t>>();
  ASSERT_GE(prompt.size(), 8u);
  const Checkpoint checkpoint = Checkpoint::open(dir);
  auto graph_backend = cuda_backend_create({0, 0.9, 0.0, true});
  auto eager_backend = cuda_backend_create({0, 0.9, 0.0, false});
  ASSERT_TRUE(graph_backend->graphs());
  ASSERT_FALSE(eager_backend->graphs());
  auto graph_model = model_load(checkpoint, *graph_backend);  // W2 experts (the default)
  auto eager_model = model_load(checkpoint, *eager_backend);
  const int64_t vocab = graph_model->config().vocab_size;

  // Sequence 0: the first 8 prompt tokens; 1 and 2: shorter prefixes. Scattered, interleaved blocks.
  const int64_t steps = 25, blocks_per_seq = (8 + steps + kBlockSize - 1) / kBlockSize;
  std::vector<Sequence> seqs(size_t(c.batch));
  const size_t prefix[] = {8, 5, 2};
  for (size_t s = 0; s < seqs.size(); ++s) {
    seqs[s].tokens.assign(prompt.begin(), prompt.begin() + long(prefix[s]));
    for (int64_t b = 0; b < blocks_per_seq; ++b)
      seqs[s].blocks.push_back(int32_t((blocks_per_seq - 1 - b) * c.batch + int64_t(s)));
  }
  const int64_t blocks = blocks_per_seq * c.batch;
  StepRunner graph_runner(*graph_model, blocks, kBlockSize), eager_runner(*eager_model, blocks, kBlockSize);

  // Prefill each sequence eagerly on both backends.
  for (size_t s = 0; s < seqs.size(); ++s) {
    const StepPlan plan = plan_of(seqs, {s});
    const auto a = graph_runner.run(plan).output.logits, b = eager_runner.run(plan).output.logits;
    ASSERT_EQ(0, std::memcmp(a.data(), b.data(), a.size() * sizeof(float))) << "prefill of sequence " << s;
    seqs[s].num_computed = int64_t(seqs[s].tokens.size());
    seqs[s].tokens.push_back(argmax(b.data(), vocab));
  }
  std::vector<size_t> all(seqs.size());
  std::iota(all.begin(), all.end(), size_t(0));
  for (int64_t step = 0; step < steps; ++step) {
    for (Sequence& seq : seqs) seq.num_computed = int64_t(seq.tokens.size()) - 1;
    const StepPlan plan = plan_of(seqs, all);
    const auto replayed = graph_runner.run(plan).output.logits;
    const auto eager = eager_runner.run(plan).output.logits;
    ASSERT_EQ(replayed.size(), eager.size());
    ASSERT_EQ(0, std::memcmp(replayed.data(), eager.data(), eager.size() * sizeof(float)))
        << c.fixture << " batch " << c.batch << " step " << step << " (longest context "
        << seqs[0].tokens.size() << ")";
    for (size_t s = 0; s < seqs.size(); ++s) seqs[s].tokens.push_back(argmax(eager.data() + s * size_t(vocab), vocab));
  }
  // Longest context 9 .. 33 keys: 3 .. 9 blocks of 4, table strides 4, 8, 16.
  const GraphStats stats = graph_backend->graph_stats();
  EXPECT_EQ(stats.failures, 0);
  EXPECT_EQ(stats.captures, 3);
  EXPECT_EQ(stats.replays, steps - 3);
  EXPECT_EQ(stats.cached, 3);
  EXPECT_EQ(eager_backend->graph_stats().captures, 0);
}

std::vector<GraphCase> graph_cases() {
  std::vector<GraphCase> cases;
  for (const char* fixture : {"qwen3_moe", "deepseek_v3", "glm4_moe", "mixtral"})
    for (int batch : {1, 3}) cases.push_back({fixture, batch});
  return cases;
}

INSTANTIATE_TEST_SUITE_P(Fixtures, CudaGraphs, ::testing::ValuesIn(graph_cases()),
                         [](const ::testing::TestParamInfo<GraphCase>& info) {
                           return info.param.fixture + "_batch" + std::to_string(info.param.batch);
                         });

TEST(CudaGraphTopLogits, ReplayMatchesEagerAndTheWholeLogits) {
  MOET_SKIP_WITHOUT_GPU();
  const auto dir = kFixtures / "qwen3_moe";
  const auto prompt = json_read_file(dir / "golden_w2.json")["prompt_ids"].get<std::vector<int32_t>>();
  ASSERT_GE(prompt.size(), 8u);
  const Checkpoint checkpoint = Checkpoint::open(dir);
  auto graph_backend = cuda_backend_create({0, 0.9, 0.0, true});
  auto eager_backend = cuda_backend_create({0, 0.9, 0.0, false});
  auto graph_model = model_load(checkpoint, *graph_backend);
  auto eager_model = model_load(checkpoint, *eager_backend);
  const int64_t vocab = graph_model->config().vocab_size, steps = 12, batch = 3;
  const int64_t blocks_per_seq = (8 + steps + kBlockSize - 1) / kBlockSize;
  std::vector<Sequence> seqs(static_cast<size_t>(batch));
  const size_t prefix[] = {8, 5, 2};
  for (size_t s = 0; s < seqs.size(); ++s) {
    seqs[s].tokens.assign(prompt.begin(), prompt.begin() + long(prefix[s]));
    for (int64_t b = 0; b < blocks_per_seq; ++b) seqs[s].blocks.push_back(int32_t(b * batch + int64_t(s)));
  }
  StepRunner graph_runner(*graph_model, blocks_per_seq * batch, kBlockSize);
  StepRunner eager_runner(*eager_model, blocks_per_seq * batch, kBlockSize);
  for (size_t s = 0; s < seqs.size(); ++s) {
    const StepPlan prefill = plan_of(seqs, {s});
    graph_runner.run(prefill);
    const auto logits = eager_runner.run(prefill).output.logits;
    seqs[s].num_computed = int64_t(seqs[s].tokens.size());
    seqs[s].tokens.push_back(argmax(logits.data(), vocab));
  }
  for (int64_t step = 0; step < steps; ++step) {
    const int64_t k = step % 2 ? 50 : 1;
    for (Sequence& seq : seqs) seq.num_computed = int64_t(seq.tokens.size()) - 1;
    const TopLogits replayed = graph_runner.run(plan_of(seqs, {0, 1, 2}, k)).output.top;
    const auto logits = eager_runner.run(plan_of(seqs, {0, 1, 2})).output.logits;  // rewrites the same K/V
    const TopLogits eager = eager_runner.run(plan_of(seqs, {0, 1, 2}, k)).output.top;
    ASSERT_EQ(replayed.ids, eager.ids) << "step " << step << " k " << k;
    ASSERT_EQ(0, std::memcmp(replayed.values.data(), eager.values.data(), eager.values.size() * sizeof(float)));
    std::vector<float> values(static_cast<size_t>(batch * k));
    std::vector<int32_t> ids(static_cast<size_t>(batch * k));
    top_logits(logits.data(), batch, vocab, k, values.data(), ids.data());
    ASSERT_EQ(eager.ids, ids) << "step " << step << " k " << k;
    ASSERT_EQ(0, std::memcmp(eager.values.data(), values.data(), values.size() * sizeof(float)));
    for (size_t s = 0; s < seqs.size(); ++s) seqs[s].tokens.push_back(eager.ids[s * size_t(k)]);
  }
  const GraphStats stats = graph_backend->graph_stats();
  EXPECT_EQ(stats.failures, 0);
  EXPECT_GE(stats.captures, 2);  // one per width at least
  EXPECT_EQ(stats.captures + stats.replays, steps);
  EXPECT_GE(stats.replays, steps / 2);
}

// Memory a graph owns is not handed out again: after a capture, eager allocations of the same
// sizes and garbage written into them leave the next replay's logits unchanged.
TEST(CudaGraphMemory, GraphMemoryIsNotReused) {
  MOET_SKIP_WITHOUT_GPU();
  const Checkpoint checkpoint = Checkpoint::open(kFixtures / "qwen3_moe");
  auto gpu = cuda_backend_create({});
  auto model = model_load(checkpoint, *gpu);
  const std::vector<int32_t> prompt = {3, 17, 42, 99, 7, 250};
  SequenceBatch sequence(*model, 1, int64_t(prompt.size()) + 2, kBlockSize);
  sequence.sequence(0).tokens = prompt;
  sequence.run_rows(0, 0, int64_t(prompt.size()) - 1, ChunkRows::none);
  const int64_t pos = int64_t(prompt.size()) - 1;
  const auto first = sequence.decode(pos).output.logits;  // capture
  ASSERT_EQ(gpu->graph_stats().captures, 1);
  std::vector<Tensor> hogs;
  for (int64_t n : {64, 128, 512, 2048, 4096, 16384}) {
    for (int i = 0; i < 32; ++i) {
      Tensor t = gpu->alloc({n});
      const std::vector<float> junk(size_t(n), 1e30f);
      gpu->from_host(junk.data(), t);
      hogs.push_back(t);
    }
  }
  const auto again = sequence.decode(pos).output.logits;  // replay
  ASSERT_EQ(gpu->graph_stats().replays, 1);
  EXPECT_EQ(0, std::memcmp(first.data(), again.data(), first.size() * sizeof(float)));
}

// The per-op profile (eager steps) leaves results bit-identical and names the ops; a replayed
// graph counts as one op.
TEST(CudaProfile, ProfileNamesOpsAndKeepsResults) {
  MOET_SKIP_WITHOUT_GPU();
  const Checkpoint checkpoint = Checkpoint::open(kFixtures / "qwen3_moe");
  auto gpu = cuda_backend_create({0, 0.9, 0.0, false});
  auto model = model_load(checkpoint, *gpu);
  const std::vector<int32_t> prompt = {3, 17, 42, 99, 7, 250};
  SequenceBatch sequence(*model, 1, int64_t(prompt.size()), kBlockSize);
  sequence.sequence(0).tokens = prompt;
  sequence.run_rows(0, 0, int64_t(prompt.size()) - 1, ChunkRows::none);
  const int64_t pos = int64_t(prompt.size()) - 1;
  const auto plain = sequence.decode(pos).output.logits;
  BenchOps& ops_api = bench_ops(*gpu);
  ops_api.set_profiling(true);
  const auto profiled = sequence.decode(pos).output.logits;
  const std::vector<OpProfile> ops = ops_api.take_profile();
  EXPECT_EQ(0, std::memcmp(plain.data(), profiled.data(), plain.size() * sizeof(float)));
  const int64_t layers = model->config().num_hidden_layers, vocab = model->config().vocab_size,
                hidden = model->config().hidden_size;
  std::map<std::string, OpProfile> by_name;
  for (const OpProfile& op : ops) {
    by_name[op.op] = op;
    EXPECT_GE(op.seconds, 0.0) << op.op;
  }
  EXPECT_EQ(by_name["attention"].calls, layers);
  EXPECT_EQ(by_name[fmt::format("matmul[n={},k={}]", vocab, hidden)].calls, 1);
  EXPECT_EQ(by_name["step_upload"].calls, 1);
  EXPECT_GE(by_name["moe_experts"].calls, 1);
  EXPECT_TRUE(ops_api.take_profile().empty());
  // With graphs on, the replay is one op.
  gpu->set_graphs(true);
  sequence.decode(pos);  // capture
  sequence.decode(pos);  // replay
  ops_api.set_profiling(false);
  bool graph_op = false;
  for (const OpProfile& op : ops_api.take_profile()) graph_op |= op.op == "cuda_graph[rows=1]" && op.calls == 2;
  EXPECT_TRUE(graph_op);
}

// Asks for the same step again once after its first pass.
class ReplayOnce final : public StepHook {
 public:
  StepDecision after_pass(const StepPlan&, const StepOutput&, int64_t pass) override {
    return pass == 0 ? StepDecision::again : StepDecision::done;
  }
};

// With graphs on, a step that the runner's hook replays (its second pass a replay of the graph
// the first pass captured, or of one captured before) gives the bits of a single pass, for the
// prefill and every decode step; the graph backend captured and replayed.
TEST(CudaStepRunner, ReplayedStepMatchesOnePass) {
  MOET_SKIP_WITHOUT_GPU();
  const auto dir = kFixtures / "deepseek_v3";
  const auto prompt = json_read_file(dir / "golden_w2.json")["prompt_ids"].get<std::vector<int32_t>>();
  const Checkpoint checkpoint = Checkpoint::open(dir);
  auto gpu = cuda_backend_create({0, 0.9, 0.0, true});
  auto model = model_load(checkpoint, *gpu);
  const int64_t steps = 10, vocab = model->config().vocab_size;
  ReplayOnce hook;
  SequenceBatch single(*model, 1, int64_t(prompt.size()) + steps, kBlockSize);
  SequenceBatch replayed(*model, 1, int64_t(prompt.size()) + steps, kBlockSize);
  replayed.runner().add_hook(&hook);
  for (SequenceBatch* b : {&single, &replayed}) b->sequence(0).tokens = prompt;
  std::vector<float> a = single.run_rows(0, 0, int64_t(prompt.size()), ChunkRows::last).output.logits;
  StepOutcome r = replayed.run_rows(0, 0, int64_t(prompt.size()), ChunkRows::last);
  ASSERT_EQ(r.passes, 2);
  ASSERT_EQ(0, std::memcmp(a.data(), r.output.logits.data(), a.size() * sizeof(float))) << "prefill";
  for (int64_t step = 0; step < steps; ++step) {
    const int32_t next = argmax(a.data(), vocab);
    for (SequenceBatch* b : {&single, &replayed}) b->sequence(0).tokens.push_back(next);
    const int64_t pos = int64_t(prompt.size()) + step;
    a = single.decode(pos).output.logits;
    r = replayed.decode(pos);
    ASSERT_EQ(r.passes, 2);
    ASSERT_EQ(0, std::memcmp(a.data(), r.output.logits.data(), a.size() * sizeof(float))) << "decode step " << step;
  }
  EXPECT_EQ(replayed.runner().stats().replayed_steps, steps + 1);
  const GraphStats stats = gpu->graph_stats();
  EXPECT_EQ(stats.failures, 0);
  EXPECT_GT(stats.replays, steps);
}

}  // namespace
}  // namespace moet::test
