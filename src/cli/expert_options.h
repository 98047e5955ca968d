// The flags that say how routed experts are stored (--experts native|w2|fp4, --zero-mode,
// --pack-dir), shared by every subcommand that loads a model.
#pragma once

#include "experts/expert_loader.h"

#include <CLI/CLI.hpp>

#include <string>

namespace moet::cli {

struct ExpertOptions {
  std::string experts = "w2";
  std::string zero_mode = "auto";
  std::string pack_dir;

  void add_to(CLI::App& sub);
  ModelLoadOptions resolve() const;
};

}  // namespace moet::cli
