// `moet score`: teacher-forced perplexity of a text (or a token-id file) under a model, with the
// experts stored as --experts says; --logits-out writes every position's logits as raw
// little-endian float32 [tokens - 1, vocab] so tools can compare formats (KL divergence, top-1).
// The text runs in chunks of --max-num-batched-tokens rows (a chunked prefill: later chunks read
// the KV cache in its --kv-cache-dtype); with a cache dtype other than fp32 the same chunks also
// run over an FP32 cache, and the report adds that run's perplexity, the mean KL divergence of
// this run's next-token distributions from it, and their top-1 agreement.
// --decode-steps scores one position per decode step (the FP4 tier and the gate act as while
// generating; the report then has the tier's KPIs).
#include "cli/commands.h"
#include "cli/model_options.h"
#include "core/error.h"
#include "engine/scorer.h"
#include "experts/fp4_kpis.h"
#include "tokenizer/tokenizer.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <optional>
#include <sstream>

namespace moet::cli {
namespace {

struct ScoreFlags {
  ModelOptions model;
  std::string text_file;
  int64_t max_tokens = 0;
  int64_t max_num_batched_tokens = 512;
  std::string logits_out;
  bool decode_steps = false;
};

std::string read_all(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  MOET_CHECK(in.good(), "{}: cannot open", path);
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

void run(const ScoreFlags& flags) {
  const Tokenizer tokenizer = Tokenizer::from_dir(flags.model.model_dir);
  std::vector<int32_t> ids = tokenizer.encode(read_all(flags.text_file));
  if (flags.max_tokens > 0 && int64_t(ids.size()) > flags.max_tokens) ids.resize(size_t(flags.max_tokens));
  LoadedModel loaded = load_model(flags.model);
  if (loaded.follower()) return loaded.follow();  // node 0 scores the text
  const KvDtype kv_dtype = loaded.model->kv_layer_specs().front().dtype;
  const std::optional<KvDtype> reference = kv_dtype == KvDtype::f32 ? std::nullopt : std::optional(KvDtype::f32);
  const Fp4Tier* tier = loaded.model->experts().fp4_tier();
  const ScoreResult result = score(*loaded.model, ids, !flags.logits_out.empty(), flags.max_num_batched_tokens, 16,
                                   reference, flags.decode_steps);
  if (!flags.logits_out.empty()) {
    std::ofstream out(flags.logits_out, std::ios::binary | std::ios::trunc);
    out.write(reinterpret_cast<const char*>(result.logits.data()), std::streamsize(result.logits.size() * sizeof(float)));
    MOET_CHECK(out.good(), "{}: write failed", flags.logits_out);
  }
  nlohmann::json report = {{"tokens", ids.size()},
                           {"experts", flags.model.experts.experts},
                           {"kv_cache_dtype", kv_dtype_name(kv_dtype)},
                           {"max_num_batched_tokens", flags.max_num_batched_tokens},
                           {"mean_nll", result.mean_nll()},
                           {"perplexity", result.perplexity()},
                           {"vocab", loaded.model->config().vocab_size}};
  if (reference) {
    report["fp32_kv_perplexity"] = result.reference_perplexity();
    report["perplexity_change"] = result.perplexity() / result.reference_perplexity() - 1.0;
    report["kld_vs_fp32_kv"] = result.mean_kld();
    report["max_kld_vs_fp32_kv"] = *std::max_element(result.kld.begin(), result.kld.end());
    report["top1_agreement_vs_fp32_kv"] = double(result.top1_agree) / double(result.kld.size());
  }
  if (tier) report["fp4"] = fp4_kpi_json(fp4_tier_kpis(*tier));
  std::printf("%s\n", report.dump().c_str());
}

}  // namespace

void register_score(CLI::App& app, Actions& actions) {
  auto flags = std::make_shared<ScoreFlags>();
  CLI::App* sub = app.add_subcommand("score", "teacher-forced perplexity of a text file (and optionally its logits)");
  flags->model.add_to(*sub);
  sub->add_option("--text-file", flags->text_file, "text to score, tokenized with the model's tokenizer")->required();
  sub->add_option("--max-tokens", flags->max_tokens, "score only the first N tokens (0 = all)")
      ->check(CLI::NonNegativeNumber);
  sub->add_option("--max-num-batched-tokens", flags->max_num_batched_tokens,
                  "rows per forward (a chunked prefill: later chunks read the KV cache written by earlier ones)")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  sub->add_option("--logits-out", flags->logits_out,
                  "write the logits of every scored position as raw float32 [tokens - 1, vocab]");
  sub->add_flag("--decode-steps", flags->decode_steps,
                "score one position per step, each a decode step that samples (the FP4 tier's manager and the "
                "confidence gate act on them as while generating)");
  actions[sub] = [flags] { run(*flags); };
}

}  // namespace moet::cli
