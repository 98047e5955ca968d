// Shared device and model-loading flags (see model_options.h).
#include "cli/model_options.h"

#include "backend/cpu/cpu_backend.h"
#include "core/error.h"
#ifdef MOET_HAVE_CUDA
#include "backend/cuda/cuda_backend.h"
#endif

namespace moet::cli {

void DeviceOptions::add_to(CLI::App& sub) {
  sub.add_option("--device", device, "where to compute: cpu or cuda")
      ->envname("MOET_DEVICE")
      ->check(CLI::IsMember({"cpu", "cuda"}));
  sub.add_option("--threads", threads, "CPU threads for compute (0 = one per core)")
      ->envname("MOET_THREADS")
      ->check(CLI::NonNegativeNumber);
  sub.add_option("--gpu-memory-utilization", gpu_memory_utilization,
                 "cuda: fraction of the GPU's memory moet may take")
      ->envname("MOET_GPU_MEMORY_UTILIZATION")
      ->check(CLI::Range(0.01, 1.0));
  sub.add_option("--gpu-memory-limit", gpu_memory_limit_gib,
                 "cuda: at most this many GiB of GPU memory (0 = use --gpu-memory-utilization); lets a "
                 "large card stand in for a smaller one")
      ->envname("MOET_GPU_MEMORY_LIMIT")
      ->check(CLI::NonNegativeNumber);
  sub.add_option("--cuda-graphs", cuda_graphs,
                 "cuda: on = each decode step shape (batch size, context bucket) is captured in a CUDA graph the "
                 "first time and replayed after, one launch per step instead of one per op (same results); "
                 "off = every op launched one by one (eager), for debugging and comparison")
      ->envname("MOET_CUDA_GRAPHS")
      ->check(CLI::IsMember({"on", "off"}));
}

std::unique_ptr<Backend> backend_create(const DeviceOptions& options) {
  if (options.device == "cpu") return cpu_backend_create(options.threads);
#ifdef MOET_HAVE_CUDA
  return cuda_backend_create(
      {0, options.gpu_memory_utilization, options.gpu_memory_limit_gib, options.cuda_graphs == "on"});
#else
  fail("--device {}: this moet was built without CUDA (nvcc was not found at configure time)", options.device);
#endif
}

void ModelOptions::add_to(CLI::App& sub) {
  sub.add_option("--model", model_dir, "model folder: config.json + *.safetensors (+ tokenizer files)")
      ->required();
  device.add_to(sub);
  experts.add_to(sub);
}

LoadedModel load_model(const ModelOptions& options) {
  LoadedModel loaded;
  loaded.checkpoint = std::make_unique<Checkpoint>(Checkpoint::open(options.model_dir));
  loaded.backend = backend_create(options.device);
  loaded.model = model_load(*loaded.checkpoint, *loaded.backend, nullptr, options.experts.resolve());
  return loaded;
}

}  // namespace moet::cli
