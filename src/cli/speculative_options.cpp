// --speculative-config (see speculative_options.h).
#include "cli/speculative_options.h"

namespace moet::cli {

void SpeculativeOptions::add_to(CLI::App& sub) {
  sub.add_option("--speculative-config", json,
                 "speculative decoding, as vLLM's JSON: '{\"method\":\"mtp\",\"num_speculative_tokens\":K}' (drafts "
                 "from the checkpoint's MTP layer) or '{\"method\":\"ngram\",\"num_speculative_tokens\":K,"
                 "\"prompt_lookup_max\":N}' (prompt lookup; prompt_lookup_min 1 by default); K drafts are verified "
                 "in one step, greedy output unchanged (docs/speculative.md)");
}

SpeculativeConfig SpeculativeOptions::resolve() const { return speculative_config_parse(json); }

}  // namespace moet::cli
