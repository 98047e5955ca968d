// The flags that say how routed experts are stored (--experts native|w2|w2k|fp4, --zero-mode,
// the quantizer flags of quantizer_options.h, --pack-dir) and whether the backend holds them all or is a cache over a host store (tiered
// residency: --expert-cache-gb / --expert-cache-slots, --expert-store and its knobs, the miss
// protocol's --miss-tolerance / --max-replays / --expert-eviction, --kpi-every; past the cache:
// --expert-tiering, --cpu-experts and its --cpu-expert-threads / --expert-promote-per-step,
// --expert-prefetch), shared by every subcommand that loads a model; the FP4 tier's and the gate's
// flags are in fp4_options.h.
#pragma once

#include "cli/fp4_options.h"
#include "cli/quantizer_options.h"
#include "experts/expert_loader.h"

#include <CLI/CLI.hpp>

#include <memory>
#include <string>

namespace moet::cli {

struct ExpertOptions {
  std::string experts = "w2";
  std::string zero_mode = "auto";
  QuantizerFlags quantizer;
  std::string pack_dir;
  std::string cache_gb = "0";  // GiB, "auto", or 0 = every expert resident
  int64_t cache_slots = 0;
  std::string store = "ram";
  int store_threads = 8;
  bool direct_io = false;
  std::string ram_gb = "auto";
  bool no_preheat = false;
  int64_t miss_tolerance = 0;
  int64_t max_replays = 4;
  std::string eviction = "lru";
  int64_t kpi_every = 500;
  std::string tiering = "inclusive";
  std::string cpu_experts = "off";
  int cpu_expert_threads = 0;
  int64_t promote_per_step = 4;
  std::string prefetch = "off";
  Fp4Options fp4;

  void add_to(CLI::App& sub);
  // max_step_rows: the most decode rows one step of this command can have (the engine's
  // max_num_seqs; the bench's batch): the expert cache must hold one such step's largest layer.
  // Reads and checks the quantizers' files (a file of another model is refused when the model loads).
  ModelLoadOptions resolve(int64_t max_step_rows = 1) const;
};

// "auto" -> 0 (the caller's automatic size), else a non-negative number of GiB in bytes; a bad
// value is an error naming `flag`.
uint64_t gib_or_auto(const std::string& flag, const std::string& value);

}  // namespace moet::cli
