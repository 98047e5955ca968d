// Flags shared by the subcommands that load a model (--model, --threads) and the code that
// opens the checkpoint and builds the backend from them.
#pragma once

#include "backend/backend.h"
#include "io/checkpoint.h"
#include "models/model.h"

#include <CLI/CLI.hpp>

#include <memory>
#include <string>

namespace moet::cli {

struct ModelOptions {
  std::string model_dir;
  int threads = 0;

  void add_to(CLI::App& sub);
};

struct LoadedModel {
  std::unique_ptr<Checkpoint> checkpoint;
  std::unique_ptr<Backend> backend;
  std::unique_ptr<Model> model;
};

LoadedModel load_model(const ModelOptions& options);

}  // namespace moet::cli
