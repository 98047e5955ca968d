// Speculative decoding (see speculative.h).
#include "engine/speculative.h"

#include "core/error.h"

#include <nlohmann/json.hpp>

#include <algorithm>

namespace moet {
namespace {

constexpr const char* kFlag = "--speculative-config";

int64_t positive_field(const nlohmann::json& j, const char* name, int64_t fallback) {
  if (!j.contains(name)) return fallback;
  MOET_CHECK(j[name].is_number_integer() && j[name].get<int64_t>() >= 1, "{}: '{}' must be an integer >= 1 (got {})",
             kFlag, name, j[name].dump());
  return j[name].get<int64_t>();
}

}  // namespace

SpeculativeConfig speculative_config_parse(const std::string& text) {
  SpeculativeConfig config;
  if (text.empty()) return config;
  const nlohmann::json j = nlohmann::json::parse(text, nullptr, false);
  MOET_CHECK(j.is_object(), "{}: not a JSON object: {}", kFlag, text);
  for (const auto& [key, value] : j.items())
    MOET_CHECK(key == "method" || key == "num_speculative_tokens" || key == "prompt_lookup_max" ||
                   key == "prompt_lookup_min",
               "{}: unknown field '{}' (known: method, num_speculative_tokens, prompt_lookup_max, prompt_lookup_min)",
               kFlag, key);
  MOET_CHECK(j.contains("method") && j["method"].is_string(), "{}: 'method' (\"mtp\" or \"ngram\") is required",
             kFlag);
  const std::string method = j["method"].get<std::string>();
  MOET_CHECK(method == "mtp" || method == "ngram", "{}: unknown method '{}' (supported: mtp, ngram)", kFlag, method);
  config.method = method == "mtp" ? SpeculativeConfig::Method::mtp : SpeculativeConfig::Method::ngram;
  MOET_CHECK(j.contains("num_speculative_tokens"), "{}: 'num_speculative_tokens' is required", kFlag);
  config.num_speculative_tokens = positive_field(j, "num_speculative_tokens", 0);
  MOET_CHECK(config.num_speculative_tokens < kRowInvariantMaxRun,
             "{}: 'num_speculative_tokens' {} is more than {} (a verify chunk of k + 1 rows must stay a decode-like "
             "step: docs/speculative.md)",
             kFlag, config.num_speculative_tokens, kRowInvariantMaxRun - 1);
  if (config.method == SpeculativeConfig::Method::ngram) {
    config.prompt_lookup_max = positive_field(j, "prompt_lookup_max", 5);
    config.prompt_lookup_min = positive_field(j, "prompt_lookup_min", 1);
    MOET_CHECK(config.prompt_lookup_min <= config.prompt_lookup_max,
               "{}: prompt_lookup_min {} is larger than prompt_lookup_max {}", kFlag, config.prompt_lookup_min,
               config.prompt_lookup_max);
  } else {
    MOET_CHECK(!j.contains("prompt_lookup_max") && !j.contains("prompt_lookup_min"),
               "{}: prompt_lookup_max / prompt_lookup_min are fields of method ngram", kFlag);
  }
  return config;
}

const char* speculative_method_name(SpeculativeConfig::Method method) {
  switch (method) {
    case SpeculativeConfig::Method::none: return "none";
    case SpeculativeConfig::Method::mtp: return "mtp";
    case SpeculativeConfig::Method::ngram: return "ngram";
  }
  return "?";
}

std::vector<int32_t> ngram_propose(std::span<const int32_t> tokens, int64_t k, int64_t min_n, int64_t max_n) {
  const int64_t length = int64_t(tokens.size());
  for (int64_t n = std::min(max_n, length - 1); n >= std::max<int64_t>(min_n, 1); --n) {
    const auto suffix = tokens.subspan(size_t(length - n));
    for (int64_t start = length - n - 1; start >= 0; --start) {
      if (!std::equal(suffix.begin(), suffix.end(), tokens.begin() + start)) continue;
      const int64_t from = start + n, to = std::min(length, from + k);
      return {tokens.begin() + from, tokens.begin() + to};
    }
  }
  return {};
}

std::vector<SampleResult> verify_drafts(std::span<const int32_t> drafts,
                                        const std::function<SampleResult(size_t row)>& sample) {
  std::vector<SampleResult> out;
  for (size_t row = 0; row <= drafts.size(); ++row) {
    out.push_back(sample(row));
    if (row == drafts.size() || out.back().token != drafts[row]) break;
  }
  return out;
}

double SpeculativeStats::acceptance_length() const {
  return drafts > 0 ? 1.0 + double(accepted_tokens) / double(drafts) : 0.0;
}

double SpeculativeStats::acceptance_rate(size_t position) const {
  return position < drafted_per_position.size() && drafted_per_position[position] > 0
             ? double(accepted_per_position[position]) / double(drafted_per_position[position])
             : 0.0;
}

Speculator::Speculator(const SpeculativeConfig& config, StepRunner& runner, int64_t blocks)
    : config_(config), runner_(runner) {
  MOET_CHECK(config_.enabled() && config_.num_speculative_tokens >= 1, "speculative decoding needs k >= 1 drafts");
  if (config_.method == SpeculativeConfig::Method::mtp) {
    MOET_CHECK(runner_.model().has_mtp(),
               "{} method mtp: the model was loaded without its MTP layer (ModelLoadOptions::load_mtp)", kFlag);
    block_next_.assign(size_t(blocks), -1);
  }
  stats_.drafted_per_position.assign(size_t(config_.num_speculative_tokens), 0);
  stats_.accepted_per_position.assign(size_t(config_.num_speculative_tokens), 0);
}

bool Speculator::prefix_valid(int32_t block, int32_t next_token) const {
  return block_next_.empty() || block_next_[size_t(block)] == next_token;
}

void Speculator::prepare(StepPlan& plan) {
  const bool mtp = !block_next_.empty();
  const int64_t bs = runner_.block_size();
  for (ScheduledChunk& chunk : plan.chunks) {
    Sequence& seq = *chunk.seq;
    const int64_t uncovered = std::min(int64_t(seq.tokens.size()) - (chunk.begin + chunk.count), seq.num_draft_tokens);
    seq.tokens.resize(seq.tokens.size() - size_t(uncovered));
    seq.num_draft_tokens -= uncovered;
    if (seq.num_draft_tokens > 0) chunk.logits = ChunkRows::all;  // [last token, drafts]: one row each
    if (!mtp) continue;
    chunk.hidden = ChunkRows::all;
    for (size_t b = size_t(chunk.begin / bs); b < seq.blocks.size(); ++b) block_next_[size_t(seq.blocks[b])] = -1;
  }
}

void Speculator::record(int64_t drafts, int64_t accepted) {
  if (drafts == 0) return;
  ++stats_.drafts;
  stats_.draft_tokens += drafts;
  stats_.accepted_tokens += accepted;
  for (int64_t i = 0; i < drafts; ++i) {
    ++stats_.drafted_per_position[size_t(i)];
    stats_.accepted_per_position[size_t(i)] += i < accepted ? 1 : 0;
  }
}

void Speculator::propose(const StepPlan& plan, const StepOutcome& outcome, std::span<const DraftRequest> requests) {
  if (!block_next_.empty()) return propose_mtp(plan, outcome, requests);
  for (const DraftRequest& request : requests) {
    if (request.max_drafts == 0) continue;
    Sequence& seq = *plan.chunks[request.chunk].seq;
    const std::vector<int32_t> drafts =
        ngram_propose(seq.tokens, request.max_drafts, config_.prompt_lookup_min, config_.prompt_lookup_max);
    seq.tokens.insert(seq.tokens.end(), drafts.begin(), drafts.end());
    seq.num_draft_tokens = int64_t(drafts.size());
  }
}

// Draft step 1 catches the MTP layer up on each chunk's kept positions [begin, begin + count):
// position p reads the target's hidden state at p and token p + 1 (the last reads the token just
// sampled), and the last row's logits give the first draft. Draft step j > 1 runs one row per
// sequence at the position before its newest draft, on the MTP layer's own output there.
void Speculator::propose_mtp(const StepPlan& plan, const StepOutcome& outcome,
                             std::span<const DraftRequest> requests) {
  const int64_t width = runner_.model().config().hidden_size, bs = runner_.block_size();
  std::vector<int64_t> first_hidden(plan.chunks.size(), -1);  // each chunk's first hidden row
  for (size_t row = outcome.hidden_chunks.size(); row-- > 0;)
    first_hidden[size_t(outcome.hidden_chunks[row])] = int64_t(row);
  struct Chain {
    Sequence* seq;
    int64_t left;  // drafts still to make
  };
  std::vector<Chain> chains;
  std::vector<float> hidden;
  StepPlan step;
  step.top_logits = 1;
  for (const DraftRequest& request : requests) {
    const ScheduledChunk& chunk = plan.chunks[request.chunk];
    const auto rows = outcome.output.hidden.begin() + first_hidden[request.chunk] * width;
    hidden.insert(hidden.end(), rows, rows + chunk.count * width);
    const ChunkRows drafting = request.max_drafts > 0 ? ChunkRows::last : ChunkRows::none;
    const ChunkRows chaining = request.max_drafts > 1 ? ChunkRows::last : ChunkRows::none;
    step.chunks.push_back({chunk.seq, chunk.begin, chunk.count, drafting, chaining});
    step.num_tokens += chunk.count;
    if (request.max_drafts > 0) chains.push_back({chunk.seq, request.max_drafts});
  }
  if (step.chunks.empty()) return;
  step.mtp_hidden = &hidden;
  for (bool catch_up = true; !step.chunks.empty(); catch_up = false) {
    const StepOutcome drafted = runner_.run(step);
    if (catch_up) {  // the entries at blocks' last positions now hold for the token after them
      for (const ScheduledChunk& chunk : step.chunks) {
        const Sequence& seq = *chunk.seq;
        for (int64_t p = chunk.begin; p < chunk.begin + chunk.count; ++p)
          if ((p + 1) % bs == 0) block_next_[size_t(seq.blocks[size_t(p / bs)])] = seq.tokens[size_t(p + 1)];
      }
    }
    // Append each chain's draft; the chains that go on form the next step, on their hidden rows.
    step.chunks.clear();
    step.num_tokens = 0;
    hidden.clear();
    size_t kept = 0;
    for (size_t i = 0; i < chains.size(); ++i) {
      Chain chain = chains[i];
      Sequence& seq = *chain.seq;
      seq.tokens.push_back(drafted.output.top.ids[i]);
      ++seq.num_draft_tokens;
      if (--chain.left == 0) continue;
      const auto row = drafted.output.hidden.begin() + int64_t(kept) * width;
      hidden.insert(hidden.end(), row, row + width);
      step.chunks.push_back({&seq, int64_t(seq.tokens.size()) - 2, 1, ChunkRows::last,
                             chain.left > 1 ? ChunkRows::last : ChunkRows::none});
      ++step.num_tokens;
      chains[kept++] = chain;
    }
    chains.resize(kept);
  }
}

}  // namespace moet
