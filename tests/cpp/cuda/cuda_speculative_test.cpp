// Speculative decoding on the GPU (docs/speculative.md, "CUDA"): what must hold before the gate in
// cli/speculative_options.cpp could be lifted (it was, after they passed on an H100); skipped where
// no GPU is visible.
//  - A verify step's logit rows are bit-identical (memcmp) to the plain decode steps' at the same
//    positions: row 0 to the decode step of the same position, row i to the decode step i
//    positions later (the drafts being the greedy tokens), for 1, 2, 3, 4, 5, 8, 12 and 32
//    sequences and k = 1, 2, 3, on the deepseek_v3 fixture and models/tiny. This is what keeps
//    greedy output unchanged; it holds because the runner marks both kinds of step decode-like
//    (engine/step_runner.h), for which the backend picks its kernels whatever the row count
//    (docs/design.md "Numerics", docs/speculative.md "CUDA").
//  - A long prompt chunk still takes cuBLASLt; a verify step of 32 rows does not.
//  - The MTP layer's draft logits on CUDA are within 2e-3 of the CPU backend's, same argmax.
//  - Greedy output through the engine with k = 1, 2, 3 equals the output without speculation,
//    with verify and draft steps eager and as CUDA graphs (SpeculativeConfig::graph_steps).
//  - Verify and chained draft steps replayed from CUDA graphs equal the same steps run eagerly.
#include "gpu_test_util.h"

#include "engine/engine_core.h"
#include "engine/sequence_batch.h"
#include "io/checkpoint.h"

#include <algorithm>
#include <filesystem>

