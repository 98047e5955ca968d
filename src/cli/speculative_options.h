// --speculative-config (vLLM's flag and JSON syntax) for serve, generate and bench: parsed into a
// SpeculativeConfig (engine/speculative.h); method mtp also has the loader load the checkpoint's
// MTP layer.
#pragma once

#include "engine/speculative.h"

#include <CLI/CLI.hpp>

#include <string>

namespace moet::cli {

struct SpeculativeOptions {
  std::string json;

  void add_to(CLI::App& sub);
  // The parsed configuration (none without the flag); throws moet::Error for a bad one.
  SpeculativeConfig resolve() const;
};

}  // namespace moet::cli
