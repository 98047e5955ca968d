// The flags of the FP4 recovery tier and the confidence gate (experts/fp4_tier.h,
// engine/confidence_gate.h): the tier's pool (--fp4-pool-gb / --fp4-pool-slots), its host store
// (--fp4-store), its manager (--fp4-promote-per-step, --fp4-decay) and the gate (--gate-tau,
// --gate-signal, --gate-rounds, --gate-budget, --gate-tau-file). Part of ExpertOptions, so every
// subcommand that loads a model takes them.
#pragma once

#include "experts/expert_loader.h"

#include <CLI/CLI.hpp>

#include <string>

namespace moet::cli {

struct Fp4Options {
  std::string pool_gb = "0";  // GiB, "auto", or 0 = no FP4 tier
  int64_t pool_slots = 0;
  std::string store = "ram";
  int64_t promote_per_step = 8;
  double decay = 0.99;
  double tau = 0.0;
  std::string signal = "maxprob";
  int64_t rounds = 1;
  int64_t budget = 64;
  std::string tau_file;

  void add_to(CLI::App& sub);
  // Sets options.fp4_tier when the tier is on (checks the flags against each other and against
  // the expert storage options already resolved); max_step_rows as ExpertOptions::resolve takes it.
  void resolve(ModelLoadOptions& options, int64_t max_step_rows, bool cache_auto, int64_t kpi_every) const;
};

}  // namespace moet::cli
