// Shared model-loading flags (see model_options.h).
#include "cli/model_options.h"

#include "backend/cpu/cpu_backend.h"

namespace moet::cli {

void ModelOptions::add_to(CLI::App& sub) {
  sub.add_option("--model", model_dir, "model folder: config.json + *.safetensors (+ tokenizer files)")
      ->required();
  sub.add_option("--threads", threads, "CPU threads for compute (0 = one per core)")
      ->envname("MOET_THREADS")
      ->check(CLI::NonNegativeNumber);
}

LoadedModel load_model(const ModelOptions& options) {
  LoadedModel loaded;
  loaded.checkpoint = std::make_unique<Checkpoint>(Checkpoint::open(options.model_dir));
  loaded.backend = cpu_backend_create(options.threads);
  loaded.model = model_load(*loaded.checkpoint, *loaded.backend);
  return loaded;
}

}  // namespace moet::cli
