// StepRunner implementation (see step_runner.h).
#include "engine/step_runner.h"

#include "core/error.h"
#include "core/log.h"
#include "engine/confidence_gate.h"

#include <algorithm>
#include <atomic>

namespace moet {
namespace {

std::atomic<int64_t> next_runner_id{1};

// The rows of a chunk `rows` selects, appended as batch row indices (the chunk's first row is
// `first`); returns how many.
int64_t select_rows(ChunkRows rows, const ScheduledChunk& chunk, int32_t first, std::vector<int32_t>& out) {
  const ChunkRows resolved = rows == ChunkRows::if_sampling ? (chunk.samples() ? ChunkRows::last : ChunkRows::none)
                                                            : rows;
  if (resolved == ChunkRows::none) return 0;
  if (resolved == ChunkRows::last) {
    out.push_back(first + int32_t(chunk.count) - 1);
    return 1;
  }
  for (int32_t r = 0; r < int32_t(chunk.count); ++r) out.push_back(first + r);
  return chunk.count;
}

// The tiered experts' protocol as the runner's hook: the residency decides how each pass runs
// (a graph, or eagerly layer by layer) and, after it, whether to fetch and run the step again.
class ResidencyHook final : public StepHook {
 public:
  explicit ResidencyHook(ExpertResidency& residency) : residency_(residency) { residency_.allocate(); }
  bool before_pass(const StepPlan& plan, int64_t pass, bool recurring) override {
    int64_t rows = 0;
    for (const ScheduledChunk& chunk : plan.chunks) rows += chunk.count;
    return residency_.begin_pass(rows, recurring, pass);
  }
  StepDecision after_pass(const StepPlan&, const StepOutput&, int64_t pass) override {
    return residency_.after_pass(pass) ? StepDecision::again : StepDecision::done;
  }

