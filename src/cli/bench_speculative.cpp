// Speculative decoding's step costs for `moet bench` (see bench_speculative.h).
#include "cli/bench_speculative.h"

#include "core/error.h"

#include <chrono>

namespace moet::cli {
namespace {

double seconds_of(const std::function<void()>& run) {
  const auto start = std::chrono::steady_clock::now();
  run();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

// The mean seconds of runner.run(plan_at(i)) over i = 1 .. count, after one untimed run of
// plan_at(0) (a CUDA graph's capture).
double mean_step_seconds(StepRunner& runner, int64_t count, const std::function<StepPlan(int64_t)>& plan_at) {
  runner.run(plan_at(0));
  double total = 0.0;
  for (int64_t i = 1; i <= count; ++i) {
    const StepPlan plan = plan_at(i);
    total += seconds_of([&] { runner.run(plan); });
  }
  return total / double(count);
}

}  // namespace

nlohmann::json bench_speculative(SequenceBatch& sequences, const SpeculativeConfig& config, int64_t prompt_len,
                                 int64_t steps, double decode_step_seconds) {
  const int64_t k = config.num_speculative_tokens;
  MOET_CHECK(steps > k + 1, "--speculative-config: --decode-tokens ({}) must exceed num_speculative_tokens ({}) + 1",
             steps, k);
  StepRunner& runner = sequences.runner();
  runner.set_row_invariant(true);  // as the engine runs with speculative decoding
  runner.set_speculative_graphs(config.graph_steps);
  const int64_t batch = sequences.size(), hidden = runner.model().config().hidden_size, timed = steps - k - 1;
  // Steps at positions prompt_len + i of every sequence: chunks of `rows` rows ([token, rows - 1
  // drafts]: the drafts are the tokens the decode passes produced, so they rewrite the same KV
  // slots with the same values) returning `logits`.
  const auto step_at = [&](int64_t i, int64_t rows, ChunkRows logits) {
    StepPlan plan;
    for (int64_t s = 0; s < batch; ++s) plan.chunks.push_back({&sequences.sequence(s), prompt_len + i, rows, logits});
    plan.num_tokens = batch * rows;
    plan.top_logits = 1;
    return plan;
  };
  // Decode steps as a speculative engine runs them (row-invariant kernels), against the plain ones.
  const double decode_row_invariant =
      mean_step_seconds(runner, timed, [&](int64_t i) { return step_at(i, 1, ChunkRows::last); });
  std::vector<double> verify(size_t(k + 1), 0.0);
  for (int64_t j = 1; j <= k; ++j)
    verify[size_t(j)] = mean_step_seconds(runner, timed, [&](int64_t i) { return step_at(i, j + 1, ChunkRows::all); });
  // Chained draft steps of the MTP layer at the same positions, one row per sequence.
  double draft = 0.0;
  const std::vector<float> inputs(size_t(batch * hidden), 1.0f);
  if (config.method == SpeculativeConfig::Method::mtp)
    draft = mean_step_seconds(runner, timed, [&](int64_t i) {
      StepPlan plan = step_at(i, 1, ChunkRows::last);
      for (ScheduledChunk& chunk : plan.chunks) chunk.hidden = ChunkRows::last;
      plan.mtp_hidden = &inputs;
      return plan;
    });
  nlohmann::json projected = nlohmann::json::object(), verify_us = nlohmann::json::object(),
                 ratio = nlohmann::json::object();
  for (int64_t length = 1; length <= k + 1; ++length)
    projected[std::to_string(length)] = double(batch * length) / (verify[size_t(k)] + double(k) * draft);
  for (int64_t j = 1; j <= k; ++j) {
    verify_us[std::to_string(j + 1)] = verify[size_t(j)] * 1e6;
    ratio[std::to_string(j + 1)] = verify[size_t(j)] / decode_step_seconds;
  }
  return {{"method", speculative_method_name(config.method)},
          {"num_speculative_tokens", k},
          {"decode_step_us", decode_step_seconds * 1e6},
          {"decode_step_us_row_invariant", decode_row_invariant * 1e6},
          {"verify_step_us", verify_us},
          {"verify_cost_ratio", ratio},
          {"draft_step_us", draft * 1e6},
          {"decode_tokens_per_s_at_acceptance_length", projected}};
}

}  // namespace moet::cli
