// Speculative decoding (docs/speculative.md): after each step, up to k draft tokens per decoding
// sequence are appended to its tokens (Sequence::num_draft_tokens), so the next step computes
// [last token, d_1 .. d_k] in one chunk of k + 1 rows, every row returning its logits; the engine
// samples the rows in order with the request's sampler exactly as it would without drafts, and
// keeps tokens while each equals the draft it verifies (verify_drafts()): the accepted drafts plus
// the first token that differs (or the bonus after the last draft). Rejected positions are simply
// not counted as computed: the next step overwrites their KV slots, in the MTP layer's cache too.
//
// Drafts come from one of two proposers:
//   mtp    the checkpoint's MTP layer (models/mtp.h). After a step, the MTP layer catches up on
//          every position the step computed and kept (its input there is the target's hidden
//          state and the next token, now known), which also yields the first draft from the last
//          position; drafts 2..k chain the layer on its own output (one row per sequence per
//          draft step). Drafts are the MTP logits' argmax. The MTP layer's KV entries are written
//          for positions the scheduler reserved as lookahead slots; the entry at a cached block's
//          last position depends on the token after the block, so a block carries the token its
//          entry was computed with, and a prefix hit keeps a block only when that token matches.
//   ngram  prompt lookup: the tokens that followed the latest earlier occurrence of the
//          sequence's last n tokens (the longest n in [prompt_lookup_min, prompt_lookup_max]).
// Every step goes through the StepRunner; the Speculator only builds the draft steps' plans.
#pragma once

#include "engine/sampler.h"
#include "engine/scheduler.h"
#include "engine/step_runner.h"

#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <vector>

namespace moet {

struct SpeculativeConfig {
  enum class Method { none, mtp, ngram };
  Method method = Method::none;
  int64_t num_speculative_tokens = 0;  // k: drafts per verify step
  int64_t prompt_lookup_min = 0;       // ngram: the n-gram lengths tried, longest first
  int64_t prompt_lookup_max = 0;
  // Verify and chained draft steps captured as CUDA graphs like decode steps
  // (StepRunner::set_speculative_graphs); off only where a test compares them with eager steps.
  bool graph_steps = true;
  bool enabled() const { return method != Method::none; }
};

// vLLM's --speculative-config JSON: {"method": "mtp", "num_speculative_tokens": k} or
// {"method": "ngram", "num_speculative_tokens": k, "prompt_lookup_max": n, "prompt_lookup_min": m}
// (n defaults to 5, m to 1); "" means none. Throws moet::Error naming the flag and the field.
SpeculativeConfig speculative_config_parse(const std::string& text);
const char* speculative_method_name(SpeculativeConfig::Method method);

// Prompt lookup: for the longest n in [min_n, max_n] whose last-n-token suffix of `tokens` also
// occurs earlier, the up to k tokens that followed its latest earlier occurrence; empty when none.
std::vector<int32_t> ngram_propose(std::span<const int32_t> tokens, int64_t k, int64_t min_n, int64_t max_n);

// The acceptance rule: rows 0, 1, .. of a verify chunk are sampled in order (sample(i), with the
// request's sampler and the context up to row i, as without speculation) until a sampled token
// differs from drafts[i] or every draft matched; returns the sampled tokens (the accepted drafts,
// then that token). Drafts are deterministic (MTP argmax, prompt lookup): for a draft distribution
// q = one-hot(d) the standard speculative-sampling rule accepts d with probability
// min(1, p(d) / q(d)) = p(d) and otherwise draws from max(0, p - q) normalised, i.e. from p
// without d; sampling x ~ p and accepting when x = d has exactly that law, so every token keeps
// the target distribution (processed by temperature, top-k, top-p, min-p, penalties and
// logit_bias as the sampler does), greedy keeps the longest prefix matching the argmaxes, and a
// seeded request draws the same tokens as without speculation (one uniform per token, in order).
std::vector<SampleResult> verify_drafts(std::span<const int32_t> drafts,
                                        const std::function<SampleResult(size_t row)>& sample);

// Counts since the engine started (vLLM's spec_decode metrics).
struct SpeculativeStats {
  int64_t drafts = 0;           // verify steps of a request that had at least one draft
  int64_t draft_tokens = 0;     // drafts verified
  int64_t accepted_tokens = 0;  // drafts accepted
  std::vector<int64_t> drafted_per_position, accepted_per_position;  // [k]
  // Tokens a verify step produces on average: 1 + accepted_tokens / drafts (0 before any).
  double acceptance_length() const;
  // accepted / drafted at draft position i (0-based; 0 where nothing was drafted).
  double acceptance_rate(size_t position) const;
};

// A sequence of the last step that may get drafts: its chunk in the plan and how many drafts
// it may take (0: none, e.g. a prefill chunk; the MTP layer still catches up on the chunk).
struct DraftRequest {
  size_t chunk = 0;
  int64_t max_drafts = 0;
};

class Speculator {
 public:
  // `blocks`: the KV cache's block count. Throws for mtp on a model loaded without its MTP layer.
  Speculator(const SpeculativeConfig& config, StepRunner& runner, int64_t blocks);

  const SpeculativeConfig& config() const { return config_; }
  // The scheduler's prefix check (mtp): whether `block`'s MTP entries were computed with
  // `next_token` after it.
  bool prefix_valid(int32_t block, int32_t next_token) const;
  // After scheduling: drops the drafts the step's token budget did not reach; chunks with
  // drafts return every row's logits; mtp: every chunk returns its rows' hidden states, and the
  // blocks it writes lose their recorded next token until the MTP layer has caught up on them.
  void prepare(StepPlan& plan);
  // One chunk's verification: `drafts` drafts, the first `accepted` of them accepted.
  void record(int64_t drafts, int64_t accepted);
  // After the step (the plan's chunk counts are the positions kept, scheduler completed, sampled
  // tokens appended): runs the draft steps and appends the drafts to the sequences' tokens.
  void propose(const StepPlan& plan, const StepOutcome& outcome, std::span<const DraftRequest> requests);
  const SpeculativeStats& stats() const { return stats_; }

 private:
  void propose_mtp(const StepPlan& plan, const StepOutcome& outcome, std::span<const DraftRequest> requests);

  SpeculativeConfig config_;
  StepRunner& runner_;
  std::vector<int32_t> block_next_;  // mtp: per block, the token after it its last MTP entry saw (-1: none)
  SpeculativeStats stats_;
};

}  // namespace moet