namespace moet::test {
namespace {

const std::filesystem::path kSource = std::filesystem::path(MOET_SOURCE_DIR);

struct Case {
  std::string name;
  std::filesystem::path dir;
};

std::vector<Case> cases() {
  return {{"deepseek_v3", kSource / "tests" / "fixtures" / "deepseek_v3"}, {"tiny", kSource / "models" / "tiny"}};
}

std::unique_ptr<Model> load_mtp(const Checkpoint& checkpoint, Backend& backend) {
  ModelLoadOptions options;
  options.load_mtp = true;
  return model_load(checkpoint, backend, nullptr, options);
}

bool same_bits(const float* a, const float* b, int64_t n) { return std::memcmp(a, b, size_t(n) * sizeof(float)) == 0; }

// Prompts of `prompt` tokens for `batch` sequences, their greedy decode steps at positions prompt
// .. prompt + 3 (graphs as in serving), then verify steps of k = 1, 2, 3 drafts (the greedy tokens)
// for every sequence: each verify row memcmp-equal to the decode step at its position.
void expect_verify_rows_equal_decode_steps(Model& model, int64_t batch, const std::string& name) {
  const int64_t vocab = model.config().vocab_size, prompt = 9, k_max = 3;
  SequenceBatch sequences(model, batch, prompt + k_max + 1, 4);
  sequences.runner().set_row_invariant(true);  // as the engine sets it with speculative decoding
  for (int64_t s = 0; s < batch; ++s) {
    for (int64_t i = 0; i < prompt; ++i) sequences.sequence(s).tokens.push_back(int32_t((i * 37 + s * 11) % 500 + 3));
    const std::vector<float> logits = sequences.run_rows(s, 0, prompt, ChunkRows::last).output.logits;
    sequences.sequence(s).tokens.push_back(argmax(logits.data(), vocab));
  }
  std::vector<std::vector<float>> decoded;
  for (int64_t i = 0; i <= k_max; ++i) {
    decoded.push_back(sequences.decode(prompt + i).output.logits);
    for (int64_t s = 0; s < batch; ++s)
      if (Sequence& seq = sequences.sequence(s); int64_t(seq.tokens.size()) == prompt + i + 1)
        seq.tokens.push_back(argmax(decoded.back().data() + s * vocab, vocab));
  }
  for (int64_t k = 1; k <= k_max; ++k) {
    StepPlan plan;
    for (int64_t s = 0; s < batch; ++s) plan.chunks.push_back({&sequences.sequence(s), prompt, k + 1, ChunkRows::all});
    plan.num_tokens = batch * (k + 1);
    ASSERT_TRUE(sequences.runner().marks_row_invariant(plan));
    const std::vector<float> verify = sequences.runner().run(plan).output.logits;
    ASSERT_EQ(verify.size(), size_t(batch * (k + 1) * vocab));
    for (int64_t s = 0; s < batch; ++s)
      for (int64_t i = 0; i <= k; ++i)
        EXPECT_TRUE(same_bits(verify.data() + (s * (k + 1) + i) * vocab, decoded[size_t(i)].data() + s * vocab, vocab))
            << name << ": batch " << batch << ", k " << k << ", sequence " << s << ", verify row " << i;
  }
}

// Batches whose decode and verify steps straddle every band of the row-count dispatch: 1-3 rows
// (CUDA-core GEMV), 4-15 (tensor-core GEMV), 16 and more (cuBLASLt), more than 32, and the W2
// prefill kernels' threshold (32 items per expert: 128 verify rows at batch 32 on both models).
TEST(CudaSpeculative, VerifyRowsAreBitIdenticalToDecodeSteps) {
  MOET_SKIP_WITHOUT_GPU();
  for (const Case& c : cases()) {
    const Checkpoint checkpoint = Checkpoint::open(c.dir);
    auto backend = cuda_backend_create({});
    auto model = load_mtp(checkpoint, *backend);
    for (const int64_t batch : {1, 2, 3, 4, 5, 8, 12, 32}) expect_verify_rows_equal_decode_steps(*model, batch, c.name);
  }
}

// The profile names of the ops since the last take_profile().
std::vector<std::string> op_names(Backend& backend) {
  std::vector<std::string> names;
  for (const OpProfile& op : bench_ops(backend).take_profile()) names.push_back(op.op);
  return names;
}

// How many of `names` start with `prefix`: "gemm" (cuBLASLt: "gemm[...]", "gemm_group[...]"),
// "matmul" (the GEMV: "matmul[...]", "matmul_group[...]").
int64_t named(const std::vector<std::string>& names, const std::string& prefix) {
  return std::count_if(names.begin(), names.end(), [&](const std::string& n) { return n.rfind(prefix, 0) == 0; });
}

// In a row-invariant runner a prompt chunk longer than kRowInvariantMaxRun keeps cuBLASLt and a
// verify step of more rows than that (8 sequences, k = 3: 32 rows) takes none of it; a runner not
// set so (no speculative decoding) gives the same step to cuBLASLt. Each profile is read before the
// next begin_step.
TEST(CudaSpeculative, PrefillTakesTheGemmVerifyStepsDoNot) {
  MOET_SKIP_WITHOUT_GPU();
  const Checkpoint checkpoint = Checkpoint::open(kSource / "models" / "tiny");
  auto backend = cuda_backend_create({});
  auto model = load_mtp(checkpoint, *backend);
  const int64_t prompt = 40, batch = 8, k = 3;
  SequenceBatch sequences(*model, batch, prompt + k + 1, 4);
  sequences.runner().set_row_invariant(true);
  bench_ops(*backend).set_profiling(true);
  for (int64_t s = 0; s < batch; ++s) {
    Sequence& seq = sequences.sequence(s);
    for (int64_t i = 0; i < prompt; ++i) seq.tokens.push_back(int32_t((i * 53 + s * 7) % 500 + 3));
    op_names(*backend);  // drops what came before the step
    sequences.run_rows(s, 0, prompt, ChunkRows::last);
    EXPECT_GT(named(op_names(*backend), "gemm"), 0) << "prompt of sequence " << s;
    seq.tokens.insert(seq.tokens.end(), {5, 6, 7, 8});  // the last token and three drafts
  }
  StepPlan plan;
  for (int64_t s = 0; s < batch; ++s) plan.chunks.push_back({&sequences.sequence(s), prompt, k + 1, ChunkRows::all});
  plan.num_tokens = batch * (k + 1);
  sequences.runner().run(plan);
  const std::vector<std::string> verify = op_names(*backend);
  EXPECT_EQ(named(verify, "gemm"), 0);
  EXPECT_GT(named(verify, "matmul"), 0);
  sequences.runner().set_row_invariant(false);
  sequences.runner().run(plan);  // rewrites the same KV slots with the same rows
  EXPECT_GT(named(op_names(*backend), "gemm"), 0);
}

TEST(CudaSpeculative, MtpDraftLogitsMatchCpu) {
  MOET_SKIP_WITHOUT_GPU();
  for (const Case& c : cases()) {
    const Checkpoint checkpoint = Checkpoint::open(c.dir);
    BackendPair p;
    std::vector<std::vector<float>> logits;
    int64_t vocab = 0;
    for (Backend* backend : {p.cpu.get(), p.gpu.get()}) {
      auto model = load_mtp(checkpoint, *backend);
      vocab = model->config().vocab_size;
      const int64_t length = 12;
      SequenceBatch sequences(*model, 1, length, 4);
      Sequence& seq = sequences.sequence(0);
      for (int64_t i = 0; i < length; ++i) seq.tokens.push_back(int32_t((i * 53) % 500 + 3));
      StepPlan target;
      target.chunks.push_back({&seq, 0, length, ChunkRows::none, ChunkRows::all});
      target.num_tokens = length;
      std::vector<float> hidden = sequences.runner().run(target).output.hidden;
      hidden.resize(hidden.size() - size_t(model->config().hidden_size));
      StepPlan draft;
      draft.chunks.push_back({&seq, 0, length - 1, ChunkRows::all});
      draft.num_tokens = length - 1;
      draft.mtp_hidden = &hidden;
      logits.push_back(sequences.runner().run(draft).output.logits);
    }
    ASSERT_EQ(logits[0].size(), logits[1].size());
    double max_diff = 0.0;
    for (size_t i = 0; i < logits[0].size(); ++i)
      max_diff = std::max(max_diff, std::fabs(double(logits[0][i]) - double(logits[1][i])));
    EXPECT_LT(max_diff, 2e-3) << c.name;
    for (size_t row = 0; row * size_t(vocab) < logits[0].size(); ++row) {
      const size_t at = row * size_t(vocab);
      EXPECT_EQ(argmax(logits[0].data() + at, vocab), argmax(logits[1].data() + at, vocab)) << c.name << " row " << row;
    }
  }
}

TEST(CudaSpeculative, GreedyOutputIsUnchanged) {
  MOET_SKIP_WITHOUT_GPU();
  for (const Case& c : cases()) {
    const Checkpoint checkpoint = Checkpoint::open(c.dir);
    auto backend = cuda_backend_create({});
    auto model = load_mtp(checkpoint, *backend);
    std::vector<RequestParams> requests(16);
    for (size_t i = 0; i < requests.size(); ++i) {
      for (size_t t = 0; t < 6 + i % 5; ++t) requests[i].prompt.push_back(int32_t((i * 37 + t * 11) % 500 + 3));
      requests[i].max_tokens = 16;
    }
    const auto run = [&](const std::string& speculative, bool graph_steps = false) {
      EngineConfig config;
      config.block_size = 4;
      config.num_blocks = 1024;
      config.max_model_len = 64;
      config.max_num_batched_tokens = 64;
      config.speculative = speculative_config_parse(speculative);
      config.speculative.graph_steps = graph_steps;
      EngineCore engine(*model, std::nullopt, config);
      std::vector<std::vector<int32_t>> out(requests.size());
      for (size_t i = 0; i < requests.size(); ++i)
        engine.add(int64_t(i), requests[i], [&out, i](RequestOutput&& o) {
          out[i].insert(out[i].end(), o.token_ids.begin(), o.token_ids.end());
        });
      while (engine.has_work()) engine.step();
      return out;
    };
    const auto expected = run("");
    for (int k = 1; k <= 3; ++k)
      for (const bool graph_steps : {false, true})
        EXPECT_EQ(run(R"({"method":"mtp","num_speculative_tokens":)" + std::to_string(k) + "}", graph_steps), expected)
            << c.name << ", k " << k << ", verify and draft steps as graphs: " << graph_steps;
  }
}

// Verify steps and chained MTP draft steps run as CUDA graphs (engine/step_runner.h, step_recurs):
// a replay with new inputs (other drafts; other hidden rows, staged outside the graph) is
// memcmp-equal to the same step run eagerly, and differs from the captured pass where its inputs do.
TEST(CudaSpeculative, GraphedVerifyAndDraftStepsEqualEagerOnes) {
  MOET_SKIP_WITHOUT_GPU();
  const Checkpoint checkpoint = Checkpoint::open(kSource / "models" / "tiny");
  auto backend = cuda_backend_create({});
  auto model = load_mtp(checkpoint, *backend);
  const int64_t prompt = 9, k = 2, batch = 2, width = model->config().hidden_size;
  SequenceBatch sequences(*model, batch, prompt + k + 1, 4);
  sequences.runner().set_row_invariant(true);
  sequences.runner().set_speculative_graphs(true);
  for (int64_t s = 0; s < batch; ++s) {
    for (int64_t i = 0; i < prompt; ++i) sequences.sequence(s).tokens.push_back(int32_t((i * 29 + s * 13) % 500 + 3));
    sequences.run_rows(s, 0, prompt, ChunkRows::last);
  }
  const auto with_drafts = [&](int32_t first) {  // the last token and k drafts, then the verify plan
    StepPlan plan;
    for (int64_t s = 0; s < batch; ++s) {
      Sequence& seq = sequences.sequence(s);
      seq.tokens.resize(size_t(prompt));
      for (int64_t i = 0; i <= k; ++i) seq.tokens.push_back(int32_t(first + 7 * i + s));
      plan.chunks.push_back({&seq, prompt, k + 1, ChunkRows::all});
    }
    plan.num_tokens = batch * (k + 1);
    return plan;
  };
  const auto draft_plan = [&](const std::vector<float>* hidden) {  // one chained draft row a sequence
    StepPlan plan;
    for (int64_t s = 0; s < batch; ++s) plan.chunks.push_back({&sequences.sequence(s), prompt, 1, ChunkRows::last});
    plan.num_tokens = batch;
    plan.top_logits = 1;
    plan.mtp_hidden = hidden;
    return plan;
  };
  std::vector<float> hidden_a(size_t(batch * width)), hidden_b(size_t(batch * width));
  for (size_t i = 0; i < hidden_a.size(); ++i) {
    hidden_a[i] = float(int(i % 17) - 8) * 0.25f;
    hidden_b[i] = float(int(i % 13) - 6) * 0.3f;
  }
  const auto run = [&](const StepPlan& plan) { return sequences.runner().run(plan).output; };
  ASSERT_TRUE(backend->set_graphs(true));
  const GraphStats before = backend->graph_stats();
  const std::vector<float> verify_captured = run(with_drafts(40)).logits;
  const std::vector<float> verify_replayed = run(with_drafts(90)).logits;
  const StepOutput draft_captured = run(draft_plan(&hidden_a));
  const StepOutput draft_replayed = run(draft_plan(&hidden_b));
  const GraphStats after = backend->graph_stats();
  EXPECT_EQ(after.captures - before.captures, 2);
  EXPECT_EQ(after.replays - before.replays, 2);
  EXPECT_EQ(after.failures, before.failures);
  backend->set_graphs(false);
  const std::vector<float> verify_eager = run(with_drafts(90)).logits;
  const StepOutput draft_eager = run(draft_plan(&hidden_b));
  ASSERT_EQ(verify_replayed.size(), verify_eager.size());
  EXPECT_TRUE(same_bits(verify_replayed.data(), verify_eager.data(), int64_t(verify_eager.size())));
  EXPECT_FALSE(same_bits(verify_captured.data(), verify_replayed.data(), int64_t(verify_eager.size())));
  ASSERT_EQ(draft_replayed.top.values.size(), draft_eager.top.values.size());
  EXPECT_EQ(draft_replayed.top.ids, draft_eager.top.ids);
  EXPECT_TRUE(same_bits(draft_replayed.top.values.data(), draft_eager.top.values.data(),
                        int64_t(draft_eager.top.values.size())));
  EXPECT_NE(draft_captured.top.values, draft_replayed.top.values);
  backend->set_graphs(true);
}

}  // namespace
}  // namespace moet::test
