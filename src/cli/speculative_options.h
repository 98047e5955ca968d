// --speculative-config (vLLM's flag and JSON syntax) for serve, generate and bench: parsed into a
// SpeculativeConfig (engine/speculative.h); method mtp also has the loader load the checkpoint's
// MTP layer. This is the one place that refuses speculative decoding on --device cuda until its
// CUDA path (verify steps of k + 1 rows per sequence, draft steps) has run on a GPU
// (docs/speculative.md, "CUDA").
#pragma once

#include "cli/model_options.h"
#include "engine/speculative.h"

#include <CLI/CLI.hpp>

#include <string>

namespace moet::cli {

struct SpeculativeOptions {
  std::string json;

  void add_to(CLI::App& sub);
  // The parsed configuration (none without the flag); throws moet::Error for a bad one or for
  // --device cuda.
  SpeculativeConfig resolve(const DeviceOptions& device) const;
};

}  // namespace moet::cli
