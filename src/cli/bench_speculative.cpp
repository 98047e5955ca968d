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

}  // namespace

nlohmann::json bench_speculative(SequenceBatch& sequences, const SpeculativeConfig& config, int64_t prompt_len,
                                 int64_t steps, double decode_step_seconds) {
  const int64_t k = config.num_speculative_tokens;
  MOET_CHECK(steps > k, "--speculative-config: --decode-tokens ({}) must exceed num_speculative_tokens ({})", steps, k);
  StepRunner& runner = sequences.runner();
  const int64_t batch = sequences.size(), hidden = runner.model().config().hidden_size;
  // Verify steps of j + 1 rows per sequence (j = 1 .. k) at positions prompt_len + i: [token, j
  // drafts] of every sequence (the drafts are the tokens the decode passes produced; they rewrite
  // the same KV slots with the same values).
  std::vector<double> verify(size_t(k + 1), 0.0);
  for (int64_t j = 1; j <= k; ++j) {
    for (int64_t i = 0; i < steps - k; ++i) {
      StepPlan plan;
      for (int64_t s = 0; s < batch; ++s)
        plan.chunks.push_back({&sequences.sequence(s), prompt_len + i, j + 1, ChunkRows::all});
      plan.num_tokens = batch * (j + 1);
      plan.top_logits = 1;
      verify[size_t(j)] += seconds_of([&] { runner.run(plan); });
    }
    verify[size_t(j)] /= double(steps - k);
  }
  // Draft steps of the MTP layer at the same positions, one row per sequence.
  double draft = 0.0;
  if (config.method == SpeculativeConfig::Method::mtp) {
    const std::vector<float> inputs(size_t(batch * hidden), 1.0f);
    for (int64_t i = 0; i < steps - k; ++i) {
      StepPlan plan;
      for (int64_t s = 0; s < batch; ++s)
        plan.chunks.push_back({&sequences.sequence(s), prompt_len + i, 1, ChunkRows::last, ChunkRows::last});
      plan.num_tokens = batch;
      plan.top_logits = 1;
      plan.mtp_hidden = &inputs;
      draft += seconds_of([&] { runner.run(plan); });
    }
    draft /= double(steps - k);
  }
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
          {"verify_step_us", verify_us},
          {"verify_cost_ratio", ratio},
          {"draft_step_us", draft * 1e6},
          {"decode_tokens_per_s_at_acceptance_length", projected}};
}

}  // namespace moet::cli