 private:
  ExpertResidency& residency_;
};

}  // namespace

bool row_invariant_step(const StepPlan& plan) {
  return std::all_of(plan.chunks.begin(), plan.chunks.end(),
                     [](const ScheduledChunk& chunk) { return chunk.count <= kRowInvariantMaxRun; });
}

bool step_recurs(const StepPlan& plan, bool row_invariant) {
  return std::all_of(plan.chunks.begin(), plan.chunks.end(), [&](const ScheduledChunk& chunk) {
    const bool returns_logits =
        chunk.logits != ChunkRows::none && (chunk.logits != ChunkRows::if_sampling || chunk.samples());
    return returns_logits && (chunk.count == 1 || (row_invariant && chunk.logits == ChunkRows::all));
  });
}

StepRunner::StepRunner(Model& model, int64_t blocks, int64_t block_size, std::span<const KvLayerSpec> specs)
    : model_(model),
      cache_(model.kv_cache_create(specs.empty() ? model.kv_layer_specs() : specs, blocks, block_size)),
      id_(next_runner_id++) {
  if (ExpertResidency* residency = model.experts().residency()) {
    residency_ = std::make_unique<ResidencyHook>(*residency);
    hooks_.push_back(residency_.get());
  }
  if (Fp4Tier* tier = model.experts().fp4_tier()) {
    gate_ = std::make_unique<ConfidenceGate>(*tier, model.experts().residency());
    hooks_.push_back(gate_.get());
  }
}

StepRunner::~StepRunner() = default;

ForwardBatch StepRunner::batch_for(const StepPlan& plan, StepOutcome& outcome) const {
  ForwardBatch batch;
  const int64_t bs = cache_.block_size;
  batch.top_k = plan.top_logits;
  batch.mtp_hidden = plan.mtp_hidden;
  batch.row_invariant = marks_row_invariant(plan);
  const int64_t shift = plan.mtp_hidden ? 1 : 0;  // a draft step reads the token after each position
  for (size_t c = 0; c < plan.chunks.size(); ++c) {
    const ScheduledChunk& chunk = plan.chunks[c];
    const Sequence& seq = *chunk.seq;
    MOET_CHECK(chunk.count > 0 && chunk.begin >= 0 &&
                   chunk.begin + chunk.count + shift <= int64_t(seq.tokens.size()) &&
                   int64_t(seq.blocks.size()) * bs >= chunk.begin + chunk.count,
               "step plan: chunk [{}, {}) of sequence {} outside its {} tokens or {} KV blocks", chunk.begin,
               chunk.begin + chunk.count, seq.id, seq.tokens.size(), seq.blocks.size());
    const int32_t seq_index = int32_t(batch.block_tables.size()), first = int32_t(batch.tokens.size());
    batch.block_tables.push_back(seq.blocks.data());
    for (int64_t pos = chunk.begin; pos < chunk.begin + chunk.count; ++pos) {
      batch.tokens.push_back(seq.tokens[size_t(pos + shift)]);
      batch.positions.push_back(int32_t(pos));
      batch.row_seq.push_back(seq_index);
      batch.slots.push_back(int64_t(seq.blocks[size_t(pos / bs)]) * bs + pos % bs);
    }
    outcome.logit_chunks.insert(outcome.logit_chunks.end(), size_t(select_rows(chunk.logits, chunk, first, batch.logit_rows)),
                                int32_t(c));
    outcome.hidden_chunks.insert(outcome.hidden_chunks.end(),
                                 size_t(select_rows(chunk.hidden, chunk, first, batch.hidden_rows)), int32_t(c));
  }
  return batch;
}

// Everything the forward bakes into its launches besides the step inputs (docs/design.md, "CUDA
// graphs"): this runner (one model), the top-logits width, the logit, hidden and confidence rows,
// and the KV cache's memory.
GraphKey StepRunner::graph_key(const ForwardBatch& batch) const {
  GraphKey key;
  key.values = {id_, batch.top_k, int64_t(batch.logit_rows.size())};
  key.values.insert(key.values.end(), batch.logit_rows.begin(), batch.logit_rows.end());
  key.values.push_back(int64_t(batch.hidden_rows.size()));
  key.values.insert(key.values.end(), batch.hidden_rows.begin(), batch.hidden_rows.end());
  key.values.push_back(int64_t(batch.confidence_rows.size()));
  key.values.insert(key.values.end(), batch.confidence_rows.begin(), batch.confidence_rows.end());
  for (const KvLayerCache& layer : cache_.layers) {
    key.values.push_back(int64_t(reinterpret_cast<intptr_t>(layer.k.data)));
    key.values.push_back(int64_t(reinterpret_cast<intptr_t>(layer.v.data)));
  }
  return key;
}

StepOutcome StepRunner::run(const StepPlan& plan) {
  MOET_CHECK(!plan.chunks.empty(), "step plan without chunks");
  StepOutcome outcome;
  ForwardBatch batch = batch_for(plan, outcome);
  // The gate judges every logit row the engine samples: a chunk's row at its sequence's last known
  // token and, in a verify chunk, the rows of its drafts.
  if (gate_ && !plan.mtp_hidden && gate_->judges_step()) {
    for (size_t i = 0; i < outcome.logit_chunks.size(); ++i) {
      const Sequence& seq = *plan.chunks[size_t(outcome.logit_chunks[i])].seq;
      const int64_t first_sampled = int64_t(seq.tokens.size()) - 1 - seq.num_draft_tokens;
      if (batch.positions[size_t(batch.logit_rows[i])] >= first_sampled) batch.confidence_rows.push_back(int32_t(i));
    }
  }
  const bool recurring =
      step_recurs(plan, batch.row_invariant && speculative_graphs_) && (!plan.mtp_hidden || speculative_graphs_);
  const GraphKey key = recurring ? graph_key(batch) : GraphKey{};
  ++stats_.steps;
  for (;;) {
    bool graph = recurring;
    for (StepHook* hook : hooks_) graph = hook->before_pass(plan, outcome.passes, recurring) && graph;
    batch.graph = graph ? &key : nullptr;
    outcome.output = model_.forward(batch, cache_);
    const int64_t pass = outcome.passes++;
    ++stats_.passes;
    bool again = false;
    for (StepHook* hook : hooks_) again = hook->after_pass(plan, outcome.output, pass) == StepDecision::again || again;
    if (!again) break;
    if (outcome.passes >= kMaxPasses) {
      MOET_LOG_WARN("a step asked for more than {} passes; its last pass stands", kMaxPasses);
      break;
    }
  }
  if (outcome.passes > 1) ++stats_.replayed_steps;
  return outcome;
}

}  // namespace moet
