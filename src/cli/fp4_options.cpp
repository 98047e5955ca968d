// FP4 tier and confidence gate flags (see fp4_options.h).
#include "cli/fp4_options.h"

#include "cli/expert_options.h"
#include "core/error.h"

namespace moet::cli {

void Fp4Options::add_to(CLI::App& sub) {
  sub.add_option("--fp4-pool-gb", pool_gb,
                 "keep this many GiB of routed experts also at FP4 (MXFP4, the checkpoint's own bytes for MXFP4 "
                 "checkpoints) beside the W2 experts: the hottest ones, and those the confidence gate promotes; "
                 "auto = what the memory budget leaves after the experts, the KV cache and 4 GiB for activations; "
                 "0 = no FP4 tier (default)")
      ->envname("MOET_FP4_POOL_GB");
  sub.add_option("--fp4-pool-slots", pool_slots, "the FP4 tier as a number of experts instead of GiB (tests)")
      ->check(CLI::NonNegativeNumber);
  sub.add_option("--fp4-store", store,
                 "where the FP4 tier's rows live on the host: ram (all in pinned memory, the default) or pack (read "
                 "from experts-fp4-*.pack in --pack-dir when promoted)")
      ->check(CLI::IsMember({"ram", "pack"}));
  sub.add_option("--fp4-promote-per-step", promote_per_step,
                 "experts the FP4 tier's manager may promote before each step (the hottest by decayed use count; "
                 "0 = only the gate promotes)")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  sub.add_option("--fp4-decay", decay, "the FP4 manager's use counts are multiplied by this before every step")
      ->capture_default_str();
  sub.add_option("--gate-tau", tau,
                 "confidence gate: a step whose least sure sampled row has a confidence <= tau runs again with its "
                 "experts promoted to FP4 (0 = off; changeable while serving: POST /admin/gate, --gate-tau-file)")
      ->envname("MOET_GATE_TAU");
  sub.add_option("--gate-signal", signal,
                 "the gate's confidence: maxprob (largest softmax probability) or margin (it minus the second)")
      ->check(CLI::IsMember({"maxprob", "margin"}));
  sub.add_option("--gate-rounds", rounds, "times one step may run again for the gate")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  sub.add_option("--gate-budget", budget, "experts the gate may promote to FP4 per gated step")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  sub.add_option("--gate-tau-file", tau_file,
                 "a file holding tau (a number in [0, 1]); re-read when it changes, overriding --gate-tau");
}

void Fp4Options::resolve(ModelLoadOptions& options, int64_t max_step_rows, bool cache_auto, int64_t kpi_every) const {
  const uint64_t pool_bytes = gib_or_auto("--fp4-pool-gb", pool_gb);
  const bool on = pool_slots > 0 || pool_gb == "auto" || pool_bytes > 0;
  gate_tau_check(tau, "--gate-tau");
  const bool gate_flags = tau > 0.0 || !tau_file.empty() || signal != "maxprob" || rounds != 1 || budget != 64;
  MOET_CHECK(on || !gate_flags, "the confidence gate promotes experts to the FP4 tier: give --fp4-pool-gb or "
                                "--fp4-pool-slots");
  MOET_CHECK(on || (store == "ram" && promote_per_step == 8 && decay == 0.99),
             "--fp4-store, --fp4-promote-per-step and --fp4-decay are for the FP4 tier (--fp4-pool-gb)");
  if (!on) return;
  MOET_CHECK(options.experts == ExpertMode::w2, "the FP4 tier sits over W2 experts: not with --experts {}",
             expert_mode_name(options.experts));
  MOET_CHECK(!(cache_auto && pool_slots == 0 && pool_gb == "auto"),
             "--expert-cache-gb auto and --fp4-pool-gb auto would both take what memory is left: size one of them");
  MOET_CHECK(store == "ram" || !options.pack_dir.empty(), "--fp4-store pack reads experts-fp4-*.pack: give --pack-dir");
  MOET_CHECK(decay > 0.0 && decay <= 1.0, "--fp4-decay must be in (0, 1] (got {})", decay);
  Fp4TierConfig c;
  c.tier.slots = pool_slots;
  c.tier.pool_bytes = pool_slots > 0 ? 0 : pool_bytes;
  c.tier.promote_per_step = promote_per_step;
  c.tier.decay = decay;
  c.tier.max_step_rows = max_step_rows;
  c.tier.kpi_every = kpi_every;
  c.store.kind = expert_store_parse(store);
  c.gate = {tau, gate_signal_parse(signal), rounds, budget, tau_file};
  options.fp4_tier = c;
}

}  // namespace moet::cli
